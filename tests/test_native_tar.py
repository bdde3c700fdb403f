"""The native tar walk (``asyncstream/shards/_tarwalk.c``) against its Python reference.

Every input is read three ways, each through :class:`~asyncstream.shards._tar.ShardReader`
fed in the same ranges: the native walk, the Python walk it replaces (``_tarfast``) and
the general parser alone. The outcomes must be identical: the same samples with the same
bytes, offsets and kinds (views into the range or owned bytes), the same
``pending_offset`` after every range, and the same error at the same offset with the same
message (see ``tests/test_tarfast.py``'s ``outcome``).

Inputs: valid shards as ``tarfile`` (ustar, GNU, PAX), ``webdataset.TarWriter`` and GNU
tar write them, then mutated (bytes flipped, headers replaced by random ones with a valid
checksum, cut short); headers built field by field from the bytes that matter to the walk
(names with dots, slashes, underscores, newlines, upper case and bytes that are not UTF-8;
ustar prefixes; every type flag; sizes and checksums spelled oddly). The number of
examples is bounded (``ASYNCSTREAM_FUZZ_EXAMPLES``, 150 by default) and derandomized, so
CI and ``make sanitize`` run the same inputs each time.
"""

from __future__ import annotations

import io
import os
import subprocess
import tarfile
import tracemalloc
from functools import cache
from itertools import pairwise
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from asyncstream.shards import _tarbulk, _tarfast
from tests._foreign import gnu_tar, tarfile_shard, webdataset_shard
from tests._fuzz import FUZZ
from tests.test_tarfast import MIXED, end, fix_checksum, member, mode, outcome, plain_run

pytestmark = pytest.mark.timeout(600)

REFERENCES = ("general", "scan")  # the general parser alone; the Python walk by headers


def read_alike(data: bytes, cuts: list[int], start: int = 0) -> list[Any]:
    """The native outcome, checked against every Python reference."""
    with mode("native"):
        native = outcome(data, cuts, start)
    for name in REFERENCES:
        with mode(name):
            assert native == outcome(data, cuts, start), name
    return native


@cache
def gnu_shard() -> bytes | None:
    """A shard as GNU tar writes it: upper-case extensions, a folder entry, a long name."""
    tar = gnu_tar()
    if tar is None:
        return None
    with TemporaryDirectory() as tmp:
        files = Path(tmp) / "train"
        files.mkdir()
        for i in range(40):
            (files / f"n0144_{i:05d}.JPEG").write_bytes(bytes([i]) * (i * 97 % 1500))
            (files / f"n0144_{i:05d}.cls").write_bytes(b"%d" % (i % 5))
        (files / ("l" * 120 + ".jpg")).write_bytes(b"a GNU long name")
        made = subprocess.run(
            [tar, "--sort=name", "--format=gnu", "-cf", "-", "-C", tmp, "train"],
            capture_output=True,
            check=True,
        )
    return made.stdout


@cache
def sources() -> list[bytes]:
    """The valid shards the fuzzers start from."""
    out = [
        MIXED,
        tarfile_shard("a.tar", 1, 40).data,
        webdataset_shard("b.tar", 2, 40).data,
    ]
    gnu = gnu_shard()
    if gnu is not None:
        out.append(gnu)
    return out


def headers(data: bytes) -> list[int]:
    """The offsets of the headers tarfile finds in ``data``."""
    with tarfile.open(fileobj=io.BytesIO(data)) as archive:
        return [m.offset for m in archive]


# --------------------------------------------------------------------------- the build


def test_the_extension_is_built_and_reads_by_default() -> None:
    assert _tarfast._NATIVE_WALK is not None, "run `make install` (or setup.py build_ext)"
    assert _tarfast.NATIVE is (os.environ.get("ASYNCSTREAM_NATIVE", "1") != "0")


def test_bounds_outside_the_buffer_are_refused() -> None:
    assert _tarfast._NATIVE_WALK is not None
    data = memoryview(MIXED)
    with pytest.raises(ValueError, match="bad bounds"):
        _tarfast._NATIVE_WALK(data, 0, len(MIXED) + 512, len(MIXED) + 512, 0, None)
    with pytest.raises(ValueError, match="bad bounds"):
        _tarfast._NATIVE_WALK(data, -512, len(MIXED), len(MIXED), 0, None)
    with pytest.raises(TypeError):
        _tarfast._NATIVE_WALK(data, 0, len(MIXED), len(MIXED), 0, ("k", 0, ("not", "a list")))


