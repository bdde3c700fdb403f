"""Fuzzing the tar indexer: only a DataError comes out, and what comes out is consistent.

tests/test_tar.py fuzzes :class:`~asyncstream.shards._tar.ShardReader` with random bytes, random
headers with valid checksums and mutations of a few fixed tars, checking that nothing but
samples or a well-formed ``CorruptTarError`` comes out. This module adds oracles:

* valid tars *generated* by hypothesis (ustar, GNU and PAX; long, nested, dotted and
  non-ASCII names; sizes around block boundaries; directories, links and fifos between
  members) give exactly Python's ``tarfile`` grouping, whatever the split into ranges, and
  a new reader started at :attr:`~asyncstream.shards._tar.ShardReader.pending_offset` after any
  prefix gives exactly the rest;
* for any bytes (random, structured, or a generated tar mutated), the outcome does not
  depend on the split: the same samples with the same bytes and offsets, or the same error
  at the same offset; samples returned before an error lie before it; ``count_samples``
  agrees; and no exception but ``CorruptTarError`` (a ``DataError``) escapes.

Every test is derandomized and database-free, with bounded examples, so CI runs the same
inputs each time.
"""

from __future__ import annotations

import io
import random
import re
import tarfile
from collections.abc import Sequence
from itertools import pairwise
from typing import Any

import pytest
from _wds import wds_member
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from asyncstream._exceptions import CorruptTarError, DataError
from asyncstream.shards._compressed import count_samples
from asyncstream.shards._tar import ShardReader

# A generated tar's members of one key may lie apart: the reader warns once per folder and
# process (tests/test_memberorder.py), so whether an example meets the warning would
# depend on the examples before it; what this module checks is the samples and errors.
pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.filterwarnings("ignore::asyncstream.MemberOrderWarning"),
]

