"""The synthetic dataset generator: determinism, realism of the JPEGs, layout, arguments."""

from __future__ import annotations

import io
import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from asyncstream.testing import class_names, generate_imagefolder, make_jpeg

N_CLASSES = 10
N_SAMPLE = 60


@pytest.fixture(scope="module")
def sample() -> list[bytes]:
    """A fixed sample of images, round-robin over the classes, as the folder writer does."""
    return [make_jpeg(0, i % N_CLASSES, i, N_CLASSES) for i in range(N_SAMPLE)]


def _decode(data: bytes) -> Image.Image:
    image = Image.open(io.BytesIO(data))
    image.load()
    return image


def _luma(data: bytes) -> np.ndarray:
    return np.asarray(_decode(data).convert("L"), dtype=np.float64)


def _neighbour_correlation(luma: np.ndarray) -> float:
    """Mean of the horizontal and vertical correlation between adjacent pixels."""
    horizontal = np.corrcoef(luma[:, :-1].ravel(), luma[:, 1:].ravel())[0, 1]
    vertical = np.corrcoef(luma[:-1].ravel(), luma[1:].ravel())[0, 1]
    return float((horizontal + vertical) / 2)


def _spectral_slope(luma: np.ndarray) -> float:
    """Slope of the radially averaged power spectrum on log-log axes (about -2 for photos)."""
    n = min(luma.shape) // 2 * 2
    crop = luma[:n, :n] - luma[:n, :n].mean()
    window = np.hanning(n)[:, None] * np.hanning(n)[None, :]
    power = np.abs(np.fft.fftshift(np.fft.fft2(crop * window))) ** 2
    yy, xx = np.indices(power.shape)
    radius = np.hypot(yy - n // 2, xx - n // 2).astype(int)
    radial = np.bincount(radius.ravel(), power.ravel()) / np.bincount(radius.ravel())
    freqs = np.arange(len(radial)) / n
    band = (freqs > 0.02) & (freqs < 0.45)
    return float(np.polyfit(np.log(freqs[band]), np.log(radial[band]), 1)[0])


def _encoded_size(pixels: np.ndarray, quality: int = 90) -> int:
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="JPEG", quality=quality)
    return len(buf.getvalue())


# ---------------------------------------------------------------------------------------
# class_names
# ---------------------------------------------------------------------------------------


def test_class_names_are_zero_padded_and_sort_in_index_order() -> None:
    assert class_names(1) == ["class_000"]
    assert class_names(3) == ["class_000", "class_001", "class_002"]
    for n in (10, 1000, 1001, 12345):
        names = class_names(n)
        assert len(names) == n
        assert len(set(names)) == n
        assert sorted(names) == names
        assert len({len(name) for name in names}) == 1
    assert class_names(1001)[-1] == "class_1000"


# ---------------------------------------------------------------------------------------
# make_jpeg
# ---------------------------------------------------------------------------------------


def test_same_arguments_give_identical_bytes(sample: list[bytes]) -> None:
    for i in (0, 7, 33):
        assert make_jpeg(0, i % N_CLASSES, i, N_CLASSES) == sample[i]


def test_any_changed_argument_changes_the_image(sample: list[bytes]) -> None:
    reference = sample[3]
    assert make_jpeg(1, 3, 3, N_CLASSES) != reference  # seed
    assert make_jpeg(0, 4, 3, N_CLASSES) != reference  # class
    assert make_jpeg(0, 3, 13, N_CLASSES) != reference  # sample index
    assert make_jpeg(0, 3, 3, N_CLASSES + 1) != reference  # number of classes
    assert len(set(sample)) == len(sample)


def test_images_are_rgb_baseline_jpegs(sample: list[bytes]) -> None:
    for data in sample:
        assert data[:2] == b"\xff\xd8"
        assert data[-2:] == b"\xff\xd9"
        image = _decode(data)
        assert image.format == "JPEG"
        assert image.mode == "RGB"
        assert not image.info.get("progressive", False)


