"""The tar reader's fast paths against its general parser, on the same bytes.

:mod:`asyncstream.shards._tarfast` reads runs of plain members header by header (checked
one by one, or all at once by numpy) or from a table of the whole range
(:mod:`asyncstream.shards._tarbulk`),
and hands every header it cannot vouch for to the general parser. Every input here is
read in each mode, the thresholds set so that each path takes the whole input:

* ``general``: the general parser alone (``ShardReader._fast_path`` off);
* ``scan``: header by header, each header checked alone;
* ``scan-bulk``: header by header, the run checked by numpy;
* ``table``: the range's table from its first header on, its runs grouped in Python;
* ``table-vector``: the same, its runs grouped by numpy (:mod:`asyncstream.shards._targroup`);
* ``native``: the native walk (``asyncstream/shards/_tarwalk.c``), which the others are the
  reference for.

The outcomes must be identical: the same samples with the same bytes, offsets and types
(views into the range fed, or owned bytes), the same ``pending_offset`` after every range,
and the same error at the same offset with the same message.
"""

from __future__ import annotations

import io
import random
import tarfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from itertools import pairwise
from typing import Any, Literal

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from asyncstream._exceptions import CorruptTarError
from asyncstream.shards import _tarbulk, _tarfast, _targroup
from asyncstream.shards._tar import ShardReader, samples

pytestmark = pytest.mark.timeout(300)

URL = "s3://fast/shard-000003.tar"
HUGE = 1 << 40
MODES: dict[str, dict[str, Any]] = {
    "general": {"fast": False},
    "scan": {"dense": 0, "bulk": HUGE},
    "scan-bulk": {"dense": 0, "bulk": 1},
    "table": {"probe": 0, "dense": HUGE, "table": 1, "bulk": 1, "vector": HUGE},
    "table-vector": {"probe": 0, "dense": HUGE, "table": 1, "bulk": 1, "vector": 1},
    "native": {"native": True},
}
FUZZ = settings(
    max_examples=150,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@contextmanager
def mode(name: str) -> Iterator[None]:
    """Read with the fast paths set as ``MODES[name]`` says."""
    knobs = MODES[name]
    native = knobs.get("native", False)
    assert _tarfast._NATIVE_WALK is not None or not native, "the extension is not built"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ShardReader, "_fast_path", knobs.get("fast", True))
        patch.setattr(_tarfast, "NATIVE", native)
        patch.setattr(_tarfast, "_DENSE", knobs.get("dense", _tarfast._DENSE))
        patch.setattr(_tarfast, "_PROBE", knobs.get("probe", _tarfast._PROBE))
        patch.setattr(_tarbulk, "TABLE_MIN", knobs.get("table", _tarbulk.TABLE_MIN))
        patch.setattr(_tarbulk, "BULK_MIN", knobs.get("bulk", _tarbulk.BULK_MIN))
        patch.setattr(_targroup, "VECTOR_MIN", knobs.get("vector", _targroup.VECTOR_MIN))
        yield


def outcome(data: bytes, cuts: Sequence[int] = (), start: int = 0) -> list[Any]:
    """Everything a reader gives for ``data[start:]`` fed in ranges split at ``cuts``: the
    records of each range, as a list (the native walk's table read through its sequence
    protocol, which must give the very tuples of the Python walk), and the samples they
    make (what ``feed`` returns)."""
    reader = ShardReader(URL, len(data), start)
    bounds = [start, *sorted({c for c in cuts if start < c < len(data)}), len(data)]
    seen: list[Any] = []
    try:
        for a, b in pairwise(bounds):
            slot = bytearray(data[a:b])
            view = memoryview(slot)
            records = reader.records(view, a, final=b == len(data))
            if _tarfast.NATIVE:  # the table, read as the list it stands for
                assert type(records).__name__ == "Records"
                assert len(records) == len(list(records))
            else:
                assert type(records) is list
            seen.append(
                (
                    a,
                    reader.pending_offset,
                    reader.done,
                    [
                        (
                            s.key,
                            s.offset,
                            [
                                (ext, bytes(v), isinstance(v, memoryview) and v.obj is slot)
                                for ext, v in s.fields.items()
                            ],
                        )
                        for s in samples(view, records)
                    ],
                    list(records),
                )
            )
    except CorruptTarError as exc:
        seen.append(("error", exc.offset, str(exc)))
    return seen


def same_in_every_mode(data: bytes, cuts: Sequence[int] = (), start: int = 0) -> list[Any]:
    """The outcome, checked to be the same in every mode."""
    with mode("general"):
        expected = outcome(data, cuts, start)
    for name in MODES:
        with mode(name):
            assert outcome(data, cuts, start) == expected, name
    return expected


# --------------------------------------------------------------------------- building


