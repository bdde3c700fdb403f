"""Security: secrets stay secret, shared memory is private, shard bytes are only data.

Against the real moto S3 server (one that checks signatures, for wrong credentials) and
the fault-injecting proxy:

* credentials never appear in reprs, error messages, tracebacks, pickled errors crossing
  from the engine process, captured log records or the processes' stderr;
* the stream's shared-memory ring is owner-only (0600) while it lives, and gone after;
* sample bytes come back as the raw bytes of the member: never unpickled or evaluated;
* ``pack`` refuses symbolic link loops (links out of the source: tests/test_pack.py);
* hostile tar headers are a ``CorruptTarError`` naming shard and offset, with memory that
  does not grow with the sizes they declare; path tricks in member names are only keys.

Botocore's own DEBUG log records show the access key id and a session token (in the
canonical request it signs), never the secret key: what is asserted below, level by level.
"""

from __future__ import annotations

import io
import json
import logging
import os
import pickle
import tarfile
import time
import traceback
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _procs import engine_pids, segments

from asyncstream import (
    AccessDeniedError,
    CorruptTarError,
    DataError,
    LocalS3,
    RetryPolicy,
    S3Credentials,
    S3Options,
    ShardStream,
    pack,
)
from asyncstream.shards._tar import ShardReader
from asyncstream.testing import FaultProxy

pytestmark = pytest.mark.timeout(120)

KEY_ID = "AKIAZZSECURITYKEYID7"
SECRET = "s3cr3t-Do-Not-Leak-9f8e7d6c5b4a"
TOKEN = "t0ken-Do-Not-Leak-0a1b2c3d4e5f"
CREDENTIALS = S3Credentials(KEY_ID, SECRET, TOKEN)
SECRETS = {"access key id": KEY_ID[4:], "secret key": SECRET, "session token": TOKEN}


def assert_no_secret(text: str, where: str, allowed: tuple[str, ...] = ()) -> None:
    for what, value in SECRETS.items():
        if what not in allowed:
            assert value not in text, f"the {what} appears in {where}"


def error_texts(error: BaseException) -> dict[str, str]:
    """Every text an error shows: str, repr, the whole chained traceback, pickled again."""
    copy = pickle.loads(pickle.dumps(error))
    return {
        "str": str(error),
        "repr": repr(error),
        "traceback": "".join(traceback.format_exception(error)),
        "unpickled": f"{copy!s} {copy!r} {copy.__dict__!r}",
    }