def test_dimensions_are_imagenet_like(sample: list[bytes]) -> None:
    sizes = [_decode(data).size for data in sample]
    widths = [w for w, _ in sizes]
    heights = [h for _, h in sizes]
    assert min(widths) >= 350
    assert max(widths) <= 640
    assert min(heights) >= 250
    assert max(heights) <= 500
    assert len(set(sizes)) >= 10  # the sizes vary ...
    assert (500, 375) in sizes  # ... around the most common ImageNet size,
    landscape = sum(w > h for w, h in sizes)
    portrait = sum(h > w for w, h in sizes)
    assert landscape > portrait > 0  # mostly landscape, some portrait
    assert 400 <= np.mean(widths) <= 540
    assert 330 <= np.mean(heights) <= 440


def test_file_sizes_are_imagenet_like(sample: list[bytes]) -> None:
    sizes_kb = np.array([len(data) for data in sample]) / 1000
    assert 70 <= sizes_kb.mean() <= 160
    assert sizes_kb.min() >= 15
    assert sizes_kb.max() <= 400
    assert sizes_kb.std() >= 10  # sizes spread, as real photographs' do


def test_images_are_not_noise_like(sample: list[bytes]) -> None:
    correlations = [_neighbour_correlation(_luma(data)) for data in sample]
    assert min(correlations) > 0.7
    assert np.mean(correlations) > 0.8
    # the same check throws out noise
    rng = np.random.default_rng(0)
    noise = rng.integers(0, 256, size=(375, 500), dtype=np.uint8).astype(np.float64)
    assert abs(_neighbour_correlation(noise)) < 0.1


def test_images_compress_like_photographs(sample: list[bytes]) -> None:
    rng = np.random.default_rng(0)
    raw_ratios = []
    structure_ratios = []
    for data in sample[:20]:
        pixels = np.asarray(_decode(data))
        raw_ratios.append(pixels.size / len(data))
        # the same pixels with their spatial structure destroyed cost much more to encode
        flat = pixels.reshape(-1, 3)
        shuffled = flat[rng.permutation(len(flat))].reshape(pixels.shape)
        structure_ratios.append(_encoded_size(shuffled) / _encoded_size(pixels))
    assert min(raw_ratios) > 3
    assert np.mean(raw_ratios) > 4.5
    assert min(structure_ratios) > 1.15
    assert np.mean(structure_ratios) > 1.4


def test_power_spectrum_falls_like_natural_images(sample: list[bytes]) -> None:
    slopes = [_spectral_slope(_luma(data)) for data in sample[:12]]
    assert -3.5 < np.mean(slopes) < -1.5
    assert all(-4.5 < slope < -1.0 for slope in slopes)


def test_classes_are_distinguishable(sample: list[bytes]) -> None:
    """Nearest class centroid of saturation-weighted hue histograms beats chance by far."""
    features, labels = [], []
    for i, data in enumerate(sample):
        hsv = np.asarray(_decode(data).convert("HSV").resize((64, 64)), dtype=np.float64)
        hist = np.histogram(hsv[..., 0], bins=24, range=(0, 256), weights=hsv[..., 1])[0]
        features.append(hist / hist.sum())
        labels.append(i % N_CLASSES)
    x, y = np.array(features), np.array(labels)
    train = np.arange(len(y)) < len(y) // 2  # three images per class to learn from
    centroids = np.stack([x[train & (y == c)].mean(axis=0) for c in range(N_CLASSES)])
    distances = ((x[~train, None, :] - centroids[None]) ** 2).sum(axis=-1)
    accuracy = (distances.argmin(axis=1) == y[~train]).mean()
    assert accuracy >= 0.6  # chance is 0.1


