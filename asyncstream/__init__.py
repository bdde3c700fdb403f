"""asyncstream: stream webdataset-style tar shards from S3 into training.

The public API is what this module exports; every other module is private.
Every name but the exceptions is loaded on first use: :class:`ShardStream` (and
:class:`ShardLoader`, :class:`MappedStream`, :func:`decode_image`) import PyTorch, which
the fetch engine's process, importing this package too, has no use for; the others
import botocore, numpy or moto, which ``asyncstream --version`` has no use for.
"""

import importlib
from typing import TYPE_CHECKING, Any

from ._exceptions import (
    AccessDeniedError,
    AsyncStreamError,
    CorruptTarError,
    DataError,
    DecodeError,
    EngineError,
    FetchError,
    NotFoundError,
    PermanentFetchError,
    ShardURLError,
    SkippedImageWarning,
    StaleShardWarning,
    StateError,
    TransientFetchError,
    UnreadShardWarning,
)

if TYPE_CHECKING:
    from ._indexer import IndexResult, index_dataset
    from ._loader import ShardLoader
    from ._mapped import MappedStream, decode_image
    from ._mixquality import MixingQuality, mixing_quality
    from ._pack import PackedShard, PackResult, SkippedImage, pack
    from ._resolve import resolve_shards
    from ._retry import RetryPolicy, Timeouts
    from ._s3 import S3Credentials, S3Options
    from ._shuffle import ShuffleQuality, shuffle_quality
    from ._sources import Source
    from ._stall import StallMeter
    from ._stream import ShardStream
    from ._urls import Shard, expand_braces
    from .testing import LocalS3

__version__ = "0.1.0"

__all__ = [
    "AccessDeniedError",
    "AsyncStreamError",
    "CorruptTarError",
    "DataError",
    "DecodeError",
    "EngineError",
    "FetchError",
    "IndexResult",
    "LocalS3",
    "MappedStream",
    "MixingQuality",
    "NotFoundError",
    "PackResult",
    "PackedShard",
    "PermanentFetchError",
    "RetryPolicy",
    "S3Credentials",
    "S3Options",
    "Shard",
    "ShardLoader",
    "ShardStream",
    "ShardURLError",
    "ShuffleQuality",
    "SkippedImage",
    "SkippedImageWarning",
    "Source",
    "StaleShardWarning",
    "StallMeter",
    "StateError",
    "Timeouts",
    "TransientFetchError",
    "UnreadShardWarning",
    "__version__",
    "decode_image",
    "expand_braces",
    "index_dataset",
    "mixing_quality",
    "pack",
    "resolve_shards",
    "shuffle_quality",
]


# Where each name lives: loaded on first use (see the module docstring).
_LAZY = {
    "IndexResult": "_indexer",
    "index_dataset": "_indexer",
    "ShardLoader": "_loader",
    "MappedStream": "_mapped",
    "decode_image": "_mapped",
    "MixingQuality": "_mixquality",
    "mixing_quality": "_mixquality",
    "PackedShard": "_pack",
    "PackResult": "_pack",
    "SkippedImage": "_pack",
    "pack": "_pack",
    "resolve_shards": "_resolve",
    "RetryPolicy": "_retry",
    "Timeouts": "_retry",
    "S3Credentials": "_s3",
    "S3Options": "_s3",
    "ShuffleQuality": "_shuffle",
    "shuffle_quality": "_shuffle",
    "Source": "_sources",
    "StallMeter": "_stall",
    "ShardStream": "_stream",
    "Shard": "_urls",
    "expand_braces": "_urls",
    "LocalS3": "testing",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'asyncstream' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value  # once
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