def test_the_native_walk_takes_the_plain_runs() -> None:
    """It reads what the Python walk reads, not just what the general parser reads after
    it: a run of plain members is one call."""
    assert _tarfast._NATIVE_WALK is not None
    shard = tarfile_shard("a.tar", 1, 40).data
    with tarfile.open(fileobj=io.BytesIO(shard)) as archive:
        last = archive.getmembers()[-1]
        after = last.offset_data + (last.size + 511) // 512 * 512
    rel, pending, records, again, cut = _tarfast._NATIVE_WALK(
        memoryview(shard), 0, len(shard), len(shard), 0, None
    )
    assert (rel, again, cut) == (after, True, None)
    assert len(records) == 39
    assert pending is not None
    assert pending[0] == "000010039"
    assert [f[0] for f in records[0][2:]] == ["jpg", "cls", "json"]


def _walked(data: bytes, rel: int, limit: int, stop: int, doff: int, pending: Any) -> Any:
    """The walk's answer, records as a list, native and Python alike (asserted; but for
    whether to walk again after a header whose checksum is bad and whose data the range
    cuts: the native walk checks the sum first, the Python one the size, and either way
    the general parser reads that header next)."""
    answers = []
    for native in (True, False):
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(_tarfast, "NATIVE", native)
            walker = _tarfast.RangeWalker(memoryview(data), doff, limit, stop, _tarfast.Names())
            rel2, tail, records, again, cut = walker.walk(rel, pending)
            answers.append((rel2, tail, list(records), again, cut))
    assert answers[0][:3] + answers[0][4:] == answers[1][:3] + answers[1][4:]
    if answers[0][3] != answers[1][3]:
        assert (answers[0][3], answers[1][3]) == (False, True)
        assert _tarbulk.first_bad(memoryview(data), [answers[0][0]]) == 0
    return answers[1]


def test_a_member_the_range_cuts_is_named_by_the_walk() -> None:
    """The walk ends at a plain member whose data the range's end cuts and names it (its
    field name, size and data's start: the reader gathers it), as the sample's next
    member: in the sample in progress, or beginning the next, the one before then
    completed. Native and Python alike; where the walk would not take the member whole, it
    does not name it."""
    big = b"J" * 2000
    cont = member("a.cls", b"1") + member("a.jpg", big) + end()
    # a.cls whole (header and one block), a.jpg's header and 512 of its 2000 bytes
    assert _walked(cont, 0, 2048, len(cont), 0, None) == (
        1024,
        ("a", 0, [("cls", 512, 513, None)]),
        [],
        True,
        ("jpg", 2000, 1536),
    )
    begins = member("a.cls", b"1") + member("b.jpg", big) + end()
    assert _walked(begins, 0, 2048, len(begins), 0, None) == (
        1024,
        ("b", 1024, []),
        [("a", 0, ("cls", 512, 513, None))],
        True,
        ("jpg", 2000, 1536),
    )
    # a sample carried in from an earlier range owns its bytes: nothing of the cut is kept
    carried = ("a", -1024, [("jpg", 0, 0, b"j")])
    assert _walked(member("a.cls", big) + end(), 0, 1024, 3072, 0, carried) == (
        0,
        ("a", -1024, [("jpg", 0, 0, b"j")]),
        [],
        True,
        ("cls", 2000, 512),
    )
    # a prefix joined as tarfile joins it
    prefixed = member("d" * 120 + "/k.jpg", big) + end()
    assert _walked(prefixed, 0, 1024, len(prefixed), 0, None)[1:] == (
        ("d" * 120 + "/k", 0, []),
        [],
        True,
        ("jpg", 2000, 512),
    )
    # after a PAX header of an mtime alone (webdataset's TarWriter): the entry, and so the
    # sample, begins at the PAX header; the data after the member's own header
    stamped = member("a.cls", b"1") + member("a.jpg", big, mtime=1.5) + end()
    assert _walked(stamped, 0, 3072, len(stamped), 0, None) == (
        1024,
        ("a", 0, [("cls", 512, 513, None)]),
        [],
        True,
        ("jpg", 2000, 2560),
    )
    # not named: a duplicate field, a name the general parser reads, past the shard's end,
    # a bad checksum, a cut header
    dup = member("a.jpg", b"1") + member("a.jpg", big) + end()
    odd = member("_a.jpg", big) + end()
    past = member("a.jpg", big)
    summed = bytearray(member("a.jpg", big) + end())
    summed[150] ^= 1
    for data, limit, stop, rel in (
        (dup, 2048, len(dup), 1024),
        (odd, 1024, len(odd), 0),
        (past, 1024, 2048, 0),
        (bytes(summed), 1024, len(summed), 0),
        (cont, 1280, len(cont), 1024),
    ):
        assert _walked(data, 0, limit, stop, 0, None)[0] == rel
        assert _walked(data, 0, limit, stop, 0, None)[4] is None


