"""Tests of the incremental tar reader (:class:`asyncstream.shards._tar.ShardReader`)."""

from __future__ import annotations

import io
import random
import tarfile
import tracemalloc
from collections.abc import Sequence
from itertools import pairwise
from typing import Any

import pytest
from _wds import wds_member
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from asyncstream._exceptions import CorruptTarError, DataError
from asyncstream.shards import _tarfast
from asyncstream.shards._compressed import count_samples
from asyncstream.shards._limits import ReadLimits
from asyncstream.shards._members import sample_member
from asyncstream.shards._tar import Sample, ShardReader

URL = "s3://bucket/shards/train-000007.tar"
FORMATS = [tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT]
FORMAT_IDS = ["ustar", "gnu", "pax"]

Plain = tuple[str, dict[str, bytes], int]


# --------------------------------------------------------------------------- helpers


def _blob(n: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(n)


def _file(name: str, data: bytes, kind: bytes = tarfile.REGTYPE) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size, info.type = len(data), kind
    return info, data


def _special(name: str, kind: bytes, link: str = "") -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, link
    return info, None


def rich_entries(fmt: int) -> list[tuple[tarfile.TarInfo, bytes | None]]:
    """Members covering what tarfile writes: dirs, links, long and non-ASCII names, ..."""
    long_link = "target/" + "l" * 150 if fmt != tarfile.USTAR_FORMAT else "target"
    long_dir = "train/" + "d" * 90 + "/" + "n" * 80  # USTAR stores it with a prefix
    entries = [
        _special("train/", tarfile.DIRTYPE),
        _file("train/000.jpg", _blob(300, 1)),
        _file("train/000.cls", b"7"),
        _file("train/000.seg.png", _blob(700, 2)),
        _special("train/sub", tarfile.DIRTYPE),
        _file("train/001.txt", b""),
        _file("train/001.json", b'{"a": 1}'),
        _special("train/link.jpg", tarfile.SYMTYPE, long_link),
        _file("train/002.jpg", _blob(2000, 3)),
        _file("train/002.cls", b"12", tarfile.CONTTYPE),
        _special("train/fifo", tarfile.FIFOTYPE),
        _special("train/hard.jpg", tarfile.LNKTYPE, "train/000.jpg"),
        _file(long_dir + ".jpg", _blob(100, 4)),
        _file(long_dir + ".cls", b"3"),
        _file("train/ünïcødé-ß.jpg", _blob(50, 5)),
        _file("train/ünïcødé-ß.cls", b"4"),
        _file("train/000.jpg", _blob(10, 6)),  # the key again, not consecutive: a new sample
        _file("train/003.bin", _blob(513, 7), tarfile.AREGTYPE),
        _file("noext", b"plain"),
        _file("train/004.a", b""),
        _file("train/004.b", b""),
    ]
    if fmt != tarfile.USTAR_FORMAT:
        entries[5:5] = [_file("k" * 120 + ".seg.png", b"x" * 5), _file("k" * 120 + ".jpg", b"y")]
    return entries


def make_tar(
    entries: Sequence[tuple[tarfile.TarInfo, bytes | None]],
    fmt: int = tarfile.USTAR_FORMAT,
    **kwargs: Any,
) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt, **kwargs) as archive:
        for info, data in entries:
            archive.addfile(info, None if data is None else io.BytesIO(data))
    return buf.getvalue()


def files(*names_and_data: tuple[str, bytes], fmt: int = tarfile.USTAR_FORMAT) -> bytes:
    return make_tar([_file(name, data) for name, data in names_and_data], fmt)


def reference(tar: bytes) -> list[Plain]:
    """The samples by tarfile: regular files grouped by consecutive key, named as
    webdataset names them."""
    out: list[Plain] = []
    with tarfile.open(fileobj=io.BytesIO(tar), mode="r:") as archive:
        for member in archive:
            named = wds_member(member.name) if member.isfile() else None
            if named is None:
                continue
            key, ext = named
            reader = archive.extractfile(member)
            assert reader is not None
            if out and out[-1][0] == key:
                out[-1][1][ext] = reader.read()
            else:
                out.append((key, {ext: reader.read()}, member.offset))
    return out


def header_offsets(tar: bytes) -> list[int]:
    with tarfile.open(fileobj=io.BytesIO(tar), mode="r:") as archive:
        return [member.offset for member in archive]