def tar_of(members: list[tuple[str, bytes]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as archive:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def our_segments(holders: set[int] | None = None) -> set[str]:
    """The rings this process made that a live process (of ``holders``; any) holds, or
    named in /dev/shm."""
    return segments((f"asyncstream-{os.getpid()}-",), holders)


@pytest.fixture(scope="module")
def auth_server(aws_env: dict[str, str]) -> Iterator[LocalS3]:
    """A server that checks signatures against moto's IAM: unknown keys get 403."""
    with LocalS3(mode="process", require_auth=True) as server:
        yield server


@pytest.fixture(scope="module")
def shards(s3_server: LocalS3) -> dict[str, str]:
    """A bucket of good shards; returns name -> URL."""
    client = s3_server.client()
    client.create_bucket(Bucket="security")
    good = tar_of([(f"{i:06d}.{e}", b"%d" % i) for i in range(6) for e in ("jpg", "cls")])
    client.put_object(Bucket="security", Key="good.tar", Body=good)
    return {"good": "s3://security/good.tar"}


# --------------------------------------------------------------------------- credentials


def test_reprs_hide_credentials() -> None:
    options = S3Options(endpoint_url="http://127.0.0.1:9", credentials=CREDENTIALS)
    for name, text in {
        "S3Credentials repr": repr(CREDENTIALS),
        "S3Credentials str": str(CREDENTIALS),
        "S3Options repr": repr(options),
        "S3Options str": str(options),
        "resolved S3Options": repr(options.resolve()),
    }.items():
        assert_no_secret(text, name)


def test_wrong_credentials_are_refused_without_showing_them(
    auth_server: LocalS3, caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    caplog.set_level(logging.DEBUG)
    options = S3Options(endpoint_url=auth_server.endpoint_url, credentials=CREDENTIALS)
    url = "s3://security/good.tar"
    with pytest.raises(AccessDeniedError) as caught:
        ShardStream(url, s3=options)
    assert url in str(caught.value)
    assert "credentials" in str(caught.value)
    for name, text in error_texts(caught.value).items():
        assert_no_secret(text, f"the error's {name}")
    assert caplog.records  # botocore did log at DEBUG: the check below has teeth
    for record in caplog.records:
        allowed = ("access key id", "session token") if record.levelno < logging.INFO else ()
        assert_no_secret(record.getMessage(), f"a {record.levelname} record", allowed)
    out, err = capfd.readouterr()
    assert_no_secret(out + err, "stdout/stderr")


def test_errors_from_the_engine_process_do_not_show_credentials(
    auth_server: LocalS3, capfd: pytest.CaptureFixture[str]
) -> None:
    """The engine signs with wrong credentials; its 403 crosses the process boundary."""
    from asyncstream.engine._engine import Engine, EngineConfig
    from asyncstream.stores._store import ChunkRequest

    options = S3Options(endpoint_url=auth_server.endpoint_url, credentials=CREDENTIALS)
    config = EngineConfig(s3=options.resolve(), retry=RetryPolicy(max_attempts=2, base_delay=0))
    url = "s3://security/good.tar"
    with Engine(config, n_slots=2, slot_bytes=1024) as engine:
        assert_no_secret(repr(engine), "the engine's repr")
        assert_no_secret(repr(config), "the engine config's repr")
        # Explicit credentials reach the engine over its pipe, not by its command line
        # (which any user can read in ps) or its environment.
        assert engine.pid is not None
        for part in ("cmdline", "environ"):
            shown = Path(f"/proc/{engine.pid}/{part}").read_bytes().decode(errors="replace")
            assert_no_secret(shown, f"the engine process's {part}")
        engine.submit([ChunkRequest(url, 0, 100)])
        with pytest.raises(AccessDeniedError) as caught:
            engine.next()
    assert url in str(caught.value)
    texts = error_texts(caught.value)
    assert "Traceback" in texts["traceback"]  # the engine's own traceback came along
    for name, text in texts.items():
        assert_no_secret(text, f"the engine error's {name}")
    out, err = capfd.readouterr()
    assert_no_secret(out + err, "the engine's stdout/stderr")


def test_a_failing_stream_shows_no_credentials_anywhere(
    s3_server: LocalS3,
    shards: dict[str, str],
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
) -> None:
    """Public API: listing works, then every chunk GET is refused (403) mid-run."""
    caplog.set_level(logging.INFO)
    with FaultProxy(s3_server.endpoint_url) as proxy:
        options = S3Options(endpoint_url=proxy.endpoint_url, credentials=CREDENTIALS)
        proxy.inject("status", status=403, count=50, method="GET", match="good.tar")
        with ShardStream(shards["good"], s3=options, samples_per_shard=6) as stream:
            shown = {"stream repr": repr(stream), "state": json.dumps(stream.state_dict())}
            with pytest.raises(AccessDeniedError) as caught:
                next(iter(stream))
            shown["stats"] = repr(stream.stats())
    for name, text in {**shown, **error_texts(caught.value)}.items():
        assert_no_secret(text, name)
    for record in caplog.records:
        assert_no_secret(record.getMessage(), f"a {record.levelname} record")
    out, err = capfd.readouterr()
    assert_no_secret(out + err, "stdout/stderr")


# --------------------------------------------------------------------------- shared memory


def test_the_ring_has_no_name_is_held_by_its_engine_alone_and_gone_after_close(
    s3_server: LocalS3, shards: dict[str, str]
) -> None:
    """Ring.create alone: tests/test_ring.py. Here: the ring a stream makes and shares,
    by descriptor, with its engine process and nobody else; no name to open it by."""
    before, engines = our_segments(), set(engine_pids())  # an earlier test's may linger
    # Its samples given: no count, whose own engine and ring may still be going away here.
    options = s3_server.options()
    with ShardStream(shards["good"], s3=options, chunk_bytes=1024, samples_per_shard=6) as stream:
        it = iter(stream)
        next(it)  # the engine has attached to the ring and written into it
        mine = our_segments() - before
        assert len(mine) == 1
        (engine,) = set(engine_pids()) - engines
        assert our_segments({os.getpid(), engine}) - before == mine
        others = {int(p) for p in os.listdir("/proc") if p.isdigit()} - {os.getpid(), engine}
        assert not our_segments(others) & mine  # no other process holds it
        assert not set(os.listdir("/dev/shm")) & mine  # named nowhere
        assert len(list(it)) == 5
    deadline = time.monotonic() + 10  # the engine process lets go of it as it exits
    while our_segments() & mine and time.monotonic() < deadline:
        time.sleep(0.05)
    assert our_segments() & mine == set()


# --------------------------------------------------------------------------- sample bytes


class _Exploit:
    """Unpickling this runs code that leaves a marker file (pickling it does not)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (exec, (f"open({str(self.marker)!r}, 'w').write('unpickled')",))


def test_sample_bytes_are_never_unpickled_or_evaluated(s3_server: LocalS3, tmp_path: Path) -> None:
    from dali_ops import DALIImageLoader, PipelineSettings

    marker = tmp_path / "marker"
    payload = pickle.dumps(_Exploit(marker))
    expression = f"open({str(marker)!r}, 'w').write('evaluated') and 0".encode()
    fields = {
        "pyd": payload,
        "pickle": payload,
        "pth": payload,
        "npy": payload,
        "json": b'{"__reduce__": "exec"}',
        "cls": expression,
        "jpg": b"\xff\xd8\xff\xe0" + bytes(100) + b"\xff\xd9",
    }
    client = s3_server.client()
    client.create_bucket(Bucket="payloads")
    body = tar_of([(f"000000.{ext}", data) for ext, data in fields.items()])
    client.put_object(Bucket="payloads", Key="p.tar", Body=body)
    url = "s3://payloads/p.tar"
    with ShardStream(url, s3=s3_server.options(), shuffle=False) as stream:
        (sample,) = list(stream)
    for ext, data in fields.items():
        assert type(sample[ext]) is bytes
        assert sample[ext] == data
    # The loader reads the label as an integer, never as an expression: a DataError.
    stream = ShardStream(url, s3=s3_server.options(), shuffle=False)
    settings = PipelineSettings(image_size=16, num_threads=1)
    with (
        DALIImageLoader(stream, 1, device="cpu", on_error="skip", settings=settings) as loader,
        pytest.raises(DataError, match="no integer label"),
    ):
        list(loader)
    assert not marker.exists()


# --------------------------------------------------------------------------- pack


def test_pack_refuses_symbolic_link_loops(tmp_path: Path) -> None:
    """Links out of the source are refused in tests/test_pack.py; loops are refused here.

    Before the fix, ``os.walk(followlinks=True)`` repeated a folder's images once per
    level of a loop (40 levels) and, with two loops, walked for ever.
    """
    src = tmp_path / "src"
    (src / "a").mkdir(parents=True)
    (src / "a" / "img.jpg").write_bytes(b"\xff\xd8\xff\xd9")
    (src / "a" / "again").symlink_to(".")
    (src / "a" / "more").symlink_to("..")
    with pytest.raises(ValueError, match="already packed") as caught:
        pack(src, str(tmp_path / "out"), shard_samples=10, shard_bytes=None)
    assert str(src / "a" / "again") in str(caught.value)
    (src / "a" / "again").unlink()
    with pytest.raises(ValueError, match="already packed") as caught:
        pack(src, str(tmp_path / "out"), shard_samples=10, shard_bytes=None)
    assert str(src / "a" / "more") in str(caught.value)
    (src / "a" / "more").unlink()
    (src / "b").symlink_to("a")  # a second class that is the same folder
    with pytest.raises(ValueError, match="already packed") as caught:
        pack(src, str(tmp_path / "out"), shard_samples=10, shard_bytes=None)
    assert str(src / "b") in str(caught.value)


# --------------------------------------------------------------------------- hostile tars


def _header(name: bytes, size_field: bytes, flag: bytes = b"0") -> bytearray:
    """One ustar header block with any bytes in its size field, and a valid checksum."""
    block = bytearray(512)
    block[0 : len(name)] = name
    block[100:108] = b"0000644\0"
    block[124:136] = size_field
    block[136:148] = b"00000000000\0"
    block[156:157] = flag
    block[257:265] = b"ustar\x0000"
    block[148:156] = b" " * 8
    block[148:156] = b"%06o\0 " % sum(block)
    return block


def _octal(n: int) -> bytes:
    return b"%011o\0" % n


GOOD_MEMBER = bytes(_header(b"000000.jpg", _octal(3))) + b"abc".ljust(512, b"\0")
PAD = bytes(20 * 512)  # room after the bad header, so a size is not refused for the shard's end


def _pax(records: bytes, flag: bytes = b"x") -> bytes:
    size = len(records)
    return bytes(_header(b"PaxHeader", _octal(size), flag)) + records.ljust(-(-size // 512) * 512)


def _record(keyword: bytes, value: bytes) -> bytes:
    """A PAX record, ``"LEN keyword=value\n"``, whose length counts its own digits."""
    body = b" " + keyword + b"=" + value + b"\n"
    n = len(body)
    while len(str(n)) + len(body) != n:
        n = len(str(n)) + len(body)
    return b"%d" % n + body


HUGE = b"\x80" + (10**15).to_bytes(11, "big")  # base-256: 10**15 bytes
MEMBER = bytes(_header(b"x.jpg", _octal(1)))
# name -> (the bytes after the good member, offset of the header the error must name)
HOSTILE: dict[str, tuple[bytes, int]] = {
    "size-10**15-base256": (bytes(_header(b"x.jpg", HUGE)), 1024),
    "size-2**88-base256": (bytes(_header(b"x.jpg", b"\x80" + b"\xff" * 11)), 1024),
    "size-negative-base256": (bytes(_header(b"x.jpg", b"\xff" * 12)), 1024),
    "size-64GiB-octal-no-nul": (bytes(_header(b"x.jpg", b"777777777777")), 1024),
    "size-negative-octal": (bytes(_header(b"x.jpg", b"-0000000001\0")), 1024),
    "size-not-octal": (bytes(_header(b"x.jpg", b"0000000009x\0")), 1024),
    "pax-size-10**15": (_pax(_record(b"size", b"1" + b"0" * 15)) + MEMBER, 2048),
    "pax-size-negative": (_pax(_record(b"size", b"-1")) + MEMBER, 1024),
    "pax-record-length-absurd": (_pax(b"99999999999999999999 path=x\n") + MEMBER, 1024),
    "pax-record-length-short": (_pax(b"5 path=xxxxxxxxxx\n") + MEMBER, 1024),
    "pax-header-size-10**15": (bytes(_header(b"PaxHeader", HUGE, b"x")) + MEMBER, 1024),
    "gnu-long-name-10**15": (bytes(_header(b"././@LongLink", HUGE, b"L")) + MEMBER, 1024),
    "gnu-long-name-2MiB": (bytes(_header(b"././@LongLink", _octal(2 << 20), b"L")), 1024),
    "17-extended-headers": (_pax(_record(b"comment", b"x")) * 17 + MEMBER, 1024),
}


def feed_all(reader: ShardReader, shard: bytes, step: int) -> None:
    for at in range(0, len(shard), step):
        reader.feed(memoryview(shard)[at : at + step], at, final=at + step >= len(shard))


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_header_in_the_reader(name: str) -> None:
    """Every row, fed whole and in small ranges: the error, and memory under 1 MiB."""
    bad, offset = HOSTILE[name]
    shard = GOOD_MEMBER + bad + PAD
    url = f"s3://hostile/{name}.tar"
    for step in (len(shard), 4096, 1000, 512, 100):
        reader = ShardReader(url, len(shard))
        tracemalloc.start()
        try:
            with pytest.raises(CorruptTarError) as caught:
                feed_all(reader, shard, step)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert caught.value.url == url
        assert caught.value.offset == offset
        assert f"{url}: corrupt tar at byte {offset}: " in str(caught.value)
        assert peak < 1 << 20


STREAMED = ["size-10**15-base256", "gnu-long-name-10**15"]  # all rows: in the reader, above


@pytest.fixture(scope="module")
def process_server(aws_env: dict[str, str]) -> Iterator[LocalS3]:
    """A server in its own process (the memory traced here is the stream's alone)."""
    with LocalS3(mode="process") as server:
        client = server.client()
        client.create_bucket(Bucket="hostile")
        for name in STREAMED:
            body = GOOD_MEMBER + HOSTILE[name][0] + PAD
            client.put_object(Bucket="hostile", Key=f"{name}.tar", Body=body)
        yield server


@pytest.mark.parametrize("name", STREAMED)
def test_hostile_header_through_the_stream(name: str, process_server: LocalS3) -> None:
    url, offset = f"s3://hostile/{name}.tar", HOSTILE[name][1]
    options = process_server.options()
    with ShardStream(url, s3=options, samples_per_shard=2, chunk_bytes=4096) as stream:
        it = iter(stream)
        tracemalloc.start()
        try:
            with pytest.raises(CorruptTarError) as caught:
                next(it)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert caught.value.url == url
    assert caught.value.offset == offset
    assert f"{url}: corrupt tar at byte {offset}: " in str(caught.value)
    assert peak < 4 << 20  # whatever size was declared (up to 10**15)
    with pytest.raises(CorruptTarError) as caught:
        ShardStream(url, s3=options)  # counting the samples reads it the same way
    assert caught.value.offset == offset


def test_path_tricks_and_links_are_only_keys(s3_server: LocalS3, tmp_path: Path) -> None:
    """Names with ``..``, absolute paths, links to /etc: keys and skipped entries, no I/O."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as archive:
        for name, data in [
            ("../../../etc/passwd.jpg", b"1"),
            ("/etc/shadow.jpg", b"2"),
            ("a/../../b.jpg", b"3"),
            ("./" * 60 + "c.jpg", b"4"),
        ]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
        for kind in (tarfile.SYMTYPE, tarfile.LNKTYPE):
            info = tarfile.TarInfo("d.jpg")
            info.type, info.linkname = kind, "/etc/passwd"
            archive.addfile(info)
    client = s3_server.client()
    client.create_bucket(Bucket="paths")
    client.put_object(Bucket="paths", Key="p.tar", Body=buf.getvalue())
    cwd = set(os.listdir())
    with ShardStream("s3://paths/p.tar", s3=s3_server.options(), shuffle=False) as stream:
        samples = [(s["__key__"], s.get("jpg")) for s in stream]
    assert samples == [
        ("../../../etc/passwd", b"1"),
        ("/etc/shadow", b"2"),
        ("a/../../b", b"3"),
        ("./" * 60 + "c", b"4"),
    ]  # the links to /etc/passwd are no members: skipped, nothing read
    assert set(os.listdir()) == cwd