def test_webdataset_tar_writer_shards_are_walked() -> None:
    """``webdataset.TarWriter`` writes a PAX header of a fractional mtime before every
    member: the walk reads those members (the general parser read all of them before, 9
    us a member), with the general parser's samples and offsets (``read_alike``)."""
    from asyncstream.shards._tar import ShardReader

    shard = webdataset_shard("b.tar", 2, 300).data
    assert shard[156] == ord("x")  # the PAX header, first
    for cuts in ([], list(range(4096, len(shard), 4096))):
        read_alike(shard, cuts)
    with mode("native"):
        reader = ShardReader("s3://b/b.tar", len(shard))
        assert len(reader.records(memoryview(shard), 0, final=True)) == 300
    assert reader.general_members == 0


# PAX headers in front of a member: the no-op ones the walk reads, and the others, whose
# entries the general parser reads (a name, a size, a sparse map, a malformed record).
PAX_RECORDS: list[dict[str, str] | bytes] = [
    {"mtime": "1795862519.1172686"},
    {"mtime": "1.5", "atime": "2.5", "ctime": "3.5"},
    {"uname": "bigdata", "gname": "bigdata", "uid": "9999999999", "gid": "1"},
    {"path": "k.png"},
    {"size": "3"},
    {"comment": "hello"},
    {"mtime": "1", "path": "z/k.jpg"},
    {"GNU.sparse.name": "k.jpg"},
    b"9 mtime=1\n",  # a length one short
    b"10 mtime=1\n\0\0garbage",  # records end at a NUL
    b"10 mtime 1\n",  # no '='
    b"10 =mtime1\n",  # an empty keyword
    b"11 mtime=1\n",  # a length past the payload
    b"xx mtime=1\n",
    b"",
    b"10 mtime=1\n" * 52,  # over one block
]


def _pax(records: dict[str, str] | bytes, name: str, data: bytes) -> bytes:
    """A PAX header of ``records`` (raw bytes: the payload as given), then the member."""
    if isinstance(records, dict):
        info = tarfile.TarInfo(name)
        info.size, info.mtime = len(data), 0
        info.pax_headers = records
        return info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape") + _padded(data)
    head = tarfile.TarInfo("././@PaxHeader")
    head.size, head.type, head.mtime = len(records), tarfile.XHDTYPE, 0
    block = bytearray(head.tobuf(tarfile.USTAR_FORMAT))
    return bytes(block) + _padded(records) + member(name, data)


def _padded(data: bytes) -> bytes:
    return data + b"\0" * (-len(data) % 512)


@pytest.mark.parametrize("records", PAX_RECORDS, ids=lambda r: repr(r)[:40])
def test_pax_headers_read_alike(records: dict[str, str] | bytes) -> None:
    shard = (
        member("k.cls", b"1")
        + _pax(records, "k.jpg", b"J" * 700)
        + _pax(records, "m.jpg", b"M" * 30)
        + member("m.cls", b"2")
        + end()
    )
    for cuts in ([], [1024], [1536], list(range(512, len(shard), 512))):
        read_alike(shard, cuts)


def test_what_follows_a_no_op_pax_header_reads_alike() -> None:
    """A no-op PAX header before another PAX header (a name), a folder, a link, a sparse
    member or the end marker: the general parser's entries, read alike."""
    stamp = b"10 mtime=1\n"
    shard = (
        _pax(stamp, "k.cls", b"1")
        + _pax(stamp, "x", b"")[:1024]  # the PAX header alone, then another's entry:
        + member("k/é.jpg", b"j" * 600, fmt=tarfile.PAX_FORMAT)  # a PAX path
        + _pax(stamp, "x", b"")[:1024]
        + member("d/", kind=tarfile.DIRTYPE)
        + _pax(stamp, "x", b"")[:1024]
        + member("k.lnk", kind=tarfile.SYMTYPE)
        + _pax(stamp, "m.jpg", b"m" * 100)
        + _pax(stamp, "x", b"")[:1024]
        + end()
    )
    for cuts in ([], list(range(512, len(shard), 512))):
        read_alike(shard, cuts)