def fix_checksum(buf: bytearray, at: int) -> None:
    block = bytearray(buf[at : at + 512])
    block[148:156] = b" " * 8
    buf[at + 148 : at + 156] = b"%06o\0 " % sum(block)


def _plain(sample: Sample, offset: int, slot: bytearray) -> Plain:
    values = list(sample.fields.values())
    if sample.offset >= offset:  # began in this range: zero copy
        assert all(isinstance(v, memoryview) and v.obj is slot for v in values), sample
    else:  # carried from an earlier range: owned copies
        assert all(type(v) is bytes for v in values), sample
    return sample.key, {ext: bytes(v) for ext, v in sample.fields.items()}, sample.offset


def feed_one(reader: ShardReader, piece: bytes, offset: int, final: bool) -> list[Plain]:
    """Feed one range from a fresh slot, then check the reader kept nothing of it."""
    slot = bytearray(piece)
    view = memoryview(slot)
    samples = reader.feed(view, offset, final=final)
    result = [_plain(sample, offset, slot) for sample in samples]
    del samples
    view.release()
    slot.clear()  # BufferError if anything still points into the slot
    return result


def feed_cuts(tar: bytes, cuts: Sequence[int], start: int = 0) -> list[Plain]:
    reader = ShardReader(URL, len(tar), start)
    out: list[Plain] = []
    for a, b in pairwise([start, *cuts, len(tar)]):
        out += feed_one(reader, tar[a:b], a, b == len(tar))
    assert reader.done
    return out


def feed_chunked(tar: bytes, chunk: int, start: int = 0) -> list[Plain]:
    return feed_cuts(tar, range(start + chunk, len(tar), chunk), start)


RICH = {fmt: make_tar(rich_entries(fmt), fmt) for fmt in FORMATS}
RICH[tarfile.PAX_FORMAT] = make_tar(
    rich_entries(tarfile.PAX_FORMAT), tarfile.PAX_FORMAT, pax_headers={"comment": "global"}
)


# --------------------------------------------------------------------------- valid shards


def test_member_names_as_webdataset() -> None:
    assert sample_member("a/b/000017.seg.PNG") == ("a/b/000017", "seg.png")
    assert sample_member("n01440764_10026.JPEG") == ("n01440764_10026", "jpeg")
    assert sample_member("a//b.Jpg") == ("a//b", "jpg")
    assert sample_member("./000017.jpg") == ("./000017", "jpg")
    for skipped in ("a.b/c", "README", "001", ".jpg", "__meta__", "__x__/y.jpg", "a.b/.jpg"):
        assert sample_member(skipped) is None, skipped
        assert wds_member(skipped) is None, skipped
    assert sample_member("a/.jpg") == wds_member("a/.jpg") == ("a/", "jpg")
    assert sample_member("x\n/.jpg") == wds_member("x\n/.jpg")


@settings(max_examples=500, derandomize=True, database=None, deadline=None)
@given(st.text(alphabet="ab._/_\n\udcffJ", max_size=12))
def test_member_names_match_webdataset_on_any_name(name: str) -> None:
    assert sample_member(name) == wds_member(name)


@pytest.mark.parametrize("fmt", FORMATS, ids=FORMAT_IDS)
def test_whole_shard_matches_tarfile(fmt: int) -> None:
    tar = RICH[fmt]
    expected = reference(tar)
    assert len(expected) >= 8  # "noext" is no member: webdataset leaves it out
    assert any(len(k) > 100 for k, _, _ in expected)
    assert any("ü" in k for k, _, _ in expected)
    assert feed_cuts(tar, []) == expected


@pytest.mark.parametrize("fmt", FORMATS, ids=FORMAT_IDS)
def test_every_chunk_size_matches_tarfile(fmt: int) -> None:
    tar = RICH[fmt]
    expected = reference(tar)
    for chunk in range(1, 701):
        assert feed_chunked(tar, chunk) == expected, chunk


@pytest.mark.parametrize("fmt", FORMATS, ids=FORMAT_IDS)
def test_random_splits_match_tarfile(fmt: int) -> None:
    tar = RICH[fmt]
    expected = reference(tar)
    rng = random.Random(fmt)
    for _ in range(50):
        cuts = sorted(rng.sample(range(1, len(tar)), rng.randint(1, 30)))
        assert feed_cuts(tar, cuts) == expected, cuts


