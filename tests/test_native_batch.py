"""The native batch sink (``dali_ops/_batchc.c``) against the Python one it replaces.

``BatchBuilder._add_record`` (with ``_accept``, ``_append`` and ``check_image``) is the
reference: every generated run of records (random member sets, in the view or owned;
labels of digits, too many digits, blanks, signs, non-ASCII digits; images with and
without their signature and end-of-image marker, truncated, empty; records spelled
wrong) is handed to both, into the feed thread's images and into a worker's shared buffer
(buffers made tiny so that they grow), at every precheck level and both ``on_error``;
both must return the same, raise the same, and leave the same batch: keys, URLs, labels,
image bytes and spans, json members, skips, error and message. The number of examples is
bounded (``ASYNCSTREAM_FUZZ_EXAMPLES``, 150 by default) and derandomized, so ``make
sanitize`` runs them under AddressSanitizer in bounded time.
"""

from __future__ import annotations

import io
import itertools
import json
import re
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from PIL import Image

from asyncstream.shards import _tarfast
from dali_ops import _batch, _shm
from dali_ops._batch import BatchBuilder, EncodedBatch
from dali_ops._checks import check_image
from dali_ops._shm import BatchBuffer, BufferPool
from tests._fuzz import FUZZ

pytestmark = pytest.mark.timeout(600)


def native() -> Any:
    assert _batch._NATIVE is not None, "run `make install` (or setup.py build_ext)"
    return _batch._NATIVE


def encoded(kind: str, seed: int) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 255, (6, 6, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format=kind)
    return out.getvalue()


JPEG, PNG, WEBP, BMP = (encoded(k, 1) for k in ("JPEG", "PNG", "WEBP", "BMP"))
SIGNATURES = [
    b"\xff\xd8\xff",
    b"\x89PNG\r\n\x1a\n",
    b"II*\x00",
    b"MM\x00*",
    b"BM",
    b"\x00\x00\x00\x0cjP  \r\n\x87\n",
    b"\xff\x4f\xff\x51",
    b"P1",
    b"P6",
    b"P7",
    b"RIFF\0\0\0\0WEBP",
    b"RIFF\0\0\0\0WEBX",
]

images = st.one_of(
    st.sampled_from([JPEG, PNG, WEBP, BMP, b"", b"\xff\xd8\xff\xd9", b"\xff\xd8\xff"]),
    st.builds(lambda n: JPEG[:n], st.integers(0, len(JPEG))),  # truncated
    st.builds(lambda n: JPEG + b"\0" * n, st.integers(60, 66)),  # its end marker far
    st.builds(lambda n: PNG[:n], st.integers(0, len(PNG))),
    st.builds(lambda head, rest: head + rest, st.sampled_from(SIGNATURES), st.binary(max_size=80)),
    st.binary(max_size=100),
)
labels = st.one_of(
    st.from_regex(rb"\A[0-9]{1,20}\Z"),
    st.sampled_from(
        [
            b"",
            b" 5\n",
            b"-3",
            b"+4",
            b"1_000",
            b"cat",
            "\u0663".encode(),
            b"0x1",
            b"9" * 19,
            b"1/2",
            b"3:",
            b"/",
        ]
    ),
    st.binary(max_size=6),
)
metas = st.one_of(
    st.builds(lambda s: json.dumps({"source": s}).encode(), st.text(max_size=8)),
    st.sampled_from([b"", b"{", b"[1]", b'{"source": 3}', b"\xff"]),
)
EXTS = ["jpg", "jpeg", "png", "cls", "json", "txt", "JPG", "webp", "j\u00e9"]


@st.composite
def member(draw: st.DrawFn) -> tuple[str, bytes]:
    ext = draw(st.sampled_from(EXTS))
    if ext in ("cls", "txt"):
        return ext, draw(labels)
    if ext == "json":
        return ext, draw(metas)
    return ext, draw(st.one_of(images, labels) if ext == "png" else images)