def test_a_pax_header_of_mtime_alone_is_the_walks() -> None:
    """Where the walk reads it, the general parser reads none of the shard."""
    from asyncstream.shards._tar import ShardReader

    shard = b"".join(_pax({"mtime": f"{i}.5"}, f"k{i}.jpg", b"j" * i) for i in range(50))
    shard += end()
    for name, general in (("native", 0), ("scan", 0), ("general", 50)):
        with mode(name):
            reader = ShardReader("s3://b/p.tar", len(shard))
            assert len(reader.records(memoryview(shard), 0, final=True)) == 50
        assert reader.general_members == general, name


@pytest.mark.parametrize("name", ["native", "scan", "general"])
def test_a_cut_member_over_the_sample_limit_is_the_general_parsers_error(name: str) -> None:
    """A member larger than ``max_sample_bytes``, its data cut by the range: the same
    error, at its header, whichever read its header."""
    from asyncstream import CorruptTarError
    from asyncstream.shards._limits import ReadLimits
    from asyncstream.shards._tar import ShardReader

    shard = member("a.cls", b"1") + member("a.jpg", b"J" * 5000) + end()
    with mode(name):
        reader = ShardReader("s3://b/s.tar", len(shard), limits=ReadLimits(max_sample_bytes=4000))
        with pytest.raises(CorruptTarError, match="at byte 1024") as caught:
            reader.feed(memoryview(bytearray(shard[:2048])), 0)
    assert "'a.jpg'" in str(caught.value)
    assert "5000" in str(caught.value)


# --------------------------------------------------------------------------- the suites


@pytest.mark.parametrize("chunk", [None, 512, 1536, 4096, 65_536])
def test_every_source_reads_alike(chunk: int | None) -> None:
    for data in sources():
        cuts = list(range(chunk, len(data), chunk)) if chunk else []
        assert read_alike(data, cuts)[-1][0] != "error"


# Names at the edges of webdataset's rule, each after a sample whose key it may extend.
TRICKY = [
    ".jpg",
    "k/.jpg",
    "a.b/.jpg",
    "k..jpg",
    "k.",
    "k.a.b",
    "_k.jpg",
    "k/_b.jpg",
    "k._x",
    "k.B_C",
    "k.JPG",
    "k.jpg\n",
    "\nk.jpg",
    "k\nk.jpg",
    "k/b",
    "k/",
    "k.b/c",
    "é.PNG",
    "k.É",
    "k.\udcff",
    "k\udcff.jpg",
    "k.__key__",
    "__k__.jpg",
    "__k__/x.jpg",
    "k.jpg/",
    "K.jpg",
    "k.İ",
]


@pytest.mark.parametrize("name", TRICKY)
def test_names_at_the_edges_of_the_rule_read_alike(name: str) -> None:
    shard = (
        plain_run("r/", 2, 1)
        + member("k.cls", b"1")
        + member(name, b"tricky")
        + member("k.json", b"{}")
        + member(name, b"again")
        + plain_run("s/", 2, 2)
        + end()
    )
    for cuts in ([], [1536], list(range(512, len(shard), 512))):
        read_alike(shard, cuts)


def test_a_sample_the_general_parser_interrupts_keeps_its_views() -> None:
    """A sample begun by the native walk at the range's first byte, continued by the general
    parser (a PAX member) and then by the native walk again: views, not copies."""
    shard = b"".join(
        member(f"k{i}é.jpg", b"j" * i)
        + member(f"k{i}é.cls", b"%d" % i, fmt=tarfile.PAX_FORMAT)  # an x header: é
        + member(f"k{i}é.json", b"{}")
        for i in range(4)
    )
    shard += end()
    heads = headers(shard)
    for start in heads:
        read_alike(shard, list(range(start + 1536, len(shard), 1536)), start)
        (step,) = read_alike(shard, [], start)  # one range: every field a view of it
        assert all(zero for sample in step[3] for _, _, zero in sample[2])


# --------------------------------------------------------------------------- fuzzing


@FUZZ
@given(
    which=st.integers(0, 3),
    flips=st.lists(st.tuples(st.integers(0, 10**7), st.integers(1, 255)), max_size=4),
    in_header=st.lists(st.tuples(st.integers(0, 10**4), st.integers(0, 511)), max_size=3),
    cut=st.one_of(st.none(), st.integers(0, 10**7)),
    chunk=st.sampled_from([None, 512, 700, 2048, 5000, 30_000]),
    start=st.integers(0, 10**4),
)
def test_mutated_shards_read_alike(
    which: int,
    flips: list[tuple[int, int]],
    in_header: list[tuple[int, int]],
    cut: int | None,
    chunk: int | None,
    start: int,
) -> None:
    base = sources()[which % len(sources())]
    heads = headers(base)
    shard = bytearray(base)
    for at, value in flips:
        shard[at % len(shard)] ^= value
    for head, at in in_header:  # a header's byte changed, and summed again half the time
        h = heads[head % len(heads)]
        shard[h + at] ^= 0x20 if at % 3 else 0x01
        if head % 2:
            block = bytearray(shard[h : h + 512])
            fix_checksum(block)
            shard[h : h + 512] = block
    if cut is not None:
        shard = shard[: cut % (len(shard) + 1)]
    first = heads[start % len(heads)] if start % 4 else 0
    if first >= len(shard):
        first = 0
    cuts = list(range(chunk, len(shard), chunk)) if chunk else []
    read_alike(bytes(shard), cuts, first)


