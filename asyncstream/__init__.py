"""asyncstream: stream webdataset-style tar shards from S3 into training.

The public API is what this module exports; every other module is private.
Every name but the exceptions is loaded on first use: :class:`ShardStream` (and
:class:`ShardLoader`, :class:`MappedStream`, :func:`decode_image`) import PyTorch, which
the fetch engine's process, importing this package too, has no use for; the others
import botocore, numpy or moto, which ``asyncstream --version`` has no use for.
"""

from typing import TYPE_CHECKING

from ._exceptions import (
    AccessDeniedError,
    AsyncStreamError,
    CorruptTarError,
    DataError,
    DecodeError,
    EngineError,
    FetchError,
    MemberOrderWarning,
    NotFoundError,
    PermanentFetchError,
    ShardURLError,
    SkippedImageWarning,
    StaleShardWarning,
    StateError,
    TransientFetchError,
    TruncatedShardWarning,
    UnreadIndexWarning,
    UnreadShardWarning,
)
from ._lazy import lazy_names

if TYPE_CHECKING:
    from ._config import CacheConfig, FetchConfig, IndexConfig, OrderConfig
    from .dataset._count import CountProgress
    from .dataset._resolve import resolve_shards
    from .dataset._sources import Source
    from .metrics._epochlog import EpochFigures, EpochLog
    from .metrics._lightning import StallLogger
    from .metrics._otel import OpenTelemetryExport, export_opentelemetry
    from .metrics._prometheus import PrometheusExport, export_prometheus
    from .order._mixquality import MixingQuality, mixing_quality
    from .order._shuffle import ShuffleQuality, shuffle_quality
    from .packing._indexer import IndexResult, index_dataset
    from .packing._pack import PackedShard, PackResult, SkippedImage, pack
    from .shards._urls import Shard, expand_braces
    from .stores._registry import configure_store, register_store
    from .stores._retry import RetryPolicy, Timeouts
    from .stores._s3 import S3Credentials, S3Options
    from .stream._checkpoint import StateSnapshot
    from .stream._iteration import SampleViews
    from .stream._loader import ShardLoader
    from .stream._mapped import MappedStream, decode_image
    from .stream._stall import StallMeter
    from .stream._stream import ShardStream
    from .testing import LocalS3

__version__ = "0.1.0"

__all__ = [
    "AccessDeniedError",
    "AsyncStreamError",
    "CacheConfig",
    "CorruptTarError",
    "CountProgress",
    "DataError",
    "DecodeError",
    "EngineError",
    "EpochFigures",
    "EpochLog",
    "FetchConfig",
    "FetchError",
    "IndexConfig",
    "IndexResult",
    "LocalS3",
    "MappedStream",
    "MemberOrderWarning",
    "MixingQuality",
    "NotFoundError",
    "OpenTelemetryExport",
    "OrderConfig",
    "PackResult",
    "PackedShard",
    "PermanentFetchError",
    "PrometheusExport",
    "RetryPolicy",
    "S3Credentials",
    "S3Options",
    "SampleViews",
    "Shard",
    "ShardLoader",
    "ShardStream",
    "ShardURLError",
    "ShuffleQuality",
    "SkippedImage",
    "SkippedImageWarning",
    "Source",
    "StaleShardWarning",
    "StallLogger",
    "StallMeter",
    "StateError",
    "StateSnapshot",
    "Timeouts",
    "TransientFetchError",
    "TruncatedShardWarning",
    "UnreadIndexWarning",
    "UnreadShardWarning",
    "__version__",
    "configure_store",
    "decode_image",
    "expand_braces",
    "export_opentelemetry",
    "export_prometheus",
    "index_dataset",
    "mixing_quality",
    "pack",
    "register_store",
    "resolve_shards",
    "shuffle_quality",
]


# Where each name lives: loaded on first use (see the module docstring).
_LAZY = {
    "CacheConfig": "_config",
    "FetchConfig": "_config",
    "IndexConfig": "_config",
    "OrderConfig": "_config",
    "IndexResult": "packing._indexer",
    "index_dataset": "packing._indexer",
    "ShardLoader": "stream._loader",
    "MappedStream": "stream._mapped",
    "decode_image": "stream._mapped",
    "MixingQuality": "order._mixquality",
    "mixing_quality": "order._mixquality",
    "PackedShard": "packing._pack",
    "PackResult": "packing._pack",
    "SkippedImage": "packing._pack",
    "pack": "packing._pack",
    "resolve_shards": "dataset._resolve",
    "CountProgress": "dataset._count",
    "configure_store": "stores._registry",
    "register_store": "stores._registry",
    "RetryPolicy": "stores._retry",
    "Timeouts": "stores._retry",
    "S3Credentials": "stores._s3",
    "S3Options": "stores._s3",
    "ShuffleQuality": "order._shuffle",
    "shuffle_quality": "order._shuffle",
    "Source": "dataset._sources",
    "SampleViews": "stream._iteration",
    "StallMeter": "stream._stall",
    "EpochFigures": "metrics._epochlog",
    "EpochLog": "metrics._epochlog",
    "StallLogger": "metrics._lightning",
    "StateSnapshot": "stream._checkpoint",
    "ShardStream": "stream._stream",
    "Shard": "shards._urls",
    "expand_braces": "shards._urls",
    "LocalS3": "testing",
    "export_prometheus": "metrics._prometheus",
    "PrometheusExport": "metrics._prometheus",
    "export_opentelemetry": "metrics._otel",
    "OpenTelemetryExport": "metrics._otel",
}


__getattr__, __dir__ = lazy_names(__name__, _LAZY, __all__)