@st.composite
def runs(draw: st.DrawFn) -> tuple[bytes, list[tuple[str, Any]]]:
    """A view's bytes and the records of several samples in it, some spelled wrong."""
    view = bytearray(draw(st.binary(max_size=8)))
    records: list[tuple[str, Any]] = []
    for i in range(draw(st.integers(1, 6))):
        fields: list[Any] = []
        for ext, data in draw(st.lists(member(), max_size=5)):
            if draw(st.integers(0, 4)) == 0:
                fields.append((ext, 0, 0, data))  # owned: not in the view
            else:
                fields.append((ext, len(view), len(view) + len(data), None))
                view += data
            view += draw(st.binary(max_size=3))
        if draw(st.integers(0, 9)) == 0 and fields:  # a field spelled wrong
            at = draw(st.integers(0, len(fields) - 1))
            ext, start, stop, owned = fields[at]
            fields[at] = draw(
                st.sampled_from(
                    [
                        (ext, start, stop + 10_000, owned),
                        (ext, -1, stop, None),
                        (ext, stop, start, None),
                        (ext, float(start), stop, None),
                        (ext, start, stop, bytearray(b"\xff\xd8\xff\xd9")),
                        (ext, start, stop, "12"),
                        (ext.encode(), start, stop, owned),
                        [ext, start, stop, owned],
                        (ext, start, stop),
                    ]
                )
            )
        url = draw(st.sampled_from(["file:///a.tar", "s3://b/c.tar"]))
        records.append((url, (f"k{i}", 512 * i, *fields)))
    return bytes(view), records


@pytest.fixture(scope="module")
def pools() -> Iterator[dict[bool, tuple[BufferPool, BufferPool]]]:
    """Two shared pools (a worker's) and two of the process's own (the feed thread's)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_shm, "_GRAIN", 64)  # tiny buffers: batches outgrow them
        yield {
            shared: (BufferPool(shared=shared), BufferPool(shared=shared))
            for shared in (True, False)
        }


def unaddressed(text: str) -> str:
    """A message without the object addresses Pillow's name (``<_io.BytesIO object at
    0x7f...>``), which differ from one call to the next."""
    return re.sub(r" at 0x[0-9a-f]+>", " at 0x...>", text)


def outcome(call: Callable[[], Any]) -> Any:
    try:
        return ("returned", call())
    except Exception as exc:
        return ("raised", type(exc), unaddressed(str(exc)))


def build(
    builder: BatchBuilder,
    view: bytes,
    records: list[tuple[str, Any]],
    use_native: bool,
    pool: BufferPool,
) -> dict[str, Any]:
    """Hand the records to one sink as ``take`` does (until it says stop); the batch."""
    batch = EncodedBatch(placed=BatchBuffer(pool))
    calls = []
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(_batch, "NATIVE", use_native)
            sink = builder._sink(batch)
        if use_native:
            assert isinstance(sink, native().Sink)
        for url, record in records:
            calls.append(outcome(lambda: sink(memoryview(view), url, record)))  # noqa: B023
            if calls[-1] != ("returned", True):
                break
        return collect(batch, calls)
    finally:
        if batch.placed is not None:
            batch.placed.free()


def collect(batch: EncodedBatch, calls: list[Any]) -> dict[str, Any]:
    """What the sink's calls made of ``batch``."""
    assert batch.placed is not None
    assert isinstance(batch.spans, list)  # flat while built: no tuple per image
    spans = [tuple(p) for p in np.asarray(batch.spans, dtype=np.int64).reshape(-1, 2).tolist()]
    data = batch.placed.data
    images = [bytes(data[a:b]) for a, b in spans] if data is not None else []
    error = batch.error
    return {
        "calls": calls,
        "keys": batch.keys,
        "urls": batch.urls,
        "labels": batch.labels,
        "label_types": [type(v) for v in batch.labels],
        "images": images,
        "spans": spans,
        "used": batch.placed.used,
        "metas": batch.metas,
        "skipped": [(u, k, unaddressed(why), s) for u, k, why, s in batch.skipped],
        "error": None if error is None else (type(error), unaddressed(str(error))),
    }


def tarwalk() -> Any:
    assert _tarfast._TARWALK is not None, "run `make install` (or setup.py build_ext)"
    return _tarfast._TARWALK


def as_table(record: Any) -> Any:
    """``record`` in a records table (the walk's), or None where the table refuses it."""
    table = tarwalk().Records()
    try:
        table.append(record)
    except (TypeError, OverflowError):
        return None
    return table