_NAME_BYTES = st.sampled_from(
    [b"a", b"B", b"0", b".", b"/", b"_", b"\n", b"\0", b"\xc3\xa9", b"\xff", b"J", b"jpg"]
)
_NAMES = st.lists(_NAME_BYTES, max_size=14).map(b"".join)


@st.composite
def headers_spelled(draw: st.DrawFn) -> bytes:
    """A header and its data, built field by field; summed as tar does most of the time."""
    name = draw(st.one_of(_NAMES, st.sampled_from([b"k.jpg", b"k.cls", b"k.JPG", b"d/k.c"])))
    block = bytearray(512)
    filled = draw(st.integers(0, 7)) == 0 and name  # a 100-byte name, no NUL
    block[0:100] = (name * 100)[:100] if filled else name.ljust(100, b"\0")[:100]
    size = draw(st.sampled_from([0, 1, 511, 512, 513, 1400]))
    digits = draw(
        st.sampled_from([b"%011o\0", b"%011o ", b"%012o", b"%11o\0", b"0o%09o", b"%010o\0\0"])
    )
    block[124:136] = (digits % size)[:12].ljust(12, b"\0")
    block[156] = draw(st.sampled_from(list(b"07\0" * 4 + b"15LKxgS")))
    if draw(st.booleans()):
        block[257:265] = b"ustar\x0000"
    if draw(st.integers(0, 5)) == 0:
        block[345:500] = draw(_NAMES).ljust(155, b"\0")[:155]
    spelling = draw(st.sampled_from([b"%06o\0 "] * 6 + [b"%07o\0", b"%06o  ", b"%o"]))
    fix_checksum(block, spelling)
    if draw(st.integers(0, 9)) == 0:
        block[draw(st.integers(0, 511))] ^= draw(st.integers(1, 255))
    return bytes(block) + bytes([size % 251]) * size + b"\0" * (-size % 512)


_PAX_KEYWORDS = st.sampled_from(["mtime", "atime", "uname", "path", "size", "comment", "x"])


@st.composite
def pax_entries(draw: st.DrawFn) -> bytes:
    """A PAX header of records drawn from keywords the walk reads and others, at times
    spelled wrong, then a member (or, at times, another PAX header's member or nothing)."""
    records = b""
    for _ in range(draw(st.integers(0, 3))):
        keyword = draw(_PAX_KEYWORDS).encode()
        value = draw(st.sampled_from([b"1", b"1.5", b"k.jpg", b"3", b"", b"\xff"]))
        body = b" " + keyword + b"=" + value + b"\n"
        length = len(body) + len(str(len(body) + 2)) if len(body) > 7 else len(body) + 1
        length += draw(st.sampled_from([0] * 6 + [-1, 1]))
        records += str(length).encode() + body
    if draw(st.integers(0, 5)) == 0:
        records += b"\0junk"
    name = draw(st.sampled_from(["k.jpg", "k.cls", "d/k.png", "_k.jpg"]))
    return _pax(records, name, bytes(draw(st.integers(0, 600))))


@FUZZ
@given(
    parts=st.lists(
        st.one_of(
            headers_spelled(),
            pax_entries(),
            st.builds(lambda i: member(f"p/{i:03d}.jpg", bytes(i)), st.integers(0, 600)),
            st.builds(lambda i: member(f"p/{i:03d}.cls", b"%d" % i), st.integers(0, 20)),
        ),
        max_size=40,
    ),
    chunk=st.sampled_from([None, 512, 1024, 3000]),
    ending=st.booleans(),
)
def test_headers_built_field_by_field_read_alike(
    parts: list[bytes], chunk: int | None, ending: bool
) -> None:
    shard = b"".join(parts) + (end() if ending else b"")
    if not shard:
        return
    cuts = list(range(chunk, len(shard), chunk)) if chunk else []
    read_alike(shard, cuts)