def test_zero_copy_in_one_range_and_bytes_when_carried() -> None:
    tar = files(("a.jpg", b"A" * 600), ("a.cls", b"1"), ("b.jpg", b"B" * 10), ("c.jpg", b"C"))
    buf = bytes(tar)
    samples = ShardReader(URL, len(buf)).feed(memoryview(buf), 0, final=True)
    assert [s.key for s in samples] == ["a", "b", "c"]
    for sample in samples:
        assert all(isinstance(v, memoryview) and v.obj is buf for v in sample.fields.values())
    # "a" spans the first range, so it is carried and returned as bytes with the next one.
    reader = ShardReader(URL, len(tar))
    assert reader.feed(memoryview(tar)[:1024], 0) == []
    assert reader.pending_offset == 0
    rest = reader.feed(memoryview(tar)[1024:], 1024, final=True)
    assert [type(v) for v in rest[0].fields.values()] == [bytes, bytes]
    assert rest[0].fields == {"jpg": b"A" * 600, "cls": b"1"}
    assert all(isinstance(v, memoryview) for s in rest[1:] for v in s.fields.values())


@pytest.mark.parametrize("native", [True, False], ids=["native", "python"])
def test_a_member_cut_by_ranges_is_read_once_and_gathered_as_its_bytes(native: bool) -> None:
    """A range's end cuts a member: its header is read once, by the walk, and its bytes
    are gathered as the ranges bring them (several ranges for a large member), the field
    of its sample, ``bytes``, once the last one is in; the walk goes on after it in the
    range that completes it."""
    big = bytes(range(256)) * 40  # 10,240 bytes: four ranges of 3 KiB hold parts of it
    tar = files(("a.cls", b"7"), ("a.jpg", big), ("a.txt", b"t"), ("b.jpg", b"B" * 10))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_tarfast, "NATIVE", native and _tarfast._NATIVE_WALK is not None)
        reader = ShardReader(URL, len(tar))
        out = []
        for offset in range(0, len(tar), 3072):
            slot = bytearray(tar[offset : offset + 3072])
            got = reader.feed(memoryview(slot), offset, final=offset + 3072 >= len(tar))
            out += [
                (s.key, {k: bytes(v) for k, v in s.fields.items()}, type(s.fields["jpg"]))
                for s in got
            ]
            del got
            if offset + 3072 < 512 * 3 + len(big):  # a's jpg not complete yet
                assert reader.pending_offset == 0  # resumable from a's first header
            slot.extend(b"resized")  # the reader kept no view of the range
    assert [(key, fields) for key, fields, _ in out] == [
        ("a", {"cls": b"7", "jpg": big, "txt": b"t"}),
        ("b", {"jpg": b"B" * 10}),
    ]
    assert out[0][2] is bytes  # gathered, not a view of a range
    # a.jpg, over four ranges, and a.txt, whose header ends the fourth: each member a
    # range's end cuts, named by the walk (the ranges are whole blocks, as the ring's are:
    # no header is cut), none read by the general parser
    assert reader.general_members == 0


def test_sample_completed_by_next_header_is_returned_without_copy() -> None:
    tar = files(("a.jpg", b"A"), ("b.jpg", b"B" * 5000))
    reader = ShardReader(URL, len(tar))
    slot = bytearray(tar[:2048])  # a's header+data and b's header, not b's data
    (sample,) = reader.feed(memoryview(slot), 0)
    assert isinstance(sample.fields["jpg"], memoryview)
    assert sample.fields["jpg"].obj is slot
    assert reader.pending_offset == 1024


def test_reader_holds_no_reference_into_fed_data() -> None:
    tar = RICH[tarfile.PAX_FORMAT]
    reader = ShardReader(URL, len(tar))
    for offset in range(0, len(tar), 1500):
        slot = bytearray(tar[offset : offset + 1500])
        view = memoryview(slot)
        reader.feed(view, offset, final=offset + 1500 >= len(tar))  # samples dropped at once
        view.release()
        slot.extend(b"resized")  # would raise BufferError if the reader kept a view


@pytest.mark.parametrize("fmt", FORMATS, ids=FORMAT_IDS)
@pytest.mark.parametrize("chunk", [512, 700, 1000, 4096])
def test_resume_from_pending_offset(fmt: int, chunk: int) -> None:
    tar = RICH[fmt]
    expected = reference(tar)
    reader = ShardReader(URL, len(tar))
    returned = 0
    for offset in range(0, len(tar), chunk):
        piece = tar[offset : offset + chunk]
        returned += len(feed_one(reader, piece, offset, offset + len(piece) == len(tar)))
        if reader.done:
            break
        start = reader.pending_offset
        assert start % 512 == 0
        assert feed_chunked(tar, 777, start) == expected[returned:], (offset, start)