def build_delivered(
    builder: BatchBuilder, view: bytes, records: list[tuple[str, Any]], pool: BufferPool
) -> dict[str, Any]:
    """:func:`build` as ``take`` does it natively: every record handed to the native sink
    by ``deliver``, through the C sink protocol where the record is in a table (any other
    through the sink's Python call); the calls as :func:`build` records them."""
    batch = EncodedBatch(placed=BatchBuffer(pool))
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(_batch, "NATIVE", True)
            sink = builder._sink(batch)
        assert isinstance(sink, native().Sink)
        ring = memoryview(view)
        lanes: list[Any] = []
        for url, record in records:
            table = as_table(record)  # else a one-record list: the sink's Python call
            lanes.append(([record] if table is None else table, ring, url, 0))
        n = len(lanes)
        taken, going, error = tarwalk().deliver(lanes, list(range(n)), [0] * n, sink)
        calls: list[Any] = [("returned", True)] * taken
        if error is not None:
            calls[-1] = ("raised", type(error), unaddressed(str(error)))
        elif not going:
            calls[-1] = ("returned", False)
        return collect(batch, calls)
    finally:
        if batch.placed is not None:
            batch.placed.free()


@FUZZ
@given(
    run=runs(),
    precheck=st.sampled_from(["none", "markers", "header"]),
    on_error=st.sampled_from(["skip", "raise"]),
    image_keys=st.sampled_from(
        [("jpg", "jpeg", "png"), ("png", "jpg"), ("jpg", "png", "jpg"), ("cls", "jpg"), ()]
    ),
    label_key=st.sampled_from(["cls", "txt", "json", "png"]),
    shared=st.booleans(),
)
def test_the_native_sink_builds_what_the_python_sink_builds(
    pools: dict[bool, tuple[BufferPool, BufferPool]],
    run: tuple[bytes, list[tuple[str, Any]]],
    precheck: Any,
    on_error: Any,
    image_keys: tuple[str, ...],
    label_key: str,
    shared: bool,
) -> None:
    view, records = run
    builder = BatchBuilder(
        64, on_error=on_error, precheck=precheck, image_keys=image_keys, label_key=label_key
    )
    python = build(builder, view, records, False, pools[shared][0])
    assert build(builder, view, records, True, pools[shared][1]) == python
    assert build_delivered(builder, view, records, pools[shared][1]) == python


def owned(ext: str, data: bytes) -> tuple[str, int, int, bytes]:
    return (ext, 0, 0, data)


EDGES: list[tuple[tuple[str, ...], str, list[Any]]] = [
    # the image's rank: the last of equal image_keys counts, as the Python builder's dict
    (("jpg", "png", "jpg"), "cls", [owned("jpg", JPEG), owned("png", PNG), owned("cls", b"1")]),
    (("jpg", "png"), "cls", [owned("png", PNG), owned("jpg", JPEG), owned("cls", b"1")]),
    (("jpg", "png"), "cls", [owned("jpg", b"x"), owned("jpg", JPEG), owned("cls", b"1")]),
    # a member both label and image; a label in json; the last label counts
    (("cls", "jpg"), "cls", [owned("jpg", JPEG), owned("cls", b"3")]),
    (("jpg",), "json", [owned("jpg", JPEG), owned("json", b"12")]),
    (("jpg",), "cls", [owned("jpg", JPEG), owned("cls", b"x"), owned("cls", b"5")]),
    (("jpg",), "cls", [owned("jpg", JPEG), owned("cls", b"5"), owned("cls", b"x")]),
    # labels at int64's edge: 18 digits native, 19 by int()
    (("jpg",), "cls", [owned("jpg", JPEG), owned("cls", b"9" * 18)]),
    (("jpg",), "cls", [owned("jpg", JPEG), owned("cls", b"9" * 19)]),
    (("jpg",), "cls", [owned("jpg", JPEG), owned("cls", b"9223372036854775808")]),
    (("jpg",), "cls", [owned("jpg", JPEG), owned("cls", b"0" * 18)]),
    # bytes beside the digits, and digits int() reads but isdigit() does not
    *((("jpg",), "cls", [owned("jpg", JPEG), owned("cls", b)]) for b in (b"1/2", b"3:", b"/")),
    (("jpg",), "cls", [owned("jpg", JPEG), owned("cls", "\u0663".encode())]),
    (("jpg",), "cls", [owned("jpg", JPEG), owned("cls", b"")]),
    # a JPEG's end marker at the edge of the 64 bytes searched
    (("jpg",), "cls", [owned("jpg", JPEG + b"\0" * 62), owned("cls", b"1")]),
    (("jpg",), "cls", [owned("jpg", JPEG + b"\0" * 63), owned("cls", b"1")]),
    (("jpg",), "cls", [owned("jpg", b"\xff\xd8\xff\xd9"), owned("cls", b"1")]),
    (("jpg",), "cls", [owned("jpg", b"\xff\xd8\xff"), owned("cls", b"1")]),
    (("jpg",), "cls", [owned("jpg", b"RIFF\0\0\0\0WEBP"), owned("cls", b"1")]),
    (("jpg",), "cls", [owned("jpg", b"RIFF\0\0\0\0WEB"), owned("cls", b"1")]),
    (("jpg",), "cls", [owned("jpg", b"P7"), owned("cls", b"1")]),
    (("jpg",), "cls", [owned("jpg", b"P"), owned("cls", b"1")]),
]