URL = "s3://fuzz/shard-000001.tar"
FUZZ = settings(
    max_examples=200,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

Plain = tuple[str, tuple[tuple[str, bytes], ...], int]
Outcome = tuple[str, Any]  # ("ok", [Plain, ...]) or ("error", (offset, message))


# --------------------------------------------------------------------------- running


def plain(sample: Any) -> Plain:
    return sample.key, tuple((k, bytes(v)) for k, v in sample.fields.items()), sample.offset


def run(data: bytes, cuts: Sequence[int], start: int = 0) -> tuple[list[Plain], Outcome]:
    """Feed ``data[start:]`` split at ``cuts``; return the samples seen and the outcome."""
    reader = ShardReader(URL, len(data), start)
    bounds = [start, *sorted({c for c in cuts if start < c < len(data)}), len(data)]
    seen: list[Plain] = []
    error: CorruptTarError | None = None
    try:
        for a, b in pairwise(bounds):
            seen += [plain(s) for s in reader.feed(memoryview(data)[a:b], a, final=b == len(data))]
    except CorruptTarError as exc:
        error = exc
    if error is None:
        assert reader.done
        return seen, ("ok", seen)
    assert isinstance(error, DataError)
    assert error.url == URL
    assert 0 <= error.offset <= len(data)
    assert error.offset % 512 == 0
    assert str(error).startswith(f"{URL}: corrupt tar at byte {error.offset}: ")
    return seen, ("error", (error.offset, str(error)))


def check_consistent(data: bytes, rng: random.Random) -> Outcome:
    """The oracles that hold for any bytes; returns the outcome."""
    _, whole = run(data, [])
    # What the inputs reach, shown by pytest --hypothesis-show-statistics.
    if whole[0] == "ok":
        event(f"ok, {min(len(whole[1]), 3)}+ samples")
    else:
        why = whole[1][1].split(": ", 2)[2]
        event("error: " + re.split(r"[\d('\"]", why, maxsplit=1)[0].strip())
    for _ in range(3):
        cuts = rng.sample(range(1, max(2, len(data))), min(len(data) // 2, rng.randint(1, 12)))
        seen, split = run(data, cuts)
        assert split == whole
        if whole[0] == "error":
            assert all(offset < whole[1][0] for _, _, offset in seen)
    for step in (512, 700):
        assert run(data, range(step, len(data), step))[1] == whole
    counted: int | CorruptTarError
    try:
        counted = count_samples(io.BytesIO(data), URL, len(data), block=rng.randint(1, 4096))
    except CorruptTarError as exc:
        counted = exc
    if not data:  # an empty object is refused before any parsing
        assert isinstance(counted, CorruptTarError)
        assert counted.offset == 0
    elif whole[0] == "ok":
        assert counted == len(whole[1])
    else:
        assert isinstance(counted, CorruptTarError)
        assert counted.offset == whole[1][0]
    if whole[0] == "ok" and data:
        check_resume(data, whole[1], rng)
    return whole


def check_resume(data: bytes, samples: list[Plain], rng: random.Random) -> None:
    """A reader started at ``pending_offset`` after any prefix gives exactly the rest."""
    cut = rng.randint(1, len(data))
    reader = ShardReader(URL, len(data))
    first = [plain(s) for s in reader.feed(memoryview(data)[:cut], 0, final=cut == len(data))]
    start = reader.pending_offset
    assert start <= cut
    assert [s for s in samples if s[2] < start] == first
    rest, outcome = run(data, [start + rng.randint(1, 3000)], start)
    assert outcome[0] == "ok"
    assert first + rest == samples


# --------------------------------------------------------------------------- valid tars

_SEGMENT = st.text(alphabet="abcxyz019_-.üß€", min_size=1, max_size=60).filter(
    lambda s: s not in (".", "..")
)
_NAME = st.lists(_SEGMENT, min_size=1, max_size=6).map("/".join)
_SIZE = st.sampled_from([0, 1, 100, 511, 512, 513, 1023, 1024, 1025]) | st.integers(0, 3000)
_KINDS: list[bytes] = [tarfile.REGTYPE, tarfile.AREGTYPE, tarfile.CONTTYPE]
_OTHERS: list[bytes] = [tarfile.DIRTYPE, tarfile.SYMTYPE, tarfile.LNKTYPE, tarfile.FIFOTYPE]


@st.composite
def entries(draw: Any) -> list[tuple[str, bytes, bytes]]:
    """Members as ``(name, data, type)``; runs of one key, and entries that are no member."""
    out: list[tuple[str, bytes, bytes]] = []
    for _ in range(draw(st.integers(0, 10))):
        name = draw(_NAME)
        key = name.rpartition("/")[0] + "/" if "/" in name else ""
        key += name.rpartition("/")[2].partition(".")[0] or "k"
        for ext in draw(st.lists(st.sampled_from(["jpg", "cls", "seg.png", "json"]), unique=True)):
            size = draw(_SIZE)
            out.append(
                (f"{key}.{ext}", bytes([len(out) % 251]) * size, draw(st.sampled_from(_KINDS)))
            )
        if draw(st.booleans()):
            out.append((draw(_NAME), b"", draw(st.sampled_from(_OTHERS))))
        if draw(st.booleans()):
            out.append((name, b"x" * draw(_SIZE), tarfile.REGTYPE))
    return out


def make_tar(members: list[tuple[str, bytes, bytes]], fmt: int, pax_global: bool) -> bytes:
    buf = io.BytesIO()
    extra = {"pax_headers": {"comment": "global"}} if pax_global else {}
    with tarfile.open(fileobj=buf, mode="w", format=fmt, **extra) as archive:
        for name, data, kind in members:
            info = tarfile.TarInfo(name)
            # tarfile reads an old-style ("\0") member as a folder when the name field of
            # its header ends in "/", even where a GNU long name replaces that truncated
            # field: a tarfile quirk, not a tar rule, so the oracle avoids it.
            long = len(name.encode()) >= 100
            info.type = tarfile.REGTYPE if kind == tarfile.AREGTYPE and long else kind
            if kind in (tarfile.SYMTYPE, tarfile.LNKTYPE):
                info.linkname = "../elsewhere"
            info.size = len(data) if kind in _KINDS else 0
            archive.addfile(info, io.BytesIO(data) if kind in _KINDS else None)
    return buf.getvalue()


def reference(tar: bytes) -> list[Plain] | None:
    """tarfile's samples: regular members grouped by consecutive key; None on a repeat."""
    out: list[tuple[str, dict[str, bytes], int]] = []
    with tarfile.open(fileobj=io.BytesIO(tar), mode="r:") as archive:
        for member in archive:
            named = wds_member(member.name) if member.isfile() else None
            if named is None:
                continue
            key, ext = named
            reader = archive.extractfile(member)
            assert reader is not None
            if out and out[-1][0] == key:
                if ext in out[-1][1]:
                    return None  # a field twice in one sample: the reader refuses it
                out[-1][1][ext] = reader.read()
            else:
                out.append((key, {ext: reader.read()}, member.offset))
    return [(k, tuple(f.items()), o) for k, f, o in out]


_FORMAT = st.sampled_from([tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT])


def valid_tar(members: list[tuple[str, bytes, bytes]], fmt: int, pax_global: bool) -> bytes:
    # tarfile cannot read back a global header followed by no member ("end of file header").
    pax_global = pax_global and fmt == tarfile.PAX_FORMAT and bool(members)
    try:
        return make_tar(members, fmt, pax_global)
    except ValueError:  # a name too long for ustar
        assume(False)
        raise


@FUZZ
@given(members=entries(), fmt=_FORMAT, pax_global=st.booleans(), seed=st.integers(0, 2**32))
def test_generated_tars_match_tarfile(
    members: list[tuple[str, bytes, bytes]], fmt: int, pax_global: bool, seed: int
) -> None:
    tar = valid_tar(members, fmt, pax_global)
    if any(len(name.encode()) > 100 for name, _, _ in members):
        event("a name longer than 100 bytes")
    expected = reference(tar)
    outcome = check_consistent(tar, random.Random(seed))
    if expected is None:
        assert outcome[0] == "error"
        assert "duplicate field" in outcome[1][1]
    else:
        assert outcome == ("ok", expected)


# --------------------------------------------------------------------------- any bytes


@settings(FUZZ, max_examples=100)
@given(data=st.binary(max_size=4000), seed=st.integers(0, 2**32))
def test_random_bytes(data: bytes, seed: int) -> None:
    check_consistent(data, random.Random(seed))


_SIZE_FIELDS = st.one_of(
    st.integers(0, 4000).map(lambda n: b"%011o\0" % n),
    st.integers(0, 8**12 - 1).map(lambda n: b"%012o" % n),
    st.integers(0, 2**88 - 1).map(lambda n: b"\x80" + n.to_bytes(11, "big")),
    st.binary(min_size=12, max_size=12),
    st.sampled_from([b"-0000000001\0", b"        11  ", b"0000000009x\0", b"\xff" * 12]),
)


@st.composite
def structured(draw: Any) -> bytes:
    """Headers with hostile fields and valid checksums, records and data between them."""
    out = bytearray()
    for _ in range(draw(st.integers(1, 6))):
        block = bytearray(512)
        block[0:100] = draw(_NAME).encode()[:100].ljust(100, b"\0")
        block[100:124] = draw(st.binary(min_size=24, max_size=24))  # mode, uid, gid: unread
        block[124:136] = draw(_SIZE_FIELDS)
        block[136:148] = draw(st.binary(min_size=12, max_size=12))  # mtime: unread
        block[156] = draw(st.sampled_from(b"0\x00123457LKxgS"))
        block[157:257] = draw(st.binary(max_size=100)).ljust(100, b"\0")  # link name
        if draw(st.booleans()):
            block[257:265] = draw(st.sampled_from([b"ustar\x0000", b"ustar  \0"]))
            if draw(st.booleans()):  # a ustar prefix
                block[345:500] = draw(_NAME).encode()[:155].ljust(155, b"\0")
        block[148:156] = b" " * 8
        block[148:156] = b"%06o\0 " % sum(block)
        out += block
        if draw(st.booleans()):  # a PAX-like record, or member data
            record = draw(st.sampled_from([b"path", b"size", b"comment"]))
            value = draw(st.sampled_from([b"a.jpg", b"-1", b"10", b"9" * 25, b"\xff"]))
            length = draw(st.integers(0, 40))
            out += (b"%d %s=%s\n" % (length, record, value)).ljust(512, b"\0")
    if draw(st.booleans()):
        out += bytes(1024)
    return bytes(out)


@FUZZ
@given(data=structured(), seed=st.integers(0, 2**32))
def test_structured_hostile_headers(data: bytes, seed: int) -> None:
    check_consistent(data, random.Random(seed))


@FUZZ
@given(
    members=entries(),
    fmt=_FORMAT,
    flips=st.lists(st.tuples(st.integers(0, 1 << 16), st.integers(0, 255)), max_size=4),
    fix=st.booleans(),
    cut=st.none() | st.integers(0, 1 << 16),
    splice=st.none() | st.tuples(st.integers(0, 1 << 16), st.integers(0, 1 << 16)),
    seed=st.integers(0, 2**32),
)
def test_mutated_generated_tars(
    members: list[tuple[str, bytes, bytes]],
    fmt: int,
    flips: list[tuple[int, int]],
    fix: bool,
    cut: int | None,
    splice: tuple[int, int] | None,
    seed: int,
) -> None:
    tar = bytearray(valid_tar(members, fmt, False))
    if splice is not None:  # a block copied over another: headers where data was
        src, dst = (x % (len(tar) // 512) * 512 for x in splice)
        tar[dst : dst + 512] = tar[src : src + 512]
    if cut is not None:
        del tar[cut % (len(tar) + 1) :]
    for where, value in flips:
        if tar:
            at = where % len(tar)
            tar[at] = value
            block = at - at % 512
            if fix and block + 512 <= len(tar):
                tar[block + 148 : block + 156] = b" " * 8
                tar[block + 148 : block + 156] = b"%06o\0 " % sum(tar[block : block + 512])
    check_consistent(bytes(tar), random.Random(seed))