@FUZZ
@given(data=st.binary(min_size=512, max_size=4096), chunk=st.sampled_from([None, 512, 1000]))
def test_random_bytes_read_alike(data: bytes, chunk: int | None) -> None:
    cuts = list(range(chunk, len(data), chunk)) if chunk else []
    read_alike(data, cuts)


# --------------------------------------------------------------------------- the records table


def tarwalk() -> Any:
    assert _tarfast._TARWALK is not None, "run `make install` (or setup.py build_ext)"
    return _tarfast._TARWALK


EXTS = ["jpg", "cls", "json", "JPG", "tar.gz", "x\udcff"]

fields_st = st.tuples(
    st.sampled_from(EXTS),
    st.integers(-3, 40),
    st.integers(-3, 40),
    st.one_of(st.none(), st.binary(max_size=5)),
)
records_st = st.lists(
    st.builds(
        lambda key, offset, fields: (key, offset, *fields),
        st.text(max_size=4),
        st.integers(0, 1 << 40),
        st.lists(fields_st, max_size=4),
    ),
    max_size=8,
)


def table(records: list[Any]) -> Any:
    out = tarwalk().Records()
    out.extend(records)
    return out


@FUZZ
@given(first=records_st, second=records_st)
def test_the_table_reads_as_the_list_it_replaces(first: list[Any], second: list[Any]) -> None:
    t = table(first)
    assert list(t) == first
    assert len(t) == len(first)
    for i in range(-len(first), len(first)):
        assert t[i] == first[i]
    for i in (len(first), -len(first) - 1, 1 << 70):
        with pytest.raises(IndexError):
            t[i]
    other = table(list(reversed(second)))  # its extensions in another order
    t += other
    for record in second:
        t.append(record)
    t.extend(t)  # itself: read before it grows
    whole = first + list(reversed(second)) + second
    assert list(t) == whole + whole
    owned = [f[3] for r in list(t) for f in r[2:] if f[3] is not None]
    assert all(type(b) is bytes for b in owned)


@FUZZ
@given(records=records_st, count=st.integers(0, 10))
def test_the_tables_members_are_the_keys_and_extensions_of_its_records(
    records: list[Any], count: int
) -> None:
    from asyncstream.shards._memberorder import _members

    head = records[:count]
    expected = ([r[0] for r in head], [tuple(f[0] for f in r[2:]) for r in head])
    assert table(records).members(count) == expected
    assert _members(table(records), min(count, len(records))) == expected
    assert _members(records, min(count, len(records))) == expected  # the Python walk's list
    with pytest.raises(ValueError, match="count must be >= 0"):
        table(records).members(-1)


@pytest.mark.parametrize(
    "record",
    [
        ("k",),
        ["k", 0],
        (b"k", 0),
        ("k", 0.0),
        ("k", 0, ("jpg", 0, 1)),
        ("k", 0, ("jpg", 0, 1, "owned")),
        ("k", 0, ("jpg", 0, 1, bytearray(b"x"))),
        ("k", 0, (b"jpg", 0, 1, None)),
        ("k", 0, ("jpg", 0.0, 1, None)),
        ("k", 0, ("jpg", 0, 1 << 70, None)),
        ("k", 1 << 70),
        ("k", 0, ["jpg", 0, 1, None]),
    ],
)
def test_a_record_spelled_otherwise_is_refused(record: Any) -> None:
    t = table([("a", 0, ("jpg", 0, 1, None))])
    with pytest.raises((TypeError, OverflowError)):
        t.append(record)
    with pytest.raises((TypeError, OverflowError)):
        t.extend([("b", 0), record])
    assert [r[0] for r in t] == ["a", "b"]  # what came before the refused one is kept
    with pytest.raises(TypeError):
        tarwalk().Records([])


@FUZZ
@given(records=records_st, data=st.binary(max_size=30), views=st.booleans())
def test_a_sample_is_the_dict_emit_builds(records: list[Any], data: bytes, views: bool) -> None:
    from asyncstream.stream._emit import sample_dict

    base = bytearray(data)
    view = memoryview(base)
    t = table(records)
    for i in range(-len(records), len(records)):
        native = t.sample(i, view, "s3://b/k.tar", views)
        python = sample_dict(records, i, view, "s3://b/k.tar", views)
        assert native == python
        assert list(native) == list(python)  # the same keys in the same order
        assert [type(v) for v in native.values()] == [type(v) for v in python.values()]
        assert all(v.obj is base for v in native.values() if isinstance(v, memoryview))
    with pytest.raises(IndexError):
        t.sample(len(records), view, "u")
    with pytest.raises(TypeError):
        t.sample(0, view)


