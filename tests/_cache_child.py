"""A process that uses a cache folder, for tests/test_cache.py's several-process rows.

Usage::

    python tests/_cache_child.py '<json settings>'

``settings["role"]``:

* ``"read"``: a ``ShardStream`` with ``cache_dir`` reads ``settings["epochs"]``; after
  ``pause_after`` samples of the first epoch it reports ``paused`` and waits for a line
  on stdin. With ``fsize_limit`` its engine process may not write a file larger than
  that many bytes (``RLIMIT_FSIZE``), so every cache write fails as on a full disk.
* ``"write"``: writes the dataset's grid chunks into the cache over and over (through
  :class:`asyncstream.engine._cachedir.CacheDir`, as the store does), each removed again after
  it is written, so that a SIGKILL lands in the middle of a write.

It reports JSON lines on stdout, each with an ``"event"`` key: ``paused``, ``epoch``
(the samples' keys and digests, the cache statistics), ``writing`` and ``done``.
"""

from __future__ import annotations

import hashlib
import json
import os
import resource
import sys
from typing import Any

from _procs import engine_pids

from asyncstream import S3Options, ShardStream, resolve_shards
from asyncstream.engine._cachedir import CacheDir, chunk_key
from asyncstream.stores._store import ChunkRequest


def emit(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


def digest(sample: dict[str, Any]) -> str:
    """The sample's key and every field's bytes, as one digest (tests/test_cache.py's too)."""
    h = hashlib.sha256()
    for name in sorted(sample):
        value = sample[name]
        h.update(name.encode() + b"\0" + (value if isinstance(value, bytes) else value.encode()))
    return h.hexdigest()


def read(settings: dict[str, Any]) -> None:
    with ShardStream(
        settings["url"],
        endpoint_url=settings["endpoint_url"],
        samples_per_shard=settings["counts"],
        cache_dir=settings["cache_dir"],
        cache_limit=settings.get("cache_limit"),
        **settings["stream"],
    ) as stream:
        pause = settings.get("pause_after")
        for epoch in settings["epochs"]:
            stream.set_epoch(epoch)
            samples = []
            it = iter(stream)  # starts the engine; it fetches from the first next()
            if settings.get("fsize_limit"):  # the engine's, not ours: the ring is a file too
                limit = settings["fsize_limit"]
                for pid in engine_pids():
                    resource.prlimit(pid, resource.RLIMIT_FSIZE, (limit, limit))
            for sample in it:
                samples.append(digest(sample))
                if len(samples) == pause:
                    emit("paused")
                    sys.stdin.readline()
            emit("epoch", epoch=epoch, samples=samples, cache=stream.stats()["fetch"]["cache"])
    emit("done")


def write(settings: dict[str, Any]) -> None:
    grid = settings["grid"]
    chunks = []
    for shard in resolve_shards(settings["url"], S3Options(endpoint_url=settings["endpoint_url"])):
        with open(os.path.join(settings["folder"], shard.url.rsplit("/", 1)[1]), "rb") as f:
            data = f.read()
        for offset in range(0, shard.size, grid):
            length = min(grid, shard.size - offset)
            unit = ChunkRequest(shard.url, offset, length, shard.etag, False, shard.size)
            key = chunk_key(unit)
            assert key is not None
            chunks.append((key, memoryview(data)[offset : offset + length]))
    cache = CacheDir(settings["cache_dir"], None)
    cache.open()
    emit("writing", chunks=len(chunks))
    while True:  # until killed
        for key, payload in chunks:
            cache.write(key, payload)
            os.unlink(cache.file(key))


if __name__ == "__main__":
    config = json.loads(sys.argv[1])
    {"read": read, "write": write}[config["role"]](config)
