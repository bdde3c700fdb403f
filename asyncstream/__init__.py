"""asyncstream: stream webdataset-style tar shards from S3 into training.

The public API is what this module exports; every other module is private.
"""

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
    StateError,
    TransientFetchError,
)
from ._local import LocalS3
from ._pack import PackedShard, PackResult, pack
from ._s3 import S3Options
from ._urls import Shard, expand_braces, resolve_shards

__version__ = "0.1.0"

__all__ = [
    "AccessDeniedError",
    "AsyncStreamError",
    "CorruptTarError",
    "DataError",
    "DecodeError",
    "EngineError",
    "FetchError",
    "LocalS3",
    "NotFoundError",
    "PackResult",
    "PackedShard",
    "PermanentFetchError",
    "S3Options",
    "Shard",
    "ShardURLError",
    "StateError",
    "TransientFetchError",
    "__version__",
    "expand_braces",
    "pack",
    "resolve_shards",
]