def test_unknown_entry_types_are_skipped_with_their_data() -> None:
    tar = bytearray(files(("dump", _blob(3000, 8)), ("a.jpg", b"A"), ("b.jpg", b"B")))
    tar[156] = ord("D")  # GNU dumpdir: not a member, but its data follow the header
    fix_checksum(tar, 0)
    shard = bytes(tar)
    expected = reference(shard)
    assert [k for k, _, _ in expected] == ["a", "b"]
    for chunk in (100, 600, 1000, 1536):
        reader = ShardReader(URL, len(shard))
        returned = 0
        for offset in range(0, len(shard), chunk):
            piece = shard[offset : offset + chunk]
            returned += len(feed_one(reader, piece, offset, offset + len(piece) == len(shard)))
            start = reader.pending_offset
            assert start <= offset + len(piece)  # never ahead of what was fed
            if not reader.done:
                assert feed_chunked(shard, 700, start) == expected[returned:]


def test_pending_offset_names_first_extended_header() -> None:
    tar = files(("a.jpg", b"A"), ("x" * 150 + ".jpg", b"B"), fmt=tarfile.GNU_FORMAT)
    reader = ShardReader(URL, len(tar))
    (first,) = reader.feed(memoryview(tar)[:2560], 0)  # L header, its data, the real header
    assert first.key == "a"
    assert reader.pending_offset == 1024  # the L header, not the member's own header
    rest = ShardReader(URL, len(tar), 1024).feed(memoryview(tar)[1024:], 1024, final=True)
    assert [(s.key, s.offset) for s in rest] == [("x" * 150, 1024)]


def test_end_marker_and_trailing_garbage() -> None:
    tar = files(("a.jpg", b"A"), ("b.jpg", b"B"))
    expected = reference(tar)
    body = tar[:2048]  # two members, no end marker
    garbage = b"\xde\xad" * 700
    for shard in (tar, tar + garbage, body + bytes(512) + garbage, body + bytes(1024)):
        assert feed_cuts(shard, []) == expected
        assert feed_chunked(shard, 100) == expected
    with pytest.raises(CorruptTarError, match="end-of-archive marker") as error:
        feed_cuts(body, [])  # cut short: tests/test_security_shards.py has the rest
    assert error.value.offset == 2048
    reader = ShardReader(URL, len(tar) + len(garbage))
    assert len(reader.feed(memoryview(tar)[:3000], 0)) == 2
    assert reader.done
    assert reader.feed(memoryview(tar)[3000:], 3000) == []
    assert reader.feed(memoryview(garbage), len(tar), final=True) == []


def test_empty_shard_and_empty_archive() -> None:
    with pytest.raises(CorruptTarError, match="end-of-archive marker"):
        ShardReader(URL, 0).feed(b"", 0, final=True)  # no tar writer makes 0 bytes
    empty = make_tar([])
    assert feed_cuts(empty, []) == [] == reference(empty)


def test_signed_checksum_and_base256_size_are_accepted() -> None:
    tar = bytearray(files(("a.jpg", b"A" * 20), ("b.jpg", b"B")))
    tar[265:270] = b"\xe9" * 5  # uname with bytes >= 128
    tar[124:136] = b"\x80" + (20).to_bytes(11, "big")  # GNU base-256 size
    block = tar[:148] + b" " * 8 + tar[156:512]
    tar[148:156] = b"%06o\0 " % sum(b - 256 if b >= 128 else b for b in block)
    assert feed_cuts(bytes(tar), []) == reference(bytes(tar))
    assert feed_cuts(bytes(tar), [])[0] == ("a", {"jpg": b"A" * 20}, 0)


def test_other_octal_spellings() -> None:
    tar = bytearray(files(("a.jpg", b"A" * 9)))
    tar[124:136] = b"        11  "  # space padded, no NUL
    tar[148:156] = b"%7o " % (sum(tar[:148]) + 8 * 32 + sum(tar[156:512]))
    assert feed_cuts(bytes(tar), []) == [("a", {"jpg": b"A" * 9}, 0)] == reference(bytes(tar))


# --------------------------------------------------------------------------- errors


