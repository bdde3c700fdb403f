"""The one exception tree of asyncstream.

Everything the library raises on purpose derives from :class:`AsyncStreamError`;
argument mistakes are additionally ``ValueError`` / ``TypeError`` so that plain
``except ValueError`` keeps working::

    AsyncStreamError
    ├── ShardURLError (ValueError)       a URL that cannot be parsed or expands to nothing
    ├── FetchError                       reading a shard from storage failed
    │   ├── TransientFetchError          retryable cause; raised once retries are exhausted
    │   └── PermanentFetchError          not retryable (400, 403, 404, ...)
    │       ├── AccessDeniedError        403, bad or missing credentials
    │       └── NotFoundError            404: NoSuchBucket, NoSuchKey, empty prefix
    ├── DataError                        the bytes arrived but are not what they claim
    │   ├── CorruptTarError              a tar header that does not parse
    │   └── DecodeError                  an image that does not decode (in the loader, or
    │                                        one that ``pack(on_error="fail")`` refuses)
    ├── EngineError                      the fetch engine died or stopped answering
    └── StateError (ValueError)          a state_dict that does not fit this stream

    UserWarning
    ├── MemberOrderWarning               a shard whose samples' members are apart (a tar
    │                                    of a folder in directory order): most samples
    │                                    lack members
    ├── StaleShardWarning                a shard under a prefix that the dataset's index
    │                                    does not list: left out, not read
    ├── UnreadShardWarning               a tar archive under a prefix in a format that is
    │                                    not read (``.tar.lz4``, ...): left out
    ├── TruncatedShardWarning            a shard without its end-of-archive marker, read
    │                                    under ``on_truncated="warn"``: its last sample
    │                                    dropped
    ├── UnreadIndexWarning               a manifest beside the shards that the server
    │                                    refuses (403): not used, the shards counted
    └── SkippedImageWarning              images that ``pack`` left out because they do not
                                         decode (``on_error="skip"``)

An index that disagrees with the shards (a shard it lists is missing, a size or ETag that
differs, a count that cannot fit the shard) is a :class:`DataError` naming both.

Third-party errors (botocore, aiohttp, OSError) are mapped once, at the edge, and chained
with ``raise ... from exc`` so the original traceback is kept.

Secrets never reach a message: every error and warning above, and every record of the
``asyncstream`` logger, has the URLs in its text redacted (:func:`redact`): the values of
query parameters that sign or authorise a request (presigned S3 and GCS URLs, Azure SAS
tokens, ``token=``, ``key=``) and the password of a ``user:password@`` become ``***``.
The ``url`` attribute of an error keeps the URL as the user gave it.
"""

from __future__ import annotations

import logging
import re
from typing import Any

__all__ = [
    "AccessDeniedError",
    "AsyncStreamError",
    "CorruptTarError",
    "DataError",
    "DecodeError",
    "EngineError",
    "FetchError",
    "MemberOrderWarning",
    "NotFoundError",
    "PermanentFetchError",
    "ShardURLError",
    "SkippedImageWarning",
    "StaleShardWarning",
    "StateError",
    "TransientFetchError",
    "TruncatedShardWarning",
    "UnreadIndexWarning",
    "UnreadShardWarning",
    "redact",
    "redact_url",
]

# Query parameters whose values sign or authorise a request: presigned S3 (SigV4 and the
# older SigV2), presigned GCS (V4, and V2's Signature/GoogleAccessId), Azure SAS fields
# (``sig`` is the secret; the others say what it grants and are masked as well), and
# the generic names a web server's signed links use.
_SECRET_PARAMS = (
    "x-amz-signature|x-amz-credential|x-amz-security-token|awsaccesskeyid|signature"
    "|x-goog-signature|x-goog-credential|googleaccessid"
    "|sig|se|sp|sv|sr|st|spr|srt|ss|skoid|sktid|skt|ske|sks|skv|sdd|sip"
    "|token|access_token|api_key|apikey|key|password|secret|auth|code"
)
_SECRET_QUERY = re.compile(rf"(?i)(?<=[?&;])({_SECRET_PARAMS})=[^&#\s'\"<>]*")
_USERINFO = re.compile(r"(?<=://)([^/@\s'\":]*):[^/@\s'\"]*@")
_MASK = "***"


def redact(text: str) -> str:
    """``text`` with the secrets of the URLs in it masked: the values of query parameters
    that sign or authorise a request (``X-Amz-Signature``, ``X-Amz-Credential``,
    ``X-Amz-Security-Token``, ``X-Goog-Signature``, an Azure SAS's ``sig``, ``se``,
    ``sp``, ``sv``..., ``token``, ``key``, ...) and the password of ``user:password@``.
    The one redaction of every message, warning and log line asyncstream writes.

    >>> redact("s3 failed: https://b.s3.amazonaws.com/k?X-Amz-Signature=abc&versionId=1")
    's3 failed: https://b.s3.amazonaws.com/k?X-Amz-Signature=***&versionId=1'
    """
    if "=" in text:
        text = _SECRET_QUERY.sub(lambda m: f"{m.group(1)}={_MASK}", text)
    if "@" in text:
        text = _USERINFO.sub(lambda m: f"{m.group(1)}:{_MASK}@", text)
    return text


def redact_url(url: str) -> str:
    """One URL with its secrets masked (:func:`redact`): what may be shown of it."""
    return redact(url)