def python_deliver(lanes: list[Any], indices: list[int], samples: list[int], sink: Any) -> Any:
    """``EpochRun.take``'s Python loop, as ``deliver``'s answer."""
    taken = 0
    for index, sample in zip(indices, samples, strict=True):
        records, view, url, first = lanes[index]
        taken += 1
        try:
            if not sink(view, url, records[sample - first]):
                return taken, False, None
        except Exception as exc:
            return taken, False, exc
    return taken, True, None


@FUZZ
@given(
    lanes=st.lists(st.tuples(records_st, st.integers(-2, 5)), min_size=1, max_size=4),
    draws=st.lists(st.tuples(st.integers(0, 3), st.integers(-12, 12)), max_size=20),
    stop_at=st.integers(0, 25),
    raise_at=st.integers(0, 25),
    as_tables=st.booleans(),
)
def test_deliver_hands_records_as_the_python_loop(
    lanes: list[Any],
    draws: list[tuple[int, int]],
    stop_at: int,
    raise_at: int,
    as_tables: bool,
) -> None:
    """Records or lists, a sink that stops or raises, draws out of range: the same calls,
    the same count and the same outcome (an index out of range is an IndexError)."""
    view = memoryview(b"0123456789")

    def run(deliver: Any, tables: bool) -> Any:
        calls: list[Any] = []

        def sink(v: memoryview, url: str, record: Any) -> bool:
            calls.append((v is view, url, record))
            if len(calls) == raise_at:
                raise KeyError("sink")
            return len(calls) != stop_at

        built = [
            (table(r) if tables else r, view, f"u{i}", first) for i, (r, first) in enumerate(lanes)
        ]
        indices = [i % len(lanes) for i, _ in draws]
        samples = [s for _, s in draws]
        taken, going, error = deliver(built, indices, samples, sink)
        if error is None or isinstance(error, IndexError):  # (the table's words differ)
            return calls, taken, going, error and IndexError
        return calls, taken, going, (type(error), str(error))

    expected = run(python_deliver, False)
    assert run(tarwalk().deliver, as_tables) == expected


def test_deliver_refuses_wrong_arguments() -> None:
    deliver = tarwalk().deliver
    with pytest.raises(TypeError):
        deliver((), [], [], print)
    with pytest.raises(ValueError, match="differ in length"):
        deliver([], [0], [], print)
    taken, going, error = deliver([], [0], [0], print)
    assert (taken, going, type(error)) == (0, False, IndexError)
    taken, going, error = deliver([("not a lane",)], [0], [0], print)
    assert (taken, going, type(error)) == (0, False, TypeError)


def python_dicts(lanes: list[Any], indices: list[int], samples: list[int], views: bool) -> Any:
    """``Emit.run``'s Python loop (``Emit._run``), as ``dicts``' answer: last first."""
    from asyncstream.stream._emit import sample_dict

    out = []
    for index, sample in zip(indices, samples, strict=True):
        records, view, url, first = lanes[index]
        out.append(sample_dict(records, sample - first, view, url, views))
    return out[::-1]


@FUZZ
@given(
    lanes=st.lists(st.tuples(records_st, st.integers(-2, 5)), min_size=1, max_size=4),
    draws=st.lists(st.tuples(st.integers(0, 3), st.integers(-12, 12)), max_size=20),
    views=st.booleans(),
    tables=st.lists(st.booleans(), min_size=4, max_size=4),
    data=st.binary(max_size=30),
)
def test_dicts_build_the_run_as_the_python_loop(
    lanes: list[Any],
    draws: list[tuple[int, int]],
    views: bool,
    tables: list[bool],
    data: bytes,
) -> None:
    """A run's dicts, native tables and lists (the fallback) mixed, draws out of range:
    the same dicts in the same order (last first), keys in the same order, memoryviews of
    the lane's view, or the same error (IndexError for a row out of range)."""
    from asyncstream.stream._emit import sample_dict

    base = bytearray(data)
    view = memoryview(base)
    python = [(r, view, f"u{i}", first) for i, (r, first) in enumerate(lanes)]
    native = [
        (table(r) if tables[i] else r, view, f"u{i}", first) for i, (r, first) in enumerate(lanes)
    ]
    indices = [i % len(lanes) for i, _ in draws]
    samples = [s for _, s in draws]
    try:
        expected = python_dicts(python, indices, samples, views)
    except IndexError:
        with pytest.raises(IndexError):
            tarwalk().dicts(native, indices, samples, views, sample_dict)
        return
    got = tarwalk().dicts(native, indices, samples, views, sample_dict)
    assert got == expected
    assert [list(d) for d in got] == [list(d) for d in expected]
    assert [[type(v) for v in d.values()] for d in got] == [
        [type(v) for v in d.values()] for d in expected
    ]
    assert all(v.obj is base for d in got for v in d.values() if isinstance(v, memoryview))