def corrupt(tar: bytes, cuts: Sequence[int] = ()) -> CorruptTarError:
    with pytest.raises(CorruptTarError) as info:
        feed_cuts(tar, cuts)
    error = info.value
    assert isinstance(error, DataError)
    assert error.url == URL
    assert URL in str(error)
    assert f"byte {error.offset}" in str(error)
    return error


NAMES = [(f"s/{i:03d}.jpg", _blob(i * 100, i)) for i in range(6)]


@pytest.mark.parametrize("chunk", [None, 1, 100, 512, 1000])
def test_checksum_mismatch_names_the_header(chunk: int | None) -> None:
    tar = files(*NAMES)
    third = header_offsets(tar)[2]
    bad = bytearray(tar)
    bad[third + 5] ^= 1
    cuts = [] if chunk is None else range(chunk, len(bad), chunk)
    error = corrupt(bytes(bad), cuts)
    assert error.offset == third
    assert "checksum" in str(error)
    bad = bytearray(tar)
    bad[third + 148 : third + 156] = b"zzzzzz\0 "
    assert corrupt(bytes(bad)).offset == third


def _set_size(tar: bytes, index: int, field: bytes) -> tuple[bytes, int]:
    at = header_offsets(tar)[index]
    bad = bytearray(tar)
    bad[at + 124 : at + 136] = field
    fix_checksum(bad, at)
    return bytes(bad), at


@pytest.mark.parametrize(
    "field",
    [
        b"0000000001x\0",  # not octal
        b"00000000019\0",  # 9 is not an octal digit
        b"-0000000001\0",
        b"777777777777",  # 64 GiB in twelve digits, no NUL
        b"\x80" + (10**15).to_bytes(11, "big"),  # base-256, huge
        b"\x80" + b"\xff" * 11,
        b"\xff" * 12,  # base-256 negative
        b"\xff" + (5).to_bytes(11, "big"),
        b"\x81" + bytes(11),  # neither 0x80 nor 0xff
    ],
)
def test_bad_or_hostile_size_field(field: bytes) -> None:
    bad, at = _set_size(files(*NAMES), 3, field)
    tracemalloc.start()
    try:
        error = corrupt(bad)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert error.offset == at
    assert peak < 1 << 20


def test_huge_declared_size_in_a_huge_shard_allocates_only_what_arrives() -> None:
    bad, _ = _set_size(files(*NAMES), 0, b"\x80" + (10**15).to_bytes(11, "big"))
    reader = ShardReader(URL, 10**16, limits=ReadLimits(max_sample_bytes=1 << 62))
    tracemalloc.start()
    try:
        for offset in range(0, 64 * 1024, 4096):
            piece = (bad + bytes(64 * 1024))[offset : offset + 4096]
            assert reader.feed(memoryview(piece), offset) == []
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20
    assert reader.pending_offset == 0


def test_pax_size_overrides_the_header() -> None:
    info, data = _file("a.jpg", b"A" * 700)
    info.pax_headers = {"size": "700"}
    tar = make_tar([(info, data), _file("b.jpg", b"B")], tarfile.PAX_FORMAT)
    assert b"12 size=700\n" in tar[512:1024]  # x header at 0, its records, a.jpg at 1024
    bad = bytearray(tar)
    bad[1024 + 124 : 1024 + 136] = b"00000000000\0"
    fix_checksum(bad, 1024)
    assert feed_cuts(bytes(bad), []) == reference(tar) == reference(bytes(bad))
    assert feed_cuts(bytes(bad), [])[0] == ("a", {"jpg": b"A" * 700}, 0)
    assert corrupt(tar.replace(b"12 size=700\n", b"12 size=1e3\n")).offset == 0
    info.pax_headers = {"size": str(10**15)}
    error = corrupt(make_tar([(info, data)], tarfile.PAX_FORMAT))
    assert error.offset == 1024  # the member's own header
    info.pax_headers = {"size": "9" * 30}
    assert corrupt(make_tar([(info, data)], tarfile.PAX_FORMAT)).offset == 0


@pytest.mark.parametrize("cut", [100, 700, 1000, 1100, 1536, 2000])
def test_truncated_shard(cut: int) -> None:
    tar = files(("a.jpg", b"A" * 100), ("b.jpg", b"B" * 1000))  # headers at 0 and 1024
    error = corrupt(tar[:cut])
    assert error.offset == (0 if cut < 1024 else 1024)