@pytest.mark.parametrize(
    ("args", "name"),
    [
        ((-1, 0, 0, 3), "seed"),
        ((0, 3, 0, 3), "class_index"),
        ((0, -1, 0, 3), "class_index"),
        ((0, 0, -1, 3), "sample_index"),
        ((0, 0, 0, 0), "n_classes"),
        ((0, 0, 0, 2.0), "n_classes"),
        ((0, True, 0, 3), "class_index"),
    ],
)
def test_make_jpeg_rejects_bad_arguments(args: tuple[object, ...], name: str) -> None:
    with pytest.raises(ValueError, match=name):
        make_jpeg(*args)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------
# generate_imagefolder
# ---------------------------------------------------------------------------------------


def _tree(root: Path) -> dict[str, bytes]:
    return {
        str(path.relative_to(root)): path.read_bytes()
        for path in sorted(root.rglob("*"))
        if path.is_file()
    }


def test_imagefolder_layout(tmp_path: Path) -> None:
    paths = generate_imagefolder(tmp_path / "data", 7, 3, seed=5, workers=1)
    root = tmp_path / "data"
    assert paths == sorted(paths)
    assert sorted(p.name for p in root.iterdir()) == ["class_000", "class_001", "class_002"]
    expected = {
        f"class_{i % 3:03d}/class_{i % 3:03d}_{i:06d}.jpg": make_jpeg(5, i % 3, i, 3)
        for i in range(7)
    }
    assert {str(p.relative_to(root)) for p in paths} == set(expected)
    assert _tree(root) == expected  # nothing else, no temporary files
    counts = [len(list((root / name).iterdir())) for name in class_names(3)]
    assert counts == [3, 2, 2]  # round-robin


def test_imagefolder_is_idempotent_and_grows_as_a_superset(tmp_path: Path) -> None:
    first = generate_imagefolder(tmp_path, 5, 2, workers=1)
    before = _tree(tmp_path)
    assert generate_imagefolder(os.fspath(tmp_path), 5, 2, workers=1) == first
    assert _tree(tmp_path) == before
    generate_imagefolder(tmp_path, 8, 2, workers=1)
    after = _tree(tmp_path)
    assert len(after) == 8
    assert {k: after[k] for k in before} == before


def test_more_classes_than_images(tmp_path: Path) -> None:
    paths = generate_imagefolder(tmp_path, 2, 5, workers=1)
    assert [str(p.relative_to(tmp_path)) for p in paths] == [
        "class_000/class_000_000000.jpg",
        "class_001/class_001_000001.jpg",
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["class_000", "class_001"]


@pytest.mark.parametrize("workers", [1, 2])
def test_progress_counts_every_image(tmp_path: Path, workers: int) -> None:
    calls: list[tuple[int, int]] = []
    generate_imagefolder(tmp_path, 5, 2, workers=workers, progress=lambda *a: calls.append(a))
    assert calls == [(n, 5) for n in range(1, 6)]


def test_process_pool_writes_the_same_bytes(tmp_path: Path) -> None:
    paths = generate_imagefolder(tmp_path, 6, 2, seed=1, workers=2)
    assert len(paths) == 6
    for i, path in enumerate(sorted(paths, key=lambda p: p.name[-10:])):
        assert path.read_bytes() == make_jpeg(1, i % 2, i, 2)
    assert len(_tree(tmp_path)) == 6


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"n_images": 0}, "n_images"),
        ({"n_images": -3}, "n_images"),
        ({"n_images": 2.5}, "n_images"),
        ({"n_classes": 0}, "n_classes"),
        ({"seed": -1}, "seed"),
        ({"workers": 0}, "workers"),
    ],
)
def test_imagefolder_rejects_bad_arguments(
    tmp_path: Path, kwargs: dict[str, object], name: str
) -> None:
    args: dict[str, object] = {"n_images": 2, "n_classes": 2, "workers": 1, **kwargs}
    with pytest.raises(ValueError, match=name):
        generate_imagefolder(tmp_path / "out", **args)  # type: ignore[arg-type]
    assert not (tmp_path / "out").exists()
