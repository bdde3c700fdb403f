"""Samples per shard, which the epoch plan needs to split ranks exactly.

Sources, first that answers:

1. ``samples_per_shard=`` given to the stream (one number for all shards, or a list);
2. the ``classes.json`` that ``asyncstream pack`` writes beside its shards (it lists every
   shard's sample count; shards are matched by file name, so a copied dataset still
   matches);
3. counting: every shard without a count is read once, front to back, and its samples
   counted (correct, but a full pass over those shards).
"""

from __future__ import annotations

import contextlib
import json
import posixpath
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ._exceptions import AsyncStreamError, DataError, NotFoundError
from ._s3 import S3Options, fetch_error_from, sync_client
from ._tar import check_not_empty, count_samples
from ._urls import Shard

__all__ = ["MANIFEST_NAME", "count_shard", "sample_counts"]

MANIFEST_NAME = "classes.json"


def _folder(url: str) -> str:
    return posixpath.dirname(url)


def _read_manifest(folder: str, client: Any) -> dict[str, int]:
    """``{shard file name: samples}`` from ``folder/classes.json``, or ``{}`` if absent."""
    url = f"{folder}/{MANIFEST_NAME}"
    try:
        if url.startswith("file://"):
            with open(Shard(url, 0).path, "rb") as f:
                raw = f.read()
        else:
            bucket, _, key = url[len("s3://") :].partition("/")
            raw = client.get_object(Bucket=bucket, Key=key)["Body"].read()
    except FileNotFoundError:
        return {}
    except Exception as exc:
        error = fetch_error_from(exc, url)
        if isinstance(error, NotFoundError):
            return {}
        raise error from exc
    try:
        entries = json.loads(raw)["shards"]
        return {posixpath.basename(e["url"]): int(e["samples"]) for e in entries}
    except (ValueError, KeyError, TypeError) as exc:
        raise DataError(f"{url}: not a manifest written by asyncstream pack: {exc}") from exc


def count_shard(shard: Shard, client: Any) -> int:
    """Count a shard's samples by reading it front to back.

    Raises:
        CorruptTarError: the shard is not a well-formed tar.
        FetchError: the shard could not be read (a failure while reading its body too:
            a connection cut or stalled mid-body is a :class:`TransientFetchError`).
    """
    if shard.is_local:
        with shard.path.open("rb") as f:
            return count_samples(f, shard.url, shard.size)
    try:
        body = client.get_object(Bucket=shard.bucket, Key=shard.key)["Body"]
        with contextlib.closing(body):
            return count_samples(body, shard.url, shard.size)
    except AsyncStreamError:
        raise
    except Exception as exc:
        raise fetch_error_from(exc, shard.url) from exc


def sample_counts(
    shards: Sequence[Shard],
    given: int | Sequence[int] | None,
    options: S3Options,
) -> list[int]:
    """Samples in each shard (see the module docstring for where they come from).

    Raises:
        ValueError: ``given`` does not fit the shards, or counts no sample at all.
        CorruptTarError: a shard is an empty (0-byte) object, whatever ``given`` says.
        DataError: the shards hold no sample at all (empty archives): an epoch would end
            at once, silently.
        FetchError, DataError: a manifest or shard could not be read.
    """
    for shard in shards:
        check_not_empty(shard.url, shard.size)
    if isinstance(given, int):
        if given < 1:
            raise ValueError(f"samples_per_shard must be >= 1, got {given}")
        return [given] * len(shards)
    if given is not None:
        counts = list(given)
        if len(counts) != len(shards) or any(c < 0 for c in counts):
            raise ValueError(
                f"samples_per_shard needs one count >= 0 per shard: {len(shards)} shards, "
                f"{len(counts)} counts"
            )
        if shards and not any(counts):
            raise ValueError(f"samples_per_shard counts no sample in {len(shards)} shards")
        return counts
    client = sync_client(options) if any(not s.is_local for s in shards) else None
    known: dict[str, int] = {}
    for folder in dict.fromkeys(_folder(s.url) for s in shards):
        manifest = _read_manifest(folder, client)
        known.update({f"{folder}/{name}": n for name, n in manifest.items()})
    missing = [s for s in shards if s.url not in known]
    if missing:
        with ThreadPoolExecutor(8) as pool:
            for shard, n in zip(
                missing, pool.map(lambda s: count_shard(s, client), missing), strict=True
            ):
                known[shard.url] = n
    counts = [known[s.url] for s in shards]
    if shards and not any(counts):
        named = ", ".join(s.url for s in shards[:3]) + (", ..." if len(shards) > 3 else "")
        raise DataError(f"{named}: no sample in any of these {len(shards)} shards")
    return counts