def test_member_past_the_end_is_reported_when_its_header_arrives() -> None:
    tar = files(("a.jpg", b"A"), ("b.jpg", b"B" * 1000))
    reader = ShardReader(URL, 2000)
    assert reader.feed(memoryview(tar)[:1100], 0) == []
    with pytest.raises(CorruptTarError) as error:
        reader.feed(memoryview(tar)[1100:1600], 1100)  # not final yet
    assert error.value.offset == 1024
    with pytest.raises(CorruptTarError, match="end-of-archive marker") as cut:
        feed_cuts(tar[:1024], [])  # ends at a member boundary: cut short
    assert cut.value.offset == 1024


def test_duplicate_field() -> None:
    tar = files(("a.jpg", b"1"), ("b.jpg", b"2"), ("b.cls", b"3"), ("b.jpg", b"4"))
    error = corrupt(tar)
    assert "duplicate field" in str(error)
    assert error.offset == header_offsets(tar)[3]


def test_name_not_utf8_reads_with_surrogate_escapes_as_webdataset() -> None:
    tar = make_tar([_file("ok.jpg", b"1"), _file("\xff\xfe.JPG", b"2")], encoding="latin-1")
    assert feed_cuts(tar, []) == reference(tar)
    assert [k for k, _, _ in feed_cuts(tar, [])] == ["ok", "\udcff\udcfe"]
    pax = make_tar([_file("ok.jpg", b"1"), _file("\udcff.jpg", b"2")], tarfile.PAX_FORMAT)
    assert [k for k, _, _ in feed_cuts(pax, [])] == ["ok", "\udcff"]
    assert feed_cuts(pax, []) == reference(pax)


def test_malformed_pax_records() -> None:
    info, data = _file("ü.jpg", b"1")
    tar = make_tar([_file("a.jpg", b"0"), (info, data)], tarfile.PAX_FORMAT)
    good = b"path=\xc3\xbc.jpg\n"
    record = b"%d " % (len(good) + 3) + good
    assert record in tar
    for broken in (b"xx " + good, b"99 " + good, b"%d " % (len(good) + 2) + good):
        error = corrupt(tar.replace(record, broken[: len(record)].ljust(len(record), b"\n")))
        assert error.offset == 1024
        assert "PAX" in str(error)


def test_oversized_extended_headers() -> None:
    info, data = _file("a.jpg", b"1")
    info.pax_headers = {"comment": "c" * (1 << 20)}
    error = corrupt(make_tar([_file("z.jpg", b"0"), (info, data)], tarfile.PAX_FORMAT))
    assert error.offset == 1024
    assert "1 MiB" in str(error)
    error = corrupt(make_tar([_file("n" * (1 << 20) + ".jpg", b"1")], tarfile.GNU_FORMAT))
    assert error.offset == 0


def test_extended_header_without_member() -> None:
    tar = make_tar([_file("x" * 150 + ".jpg", b"1")], tarfile.GNU_FORMAT)
    # keep the L header and its data, then the end marker
    error = corrupt(tar[:1024] + bytes(1024))
    assert error.offset == 1024


def test_error_is_sticky() -> None:
    bad = bytearray(files(*NAMES))
    bad[5] ^= 1
    reader = ShardReader(URL, len(bad))
    with pytest.raises(CorruptTarError):
        reader.feed(memoryview(bad)[:600], 0)
    with pytest.raises(CorruptTarError):
        reader.feed(memoryview(bad)[600:], 600, final=True)


def test_error_holds_no_reference_into_fed_data() -> None:
    fifth = header_offsets(files(*NAMES))[4]
    bad = bytearray(files(*NAMES))
    bad[fifth + 5] ^= 1  # samples 0..3 come out of the same range first
    slot = bytearray(bad)
    view = memoryview(slot)
    reader = ShardReader(URL, len(slot))
    with pytest.raises(CorruptTarError) as info:
        reader.feed(view, 0, final=True)
    view.release()
    slot.clear()  # BufferError if the error (its traceback) or the reader kept a view
    assert info.value.offset == fifth


def test_range_mistakes_are_value_errors() -> None:
    tar = files(("a.jpg", b"1"))
    reader = ShardReader(URL, len(tar))
    with pytest.raises(ValueError, match="does not follow"):
        reader.feed(memoryview(tar)[:100], 1)
    with pytest.raises(ValueError, match="final"):
        reader.feed(memoryview(tar)[:100], 0, final=True)
    with pytest.raises(ValueError, match="does not follow"):
        reader.feed(tar + b"x", 0)
    reader.feed(memoryview(tar)[:100], 0)
    with pytest.raises(ValueError, match="does not follow"):
        reader.feed(memoryview(tar)[:100], 0)
    for start in (-512, 100, len(tar) + 512):
        with pytest.raises(ValueError, match="bad start"):
            ShardReader(URL, len(tar), start)


