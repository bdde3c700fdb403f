"""asyncstream: stream webdataset-style tar shards from S3 into training.

The public API is what this module exports; every other module is private.
:class:`ShardStream` (and :class:`ShardLoader`, :class:`MappedStream`,
:func:`decode_image`) is loaded on first use, because it imports PyTorch and the fetch
engine's process, which imports this package too, has no use for it; so is
:func:`index_dataset`, which imports the fetch engine's client side.
"""

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
)
from ._mixquality import MixingQuality, mixing_quality
from ._pack import PackedShard, PackResult, SkippedImage, pack
from ._resolve import resolve_shards
from ._retry import RetryPolicy, Timeouts
from ._s3 import S3Credentials, S3Options
from ._shuffle import ShuffleQuality, shuffle_quality
from ._sources import Source
from ._urls import Shard, expand_braces
from .testing import LocalS3

if TYPE_CHECKING:
    from ._indexer import IndexResult, index_dataset
    from ._loader import ShardLoader
    from ._mapped import MappedStream, decode_image
    from ._stream import ShardStream

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
    "StateError",
    "Timeouts",
    "TransientFetchError",
    "__version__",
    "decode_image",
    "expand_braces",
    "index_dataset",
    "mixing_quality",
    "pack",
    "resolve_shards",
    "shuffle_quality",
]


def __getattr__(name: str) -> Any:
    if name == "ShardStream":
        from ._stream import ShardStream

        return ShardStream
    if name == "ShardLoader":
        from ._loader import ShardLoader

        return ShardLoader
    if name in ("MappedStream", "decode_image"):
        from . import _mapped

        return getattr(_mapped, name)
    if name in ("IndexResult", "index_dataset"):
        from . import _indexer

        return getattr(_indexer, name)
    raise AttributeError(f"module 'asyncstream' has no attribute {name!r}")