def header_offsets(tar: bytes) -> list[int]:
    with tarfile.open(fileobj=io.BytesIO(tar)) as archive:
        return [m.offset for m in archive]


def _pad(data: bytes) -> bytes:
    return data + b"\0" * (-len(data) % 512)


def member(
    name: str,
    data: bytes = b"",
    *,
    fmt: Literal[0, 1, 2] = tarfile.USTAR_FORMAT,
    kind: bytes = tarfile.REGTYPE,
    size: int | None = None,
    mtime: float = 0,
) -> bytes:
    """One entry (its extended headers included) as tarfile writes it in ``fmt`` (a
    fractional ``mtime`` is a PAX header of it, as webdataset's TarWriter writes one)."""
    info = tarfile.TarInfo(name)
    info.size, info.type, info.mtime = len(data) if size is None else size, kind, mtime
    if mtime % 1:
        fmt = tarfile.PAX_FORMAT
    if kind in (tarfile.SYMTYPE, tarfile.LNKTYPE):
        info.linkname = "elsewhere"
    return info.tobuf(fmt, "utf-8", "surrogateescape") + _pad(data)


def fix_checksum(block: bytearray, spelling: bytes = b"%06o\0 ") -> None:
    block[148:156] = b" " * 8
    block[148:156] = (spelling % sum(block)).ljust(8, b" ")[:8]


def patched(entry: bytes, edit: Any, spelling: bytes = b"%06o\0 ") -> bytes:
    """``entry`` with its (last) header changed by ``edit(block)`` and summed again."""
    at = _header_at(entry)
    block = bytearray(entry[at : at + 512])
    edit(block)
    fix_checksum(block, spelling)
    return entry[:at] + bytes(block) + entry[at + 512 :]