def test_dicts_refuse_wrong_arguments() -> None:
    from asyncstream.stream._emit import sample_dict

    dicts = tarwalk().dicts
    with pytest.raises(TypeError):
        dicts((), [], [], False, sample_dict)
    with pytest.raises(ValueError, match="differ in length"):
        dicts([], [0], [], False, sample_dict)
    with pytest.raises(IndexError):
        dicts([], [0], [0], False, sample_dict)
    with pytest.raises(TypeError):
        dicts([("not a lane",)], [0], [0], False, sample_dict)
    with pytest.raises(TypeError):
        dicts([], [], [], False)
    assert dicts([], [], [], False, sample_dict) == []


def test_a_table_refuses_to_grow_while_it_is_read() -> None:
    """Python code run in the middle of a read (a sink's fallback, an extension's hash)
    cannot move the table's arrays under the C code reading them: BufferError."""
    grown: list[Any] = []

    class Ext(str):
        def __hash__(self) -> int:
            try:
                t.extend([("b", 0)] * 1000)
            except BufferError as exc:
                grown.append(exc)
            return str.__hash__(self)

    t = tarwalk().Records()
    t.append(("a", 0, (Ext("jpg"), 0, 1, None)))  # its hash runs while the row is added
    assert grown
    assert len(t) == 1
    grown.clear()
    assert t.sample(0, memoryview(b"xy"), "u") == {"__key__": "a", "__url__": "u", "jpg": b"x"}
    assert grown
    other = tarwalk().Records()
    other.extend(t)  # the look-up in `other` runs the hash: neither table may grow
    assert (len(t), len(other)) == (1, 1)
    t.append(("b", 0))  # once read, it grows again
    assert len(t) == 2


@FUZZ
@given(
    data=st.binary(max_size=300_000),
    cuts=st.lists(st.integers(0, 300_000), max_size=6),
    extra=st.binary(min_size=1, max_size=3),
)
def test_a_member_gathers_its_parts_as_the_python_one(
    data: bytes, cuts: list[int], extra: bytes
) -> None:
    """``_tarwalk.Member`` (one copy into the bytes it hands out, large parts with the GIL
    released) against ``_tarfast.Member`` (parts joined): the same answers, the same
    bytes, the same refusals."""
    native, python = tarwalk().Member(len(data)), _tarfast.Member(len(data))
    bounds = [0, *sorted(c for c in cuts if c < len(data)), len(data)]
    for a, b in pairwise(bounds):
        part = memoryview(bytearray(data[a:b]))
        assert native.add(part) == python.add(part) == (b == len(data))
        assert native.missing == python.missing == len(data) - b
    for gathered in (native, python):
        with pytest.raises(ValueError, match="left"):
            gathered.add(extra)  # more than it has left
    assert native.take() == python.take() == data
    for gathered in (native, python):
        with pytest.raises(ValueError, match="taken"):
            gathered.take()
        with pytest.raises(ValueError, match="taken"):
            gathered.add(b"")


def test_a_member_is_handed_out_only_whole() -> None:
    for gathered in (tarwalk().Member(3), _tarfast.Member(3)):
        assert gathered.add(b"ab") is False
        with pytest.raises(ValueError, match="2 of its 3"):
            gathered.take()  # not yet whole: nothing can see bytes not yet written
        assert gathered.add(b"c") is True
        assert gathered.take() == b"abc"
    for make in (tarwalk().Member, _tarfast.Member):
        with pytest.raises(ValueError, match="-1"):
            make(-1)
    with pytest.raises(TypeError):
        tarwalk().Member(1).add("not bytes")


def test_a_member_holds_what_arrived_not_what_its_header_declared() -> None:
    """A header may declare a petabyte (as much as ``max_sample_bytes`` allows): the
    member allocates for the bytes that came, and grows as more do."""
    for gathered in (tarwalk().Member(10**15), _tarfast.Member(10**15)):
        tracemalloc.start()
        try:
            for _ in range(64):
                assert gathered.add(bytes(16 << 10)) is False
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert gathered.missing == 10**15 - (1 << 20)
        assert peak < 3 << 20  # 1 MiB in: at most twice that, and the part being added