# --------------------------------------------------------------------------- fuzzing

BASES = list(RICH.values())


def feed_leniently(tar: bytes, chunks: Sequence[int]) -> None:
    """Feed ``tar`` in ``chunks``; only samples or a well-formed DataError may come out."""
    reader = ShardReader(URL, len(tar))
    offset, i = 0, 0
    error: CorruptTarError | None = None
    try:
        while True:
            piece = tar[offset : offset + chunks[i % len(chunks)]]
            i += 1
            final = offset + len(piece) == len(tar)
            for sample in reader.feed(memoryview(piece), offset, final=final):
                assert isinstance(sample.key, str)
                assert sample.offset % 512 == 0
                assert 0 <= sample.offset < len(tar)
                assert sample.fields
                assert all(isinstance(v, memoryview | bytes) for v in sample.fields.values())
            offset += len(piece)
            if final:
                assert reader.done
                return
    except CorruptTarError as exc:
        error = exc
    assert error is not None
    assert error.url == URL
    assert 0 <= error.offset <= len(tar)
    assert f"byte {error.offset}" in str(error)


FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
chunk_lists = st.lists(st.integers(1, 3000), min_size=1, max_size=6)


@FUZZ
@given(data=st.binary(max_size=3000), chunks=chunk_lists)
def test_fuzz_random_bytes(data: bytes, chunks: list[int]) -> None:
    feed_leniently(data, chunks)


@FUZZ
@given(
    blocks=st.lists(st.binary(min_size=512, max_size=512), min_size=1, max_size=6),
    flags=st.lists(st.sampled_from(b"0257LKxg\0S"), min_size=6, max_size=6),
    chunks=chunk_lists,
)
def test_fuzz_random_headers_with_valid_checksums(
    blocks: list[bytes], flags: list[int], chunks: list[int]
) -> None:
    buf = bytearray(b"".join(blocks))
    for n in range(len(blocks)):
        buf[n * 512 + 156] = flags[n]
        fix_checksum(buf, n * 512)
    feed_leniently(bytes(buf), chunks)


@FUZZ
@given(
    base=st.sampled_from(range(len(BASES))),
    flips=st.lists(st.tuples(st.integers(0, 1 << 20), st.integers(0, 255)), max_size=4),
    fix=st.booleans(),
    cut=st.none() | st.integers(0, 1 << 20),
    chunks=chunk_lists,
)
def test_fuzz_mutated_tars(
    base: int, flips: list[tuple[int, int]], fix: bool, cut: int | None, chunks: list[int]
) -> None:
    tar = bytearray(BASES[base])
    if cut is not None:
        del tar[cut % (len(tar) + 1) :]
    for where, value in flips:
        if tar:
            at = where % len(tar)
            tar[at] = value
            if fix and at - at % 512 + 512 <= len(tar):
                fix_checksum(tar, at - at % 512)
    feed_leniently(bytes(tar), chunks)


@settings(max_examples=60, deadline=None)
@given(base=st.sampled_from(range(len(BASES))), seed=st.integers(0, 2**32))
def test_fuzz_valid_tars_in_random_chunks(base: int, seed: int) -> None:
    tar = BASES[base]
    rng = random.Random(seed)
    cuts = sorted(rng.sample(range(1, len(tar)), rng.randint(0, 40)))
    assert feed_cuts(tar, cuts) == reference(tar)


# --------------------------------------------------------------------------- count_samples


def test_count_samples() -> None:
    tar = RICH[tarfile.GNU_FORMAT]
    assert count_samples(io.BytesIO(tar), URL, len(tar)) == len(reference(tar))
    assert count_samples(io.BytesIO(tar), URL, len(tar), block=700) == len(reference(tar))
    with pytest.raises(CorruptTarError) as error:
        count_samples(io.BytesIO(b"not a tar at all" * 80), URL, 1280)
    assert error.value.url == URL
    with pytest.raises(CorruptTarError, match="ended after 1024 of"):
        count_samples(io.BytesIO(tar[:1024]), URL, len(tar), block=512)