def _header_at(entry: bytes) -> int:
    """The offset of the member's own header in an entry: after its extended headers."""
    at = 0
    while entry[at + 156] in b"xXgLK":
        size = int(entry[at + 124 : at + 136].rstrip(b"\0 ") or b"0", 8)
        at += 512 + -(-size // 512) * 512
    return at


def end() -> bytes:
    return b"\0" * 1024


def plain_run(prefix: str, n: int, seed: int) -> bytes:
    rng = random.Random(seed)
    out = b""
    for i in range(n):
        key = f"{prefix}{i:05d}"
        out += member(f"{key}.jpg", rng.randbytes(rng.choice([0, 1, 511, 512, 513, 1500])))
        out += member(f"{key}.cls", str(i % 7).encode())
        out += member(f"{key}.json", b'{"i": %d}' % i)
    return out


def _set_v7(block: bytearray) -> None:
    block[257:265] = b"\0" * 8


def _set_size_space(block: bytearray) -> None:
    block[135] = 0x20


def _set_base256(block: bytearray) -> None:
    size = int(block[124:135], 8)
    block[124:136] = b"\x80" + size.to_bytes(11, "big")


def _set_twelve_digits(block: bytearray) -> None:
    block[124:136] = b"%012o" % int(block[124:135], 8)  # no NUL: tarfile reads 12 digits


def mixed_shard() -> bytes:
    """Runs of plain members broken by every other kind of entry, mid-range."""
    parts = [
        plain_run("a/", 40, 1),
        member("a/dir/", kind=tarfile.DIRTYPE),
        member("a/link.jpg", kind=tarfile.SYMTYPE),
        plain_run("b/", 5, 2),
        member("b/ü-00001.jpg", b"pax name", fmt=tarfile.PAX_FORMAT),  # an x header
        member("b/ü-00001.cls", b"3", fmt=tarfile.PAX_FORMAT),
        member("c/" + "l" * 120 + ".jpg", b"gnu long name", fmt=tarfile.GNU_FORMAT),
        member("d/" + "p" * 90 + "/" + "q" * 40 + ".jpg", b"ustar prefix"),
        patched(member("e/v7.jpg", b"no magic"), _set_v7),
        patched(member("e/odd.jpg", b"7 digit checksum"), lambda b: None, b"%07o\0"),
        patched(member("e/space.jpg", b"size ends in a space"), _set_size_space),
        patched(member("e/b256.jpg", b"base-256 size"), _set_base256),
        member("e/old-style-dir.d/", kind=tarfile.AREGTYPE),
        member("e/AREG.JPG", b"old-style file, upper case"),
        member("e/Mixed.Seg.PNG", b"two dots"),
        member("e/x.", b"empty extension"),
        member("e/README", b"no extension"),
        member("e/.hidden", b"hidden"),
        member("_under.jpg", b"leading underscore"),
        member("f/k\udcff\udcfe.jpg", b"not utf-8"),
        member("f/k\udcff\udcfe.cls", b"1"),
        member("g/é.jpg", b"utf-8 key, ustar"),
        member("g/é.cls", b"2"),
        patched(member("e/twelve.jpg", bytes(13)), _set_twelve_digits),
        member("q/00001.jpg", b"newlines"),
        member("q/00001.c\nls", b"in an extension"),
        member("q/00001.cls\n", b"at the end"),
        member("q/a\nb.jpg", b"in a key"),
        member("q/a\nb.cls", b"4"),
        member("q.r\n/s.jpg", b"a newline, then the last slash: webdataset skips it"),
        member("__x__/y.jpg", b"a meta folder"),
        member("__k.jpg", b"a leading double underscore"),
        member("w/k.jpg", b"a sample"),
        member("w/k.d/e.jpg", b"its key and a dot, then a folder: another sample"),
        member("h/" + "n" * 94 + ".jpg", b"a 100-byte name field, no NUL"),
        member("h/" + "n" * 94 + ".cls", b"3"),
        member("i/nested.tar", plain_run("inner/", 12, 3) + end()),  # magic inside data
        plain_run("j/", 40, 4),
    ]
    return b"".join(parts) + end()


MIXED = mixed_shard()


# --------------------------------------------------------------------------- tests


def test_the_mixed_shard_is_read_as_tarfile_reads_it() -> None:
    with tarfile.open(fileobj=io.BytesIO(MIXED)) as archive:
        assert len([m for m in archive if m.isfile()]) > 250
    (step,) = same_in_every_mode(MIXED)
    keys = [key for key, _, _ in step[3]]
    for key in ("e/v7", "f/k\udcff\udcfe", "i/nested", "e/AREG", "h/" + "n" * 94):
        assert key in keys
    assert [ext for ext, _, _ in step[3][0][2]] == ["jpg", "cls", "json"]
    assert all(zero_copy for _, _, fields in step[3] for _, _, zero_copy in fields)


@pytest.mark.parametrize("chunk", [512, 1000, 1536, 4096, 10_000, 65_536])
def test_every_mode_reads_the_mixed_shard_alike_in_ranges(chunk: int) -> None:
    steps = same_in_every_mode(MIXED, range(chunk, len(MIXED), chunk))
    assert sum(len(step[3]) for step in steps) > 100


def test_random_cuts_and_resume_points() -> None:
    rng = random.Random(7)
    heads = header_offsets(MIXED)
    for _ in range(20):
        cuts = sorted(rng.sample(range(1, len(MIXED)), rng.randint(1, 40)))
        same_in_every_mode(MIXED, cuts, start=rng.choice(heads))


def test_a_corrupt_checksum_inside_a_run_of_plain_headers() -> None:
    shard = bytearray(plain_run("k/", 60, 5) + end())
    heads = header_offsets(bytes(shard))
    victim = heads[100]
    shard[victim + 20] ^= 0x01  # in the name: the sum no longer matches
    for cuts in ([], [victim - 512], [victim + 100], list(range(4096, len(shard), 4096))):
        (*_, last) = same_in_every_mode(bytes(shard), cuts)
        assert last == (
            "error",
            victim,
            f"{URL}: corrupt tar at byte {victim}: header checksum mismatch "
            f"(stored {bytes(shard[victim + 148 : victim + 156])!r})",
        )


@pytest.mark.parametrize("flag", list(b"123456xXgLKSAZ\0"), ids=lambda f: repr(chr(f)))
def test_a_header_of_another_type_inside_a_run_of_plain_headers(flag: int) -> None:
    odd = patched(member("u/00040.jpg", bytes(700)), lambda b: b.__setitem__(156, flag))
    shard = plain_run("u/", 40, 10) + odd + plain_run("v/", 40, 11) + end()
    same_in_every_mode(shard)
    same_in_every_mode(shard, range(1024, len(shard), 1024))


def test_a_duplicate_field_inside_a_run_of_plain_headers() -> None:
    run = plain_run("m/", 40, 6)
    twice = member("m/00039.cls", b"again")
    shard = run + twice + plain_run("n/", 40, 7) + end()
    (*_, last) = same_in_every_mode(shard)
    assert last == (
        "error",
        len(run),
        f"{URL}: corrupt tar at byte {len(run)}: duplicate field 'cls' in sample 'm/00039'",
    )


def test_a_member_past_the_end_and_a_truncated_shard() -> None:
    run = plain_run("p/", 40, 8)
    shard = run + member("p/big.jpg", bytes(5000))
    for cut, what in ((len(shard) - 2000, "runs past the end"), (len(run) + 300, "truncated")):
        for cuts in ([], range(2048, cut, 2048)):
            (*_, last) = same_in_every_mode(shard[:cut], cuts)
            assert last[:2] == ("error", len(run))
            assert what in last[2]


def test_headers_that_switch_between_plain_and_extended_within_a_range() -> None:
    parts = []
    for i in range(80):
        fmt: Literal[0, 1, 2] = tarfile.PAX_FORMAT if i % 3 == 0 else tarfile.USTAR_FORMAT
        name = f"s/{i:04d}-é.jpg" if fmt == tarfile.PAX_FORMAT else f"s/{i:04d}.jpg"
        parts.append(member(name, bytes([i]) * (i * 37 % 900), fmt=fmt))
        parts.append(member(name.replace(".jpg", ".cls"), b"%d" % i, fmt=fmt))
    shard = b"".join(parts) + end()
    splits: list[Sequence[int]] = [[], range(3000, len(shard), 3000)]
    for cuts in splits:
        steps = same_in_every_mode(shard, cuts)
        assert sum(len(step[3]) for step in steps) == 80


@FUZZ
@given(
    specs=st.lists(
        st.tuples(
            st.sampled_from(["a", "b", "c", "a/b", "x.y/z", "_u", "é", "k\udcff"]),
            st.sampled_from(["jpg", "CLS", "seg.png", "", "__key__", "_x"]),
            st.sampled_from([0, 1, 100, 511, 512, 513, 2000]),
            st.sampled_from(["plain", "plain", "plain", "pax", "gnu", "dir", "v7", "odd"]),
        ),
        max_size=60,
    ),
    flips=st.lists(st.tuples(st.integers(0, 10**6), st.integers(1, 255)), max_size=2),
    chunk=st.sampled_from([None, 512, 700, 2048, 5000]),
)
def test_generated_shards_read_alike_in_every_mode(
    specs: list[tuple[str, str, int, str]],
    flips: list[tuple[int, int]],
    chunk: int | None,
) -> None:
    parts = []
    for i, (stem, ext, size, kind) in enumerate(specs):
        name = f"{stem}{i // 2}.{ext}" if ext else f"{stem}{i // 2}"
        data = bytes([i % 251]) * size
        if kind == "dir":
            parts.append(member(name + "/", kind=tarfile.DIRTYPE))
        elif kind == "v7":
            parts.append(patched(member(name, data), _set_v7))
        elif kind == "odd":
            parts.append(patched(member(name, data), lambda b: None, b"%07o\0"))
        else:
            fmt: Literal[0, 1, 2] = tarfile.USTAR_FORMAT
            if kind != "plain":
                fmt = tarfile.PAX_FORMAT if kind == "pax" else tarfile.GNU_FORMAT
            try:
                parts.append(member(name, data, fmt=fmt))
            except ValueError:  # a name ustar cannot hold
                parts.append(member(name, data, fmt=tarfile.PAX_FORMAT))
    shard = bytearray(b"".join(parts) + end())
    for at, value in flips:
        shard[at % len(shard)] ^= value
    cuts = range(chunk, len(shard), chunk) if chunk else ()
    same_in_every_mode(bytes(shard), cuts)


# --------------------------------------------------------------------------- the checks


def plain_by_hand(h: bytes) -> bool:
    """What _tarbulk takes for a plain header (limits aside), written out in Python."""
    total = sum(h) - sum(h[148:156]) + 256
    return (
        h[257:262] == b"ustar"
        and h[156] in b"07\0"
        and all(c in b"01234567" for c in h[124:135])
        and h[135] in (0, 0x20)
        and h[148:156] == b"%06o\0 " % total
        and h[345] == 0
    )


@FUZZ
@given(
    edits=st.lists(st.tuples(st.integers(0, 511), st.integers(0, 255)), max_size=3),
    resum=st.booleans(),
)
def test_the_table_takes_a_header_exactly_when_it_is_plain(
    edits: list[tuple[int, int]], resum: bool
) -> None:
    blocks = bytearray(plain_run("t/", 12, 9))  # 36 members, each one block of header
    heads = header_offsets(bytes(blocks) + end())
    victim = heads[17]
    for at, value in edits:
        blocks[victim + at] = value
    if resum:
        block = bytearray(blocks[victim : victim + 512])
        fix_checksum(block)
        blocks[victim : victim + 512] = block
    data = memoryview(bytes(blocks) + end())
    header = bytes(blocks[victim : victim + 512])
    table = _tarbulk.HeaderTable.of(data, 0, len(data), len(data))
    assert table is not None
    i, j, _ = table.run(0)
    assert i == 0
    if not plain_by_hand(header):
        assert j == 17
    elif int(header[124:135], 8) == int(plain_run("t/", 12, 9)[victim + 124 : victim + 135], 8):
        assert j == len(heads)
    else:  # another size: the next header is not where this one says
        assert j in (17, 18)
    checked = header[148:156] == b"%06o\0 " % (sum(header) - sum(header[148:156]) + 256) and (
        all(c in b"01234567" for c in header[124:135]) and header[135] in (0, 0x20)
    )
    for name in ("scan", "scan-bulk"):
        with mode(name):
            assert _tarbulk.first_bad(data, heads) == (len(heads) if checked else 17)