@pytest.mark.parametrize(("image_keys", "label_key", "fields"), EDGES)
@pytest.mark.parametrize("precheck", ["none", "markers", "header"])
@pytest.mark.parametrize("shared", [False, True])
def test_edge_samples_build_alike(
    pools: dict[bool, tuple[BufferPool, BufferPool]],
    image_keys: tuple[str, ...],
    label_key: str,
    fields: list[Any],
    precheck: Any,
    shared: bool,
) -> None:
    view = b"".join(f[3] for f in fields)
    at, in_view = 0, []
    for ext, _, _, data in fields:  # the same sample, its members in the view
        in_view.append((ext, at, at + len(data), None))
        at += len(data)
    records = [("u", ("k0", 0, *fields)), ("u", ("k1", 512, *in_view))]
    for on_error in ("skip", "raise"):
        builder = BatchBuilder(
            8, on_error=on_error, precheck=precheck, image_keys=image_keys, label_key=label_key
        )
        python = build(builder, view, records, False, pools[shared][0])
        assert build(builder, view, records, True, pools[shared][1]) == python
        assert build_delivered(builder, view, records, pools[shared][1]) == python


@pytest.mark.parametrize("extra", [-1, 0, 1])
def test_images_fill_a_shared_buffer_to_its_last_byte_alike(extra: int) -> None:
    """The native sink writes into the buffer while the image fits, to its last byte,
    and lets ``put`` grow it otherwise."""
    first = 100
    size = -(-(first + first // 4) // 64) * 64  # the buffer the first image gets
    images = [b"a" * first, b"b" * (size - first + extra), b"c"]
    records = [
        ("u", (f"k{i}", 0, owned("jpg", im), owned("cls", b"1"))) for i, im in enumerate(images)
    ]
    builder = BatchBuilder(
        8, on_error="raise", precheck="none", image_keys=("jpg",), label_key="cls"
    )
    built = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_shm, "_GRAIN", 64)
        for shared in (True, False):
            for use_native in (False, True):
                pool = BufferPool(shared=shared)
                built.append(build(builder, b"", records, use_native, pool))
                assert pool.buffers[0].size == size
    assert all(b == built[0] for b in built)
    assert built[0]["images"] == images


@FUZZ
@given(
    data=st.one_of(
        st.binary(max_size=100),
        st.builds(lambda h, r: h + r, st.sampled_from(SIGNATURES), st.binary(max_size=100)),
        st.builds(
            lambda n, pad: JPEG[:n] + b"\0" * pad, st.integers(0, len(JPEG)), st.integers(0, 80)
        ),
        st.builds(lambda pad: JPEG + b"\0" * pad, st.integers(60, 66)),
    )
)
def test_the_native_markers_check_is_check_images(data: bytes) -> None:
    expected = check_image(data, "markers") is None
    assert native().markers(data) is expected
    assert native().markers(memoryview(data)) is expected
    assert native().markers(bytearray(data)) is expected


def sink(fallback: Callable[..., bool], placed: Any = None, **lists: list[Any]) -> Any:
    empty: dict[str, list[Any]] = {k: [] for k in ("keys", "urls", "labels", "metas", "spans")}
    return native().Sink(
        **{**empty, **lists},
        placed=BatchBuffer(BufferPool(shared=False)) if placed is None else placed,
        image_keys=("jpg", "png"),
        label_key="cls",
        meta_key="json",
        level=1,
        header=partial(check_image, level="header"),
        fallback=fallback,
    )


def test_a_common_sample_never_reaches_the_python_sink() -> None:
    handed: list[Any] = []
    keys: list[str] = []
    labels: list[int] = []
    metas: list[bytes | None] = []
    spans: list[int] = []
    placed = BatchBuffer(BufferPool(shared=False))

    def fallback(*args: Any) -> bool:
        handed.append(args)
        return True

    add = sink(fallback, placed, keys=keys, labels=labels, metas=metas, spans=spans)
    view = memoryview(b"x" + JPEG + b"042" + b'{"a": 1}')
    cls = (len(JPEG) + 1, len(JPEG) + 4)
    assert add(view, "u", ("k", 0, ("jpg", 1, 1 + len(JPEG), None), ("cls", *cls, None)))
    assert add(view, "u", ("k2", 0, ("png", 0, 0, PNG), ("cls", 0, 0, b"7"), ("json", 0, 0, b"{")))
    assert handed == []
    assert keys == ["k", "k2"]
    assert labels == [42, 7]
    assert metas == [None, b"{"]
    # both images copied into the batch's buffer, one after the other
    assert spans == [0, len(JPEG), len(JPEG), len(JPEG) + len(PNG)]
    assert placed.data is not None
    assert bytes(placed.data[: placed.used]) == JPEG + PNG
    # anything else is handed over as it came
    odd = ("k3", 0, ("jpg", 1, 1 + len(JPEG), None), ("cls", 0, 0, b" 1"))
    assert add(view, "u", odd)
    assert handed == [(view, "u", odd)]
    assert keys == ["k", "k2"]


def test_a_sink_refuses_wrong_arguments() -> None:
    with pytest.raises(TypeError):
        native().Sink([], [], [], [], [], [])
    with pytest.raises(TypeError):  # a batch is always built into a buffer
        native().Sink([], [], [], [], [], None, ("jpg",), "cls", "json", 1, None, print)
    with pytest.raises(TypeError):
        sink(fallback=None)  # type: ignore[arg-type]
    add = sink(lambda *args: True)
    with pytest.raises(TypeError):
        add(memoryview(b""), "u")
    with pytest.raises(TypeError):
        add(memoryview(b""), "u", ("k", 0), extra=1)
    with pytest.raises(TypeError):
        native().Sink.__new__(native().Sink)(memoryview(b""), "u", ("k", 0))


def test_deliver_adds_a_tables_common_sample_with_no_python_call() -> None:
    """Through the C sink protocol: a common sample is added from the table's row; any
    other reaches the Python sink as the very tuple the table reads as; an error of the
    Python sink comes back with the count of samples handed over."""
    handed: list[Any] = []
    keys: list[str] = []
    labels: list[int] = []

    def fallback(view: memoryview, url: str, record: Any) -> bool:
        handed.append((url, record))
        table = grow if record[0] == "grow" else None
        if record[0] == "boom":
            raise RuntimeError("boom")
        if table is not None:  # the table is being read: it may not move
            table.append(("more", 0))
        return record[0] != "stop"

    add = sink(fallback, keys=keys, labels=labels)
    assert type(add.__records_sink__).__name__ == "PyCapsule"
    view = memoryview(b"x" + JPEG + b"042")
    cls = (len(JPEG) + 1, len(JPEG) + 4)
    common = ("k", 0, ("jpg", 1, 1 + len(JPEG), None), ("cls", *cls, None))
    odd = ("k3", 512, ("jpg", 1, 1 + len(JPEG), None), ("cls", 0, 0, b" 1"))
    past = ("k4", 1024, ("jpg", 1, 1 + len(JPEG), None), ("cls", cls[0], 10**6, None))
    records = [common, odd, past, ("stop", 0), common, ("boom", 0)]
    table = tarwalk().Records()
    table.extend(records)
    lanes = [(table, view, "u", 10)]
    deliver = tarwalk().deliver
    assert deliver(lanes, [0, 0, 0, 0, 0], [10, 11, 12, 13, 14], add) == (4, False, None)
    assert keys == ["k"]
    assert labels == [42]
    assert handed == [("u", odd), ("u", past), ("u", ("stop", 0))]
    taken, going, error = deliver(lanes, [0, 0, 0], [14, 15, 14], add)
    assert (taken, going, type(error), keys) == (2, False, RuntimeError, ["k", "k"])
    taken, going, error = deliver(lanes, [0], [16], add)  # past the table
    assert (taken, going, type(error)) == (1, False, IndexError)
    grow = tarwalk().Records()
    grow.append(("grow", 0))
    taken, going, error = deliver([(grow, view, "u", 0)], [0], [0], add)
    assert (taken, going, type(error), len(grow)) == (1, False, BufferError, 1)
    unset = native().Sink.__new__(native().Sink)
    taken, going, error = deliver(lanes, [0], [10], unset)
    assert (taken, going, type(error)) == (1, False, TypeError)


def pad_reference(data: bytes, spans: np.ndarray, rows: int, row: int) -> bytes:
    out = bytearray(rows * row)
    for i, (a, b) in enumerate(spans.tolist()):
        out[i * row : i * row + b - a] = data[a:b]
    return bytes(out)


def jpeg_ends(image: bytes) -> bool:
    """What ``pad`` requires of every image: a JPEG whose end marker ``check_image``'s
    markers level finds (in its last 64 bytes)."""
    return image[:3] == b"\xff\xd8\xff" and check_image(image, "markers") is None


@FUZZ
@given(
    images=st.lists(
        st.one_of(
            st.binary(max_size=40),
            st.builds(lambda body: JPEG[:3] + body + b"\xff\xd9", st.binary(max_size=40)),
            st.builds(lambda n: JPEG[:n], st.integers(0, len(JPEG))),
            st.just(JPEG),
        ),
        max_size=6,
    ),
    cuts=st.lists(st.tuples(st.integers(-2, 400), st.integers(-2, 400)), max_size=3),
    extra=st.integers(-3, 3),
)
def test_pad_copies_each_jpeg_to_its_row_or_declines_or_refuses(
    images: list[bytes], cuts: list[tuple[int, int]], extra: int
) -> None:
    """``pad`` is the Python reference above where every image is a JPEG that ends and
    every span fits; False (nothing written) where an image is not such a JPEG; a
    ValueError (nothing written) for a span outside the data or longer than a row."""
    data = b"".join(images)
    bounds = np.cumsum([0, *map(len, images)])
    spans = np.array(
        [(int(a), int(b)) for a, b in itertools.pairwise(bounds)] + cuts,
        dtype=np.int64,
    ).reshape(-1, 2)
    lengths = spans[:, 1] - spans[:, 0]
    row = max(0, int(lengths.max()) + extra) if len(spans) else 0
    out = np.full((len(spans), row), 7, dtype=np.uint8)
    fits = bool(
        ((spans[:, 0] >= 0) & (spans[:, 0] <= spans[:, 1]) & (spans[:, 1] <= len(data))).all()
        and (lengths <= row).all()
    )
    if not fits:
        with pytest.raises(ValueError, match="span"):
            native().pad(data, spans, out)
        assert (out == 7).all()
        return
    ends = all(jpeg_ends(data[a:b]) for a, b in spans.tolist())
    assert native().pad(data, spans, out) is ends
    if ends:
        assert out.tobytes() == pad_reference(data, spans, len(spans), row)
    else:
        assert (out == 7).all()


def test_pad_refuses_spans_that_are_not_pairs_and_rows_that_do_not_divide() -> None:
    with pytest.raises(ValueError, match="pairs"):
        native().pad(b"abc", np.zeros(3, dtype=np.int64), np.zeros(4, dtype=np.uint8))
    with pytest.raises(ValueError, match="rows"):
        native().pad(b"abc", np.zeros((2, 2), dtype=np.int64), np.zeros(5, dtype=np.uint8))
    with pytest.raises(BufferError):
        native().pad(b"abc", np.zeros((1, 2), dtype=np.int64), b"read-only")
    with pytest.raises(TypeError):
        native().pad(b"abc", np.zeros((1, 2), dtype=np.int64))  # type: ignore[call-arg]