class _RedactedLog(logging.Filter):
    """Redacts the URLs of every record logged on the ``asyncstream`` logger."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        cleaned = redact(message)
        if cleaned != message:
            record.msg, record.args = cleaned, None
        return True


logging.getLogger("asyncstream").addFilter(_RedactedLog())


class AsyncStreamError(Exception):
    """Base class of every error asyncstream raises on purpose (its message redacted:
    :func:`redact`)."""

    def __init__(self, *args: object) -> None:
        super().__init__(*(redact(a) if isinstance(a, str) else a for a in args))


class ShardURLError(AsyncStreamError, ValueError):
    """A shard URL is malformed, or a pattern or prefix expands to no shard."""


class FetchError(AsyncStreamError):
    """Reading from object storage failed.

    Attributes:
        url: the shard (``s3://bucket/key``) or prefix the request was for.
    """

    def __init__(self, message: str, *, url: str) -> None:
        super().__init__(message)
        self.url = url

    def __reduce__(self) -> tuple[Any, ...]:
        # Keyword-only fields survive pickling (the engine sends errors across processes).
        return (_rebuild, (type(self), self.args, self.__dict__))


class TransientFetchError(FetchError):
    """A retryable failure (throttling, 5xx, reset, stall) that outlasted the retry policy."""


class PermanentFetchError(FetchError):
    """A failure that retrying cannot fix (400, 403, 404, ...)."""


class AccessDeniedError(PermanentFetchError):
    """403: the credentials are wrong, missing or lack permission."""


class NotFoundError(PermanentFetchError):
    """404: the bucket or key does not exist, or a prefix holds no shard."""


class DataError(AsyncStreamError):
    """The bytes arrived but are not what they claim to be."""


class CorruptTarError(DataError):
    """A tar header does not parse.

    Attributes:
        url: the shard.
        offset: byte offset of the bad header within the shard.
    """

    def __init__(self, message: str, *, url: str, offset: int) -> None:
        super().__init__(message)
        self.url = url
        self.offset = offset

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), self.args, self.__dict__))


class DecodeError(DataError):
    """An image does not decode."""


class EngineError(AsyncStreamError):
    """The fetch engine died, or stopped answering within its timeout."""


class StateError(AsyncStreamError, ValueError):
    """A ``state_dict`` that does not belong to this stream or is corrupted."""


class _RedactedWarning(UserWarning):
    """A warning whose message is redacted (:func:`redact`)."""

    def __init__(self, *args: object) -> None:
        super().__init__(*(redact(a) if isinstance(a, str) else a for a in args))


class MemberOrderWarning(_RedactedWarning):
    """A shard whose samples' members are not adjacent: most samples lack members.

    A sample is a run of adjacent tar members sharing a key (webdataset's rule). A tar of
    a folder written in directory order (``tar czf s.tar.gz -C dir .``) puts the members
    of one key apart, so the shard reads as more samples than it holds, most with fewer
    members than their key has. Warned once per folder of shards, naming a shard and a
    key; the fix is to write the tar sorted (``tar --sort=name``, GNU tar) or with
    ``asyncstream pack``.
    """


class StaleShardWarning(_RedactedWarning):
    """A shard under a prefix that the index beside it does not list.

    The index (``asyncstream.json`` or another tool's) is the truth about which shards
    make the dataset: a shard it does not list is left out of every epoch, and named in
    this warning (``strict=True`` makes it a :class:`DataError`). Shards left behind by
    an earlier, larger pack into the same place are the usual cause;
    ``asyncstream pack --overwrite`` removes them.
    """


class TruncatedShardWarning(_RedactedWarning):
    """A shard ends without its end-of-archive marker: it was cut short.

    Every tar writer ends an archive with two zero blocks; a shard without them lost its
    end (a failed upload, a copy cut short), and its last sample may lack members. By
    default that is a :class:`CorruptTarError` naming the shard and the byte it ends at;
    under ``on_truncated="warn"`` the shard's samples are read, this warning names it, and
    its last sample, which may be partial, is dropped (never handed out).
    """


class UnreadShardWarning(_RedactedWarning):
    """A prefix or folder holds tar archives in a format asyncstream does not read.

    Shards are recognised by name: ``.tar``, and compressed ``.tar.gz`` / ``.tgz``,
    ``.tar.zst``, ``.tar.xz`` and ``.tar.bz2`` (and their short forms). A listing that
    finds ``.tar.lz4``, ``.tar.lz``, ``.tar.lzma``, ``.tar.Z`` or ``.tar.br`` leaves them
    out of the dataset and names them in this warning, rather than drop them silently.
    """


class UnreadIndexWarning(_RedactedWarning):
    """A manifest (``asyncstream.json``) beside the shards exists but its server refuses
    to serve it (``403``).

    Its counts are not used: the shards are counted (or their cached counts taken)
    instead. The usual cause is a manifest that an older ``asyncstream pack`` wrote with
    mode ``0600`` behind a web server that runs as another user: make it readable
    (``chmod 644``). A server that answers ``403`` for a file it does not have (S3 static
    website hosting without the list permission) does not give it: a file of a name
    nobody uses is asked for beside the manifest, and answers ``403`` too. Nor does a
    list of presigned shard URLs (their signatures do not cover the files beside them).
    """


class SkippedImageWarning(_RedactedWarning):
    """``pack`` left out source images that do not decode (``on_error="skip"``).

    The message names each file (relative to the source folder) and why it was left out;
    :attr:`asyncstream.PackResult.skipped` lists them all. ``on_error="fail"`` (``asyncstream
    pack --on-error fail``) refuses the pack instead, with a :class:`DecodeError`.
    """


def _rebuild(cls: type[BaseException], args: tuple[Any, ...], state: dict[str, Any]) -> Any:
    error = cls.__new__(cls)
    error.args = args
    error.__dict__.update(state)
    return error
