"""The pipeline's numbers against an independent reference: Pillow and numpy.

Evaluation is torchvision's ``Resize(size / crop_ratio)`` + ``CenterCrop(size)`` +
``Normalize``; training with a crop window forced to the whole image (``random_area``
(1, 1), ``random_aspect_ratio`` the image's own) is a resize of the whole image to
``size`` x ``size``, mirrored or not. Decoders and resamplers differ by a level or two
between DALI and Pillow, so images are compared by their mean absolute difference in
normalised units, against a bound that each kind of mistake (mean, std, colour order,
crop position, scale) is shown to exceed several times over. Measured: evaluation 0.0015
(a tenth of a level of 255: the same pixels), training 0.003 to 0.034 (the window's
rounding), the smallest mistake 0.23 (a mean given in BGR order), a crop one pixel off
0.36 to 0.68.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from PIL import Image

from asyncstream.testing import generate_imagefolder
from dali_ops import PipelineSettings, build_pipeline
from dali_ops._pipeline import IMAGENET_MEAN, IMAGENET_STD

SIZE = 64
EVAL_TOLERANCE = 0.02  # mean |DALI - Pillow| in normalised units: about 1.2 levels of 255
TRAIN_TOLERANCE = 0.05
MISTAKE = 0.2  # what every mistake must exceed

Array = npt.NDArray[np.float64]


@pytest.fixture(scope="module")
def jpegs(tmp_path_factory: pytest.TempPathFactory) -> list[bytes]:
    """Generated photographs of three shapes: landscape, portrait, other."""
    paths = generate_imagefolder(tmp_path_factory.mktemp("ref"), 12, 3, seed=3, workers=1)
    data = [Path(p).read_bytes() for p in paths]
    shapes: dict[str, bytes] = {}
    for blob in data:
        with Image.open(io.BytesIO(blob)) as image:
            w, h = image.size
        shapes.setdefault("landscape" if w > h else "portrait" if h > w else "square", blob)
    assert {"landscape", "portrait"} <= set(shapes)
    return list(shapes.values())


def dali(settings: PipelineSettings, blob: bytes) -> Array:
    """DALI's output for one image, CHW."""
    done = False

    def source() -> tuple[list[npt.NDArray[np.uint8]], npt.NDArray[np.int64]]:
        nonlocal done
        if done:
            raise StopIteration
        done = True
        return [np.frombuffer(blob, np.uint8)], np.zeros(1, np.int64)

    pipe = build_pipeline(settings, source, batch_size=1, device="cpu")
    images, _ = pipe.run()
    return np.array(images.as_tensor(), dtype=np.float64)[0]


def normalise(
    rgb: npt.NDArray[np.uint8], mean: Any = IMAGENET_MEAN, std: Any = IMAGENET_STD
) -> Array:
    """HWC uint8 to normalised CHW, as torchvision's ToTensor + Normalize (0-255 units)."""
    x = rgb.astype(np.float64)
    return ((x - np.array(mean)) / np.array(std)).transpose(2, 0, 1)


def decode(blob: bytes) -> Image.Image:
    return Image.open(io.BytesIO(blob)).convert("RGB")


def eval_reference(blob: bytes, *, offset: int = 0) -> npt.NDArray[np.uint8]:
    """torchvision's Resize(73) + CenterCrop(64) with Pillow (``offset`` moves the crop)."""
    image = decode(blob)
    w, h = image.size
    short = round(SIZE / 0.875)
    size = (short, int(short * h / w)) if w < h else (int(short * w / h), short)
    image = image.resize(size, Image.Resampling.BILINEAR)
    w, h = image.size
    top, left = round((h - SIZE) / 2.0) + offset, round((w - SIZE) / 2.0) + offset
    return np.asarray(image.crop((left, top, left + SIZE, top + SIZE)))


def difference(a: Array, b: Array) -> float:
    assert a.shape == b.shape == (3, SIZE, SIZE)
    return float(np.abs(a - b).mean())


MISTAKES: dict[str, Callable[[npt.NDArray[np.uint8]], Array]] = {
    "no mean": lambda rgb: normalise(rgb, mean=(0, 0, 0)),
    "no std": lambda rgb: normalise(rgb, std=(1, 1, 1)),
    "mean of another order": lambda rgb: normalise(rgb, mean=IMAGENET_MEAN[::-1]),
    "BGR": lambda rgb: normalise(np.ascontiguousarray(rgb[:, :, ::-1])),
    "0-1 scale": lambda rgb: normalise(rgb) / 255,
}


def test_eval_matches_torchvision_resize_centre_crop_normalize(jpegs: list[bytes]) -> None:
    settings = PipelineSettings(image_size=SIZE, train=False, num_threads=1)
    for blob in jpegs:
        got = dali(settings, blob)
        reference = eval_reference(blob)
        assert difference(got, normalise(reference)) < EVAL_TOLERANCE
        # Each mistake would be caught: it moves the output far past the tolerance.
        for name, wrong in MISTAKES.items():
            assert difference(got, wrong(reference)) > MISTAKE, name
        for offset in (-1, 1):  # the crop one pixel off torchvision's
            moved = normalise(eval_reference(blob, offset=offset))
            assert difference(got, moved) > MISTAKE


def test_train_whole_image_window_matches_pillow_resize(jpegs: list[bytes]) -> None:
    for blob in jpegs:
        image = decode(blob)
        w, h = image.size
        settings = PipelineSettings(
            image_size=SIZE,
            train=True,
            num_threads=1,
            random_area=(1.0, 1.0),
            random_aspect_ratio=(w / h, w / h),
            seed=5,
        )
        got = dali(settings, blob)
        rgb = np.asarray(image.resize((SIZE, SIZE), Image.Resampling.BILINEAR))
        plain, mirrored = normalise(rgb), normalise(np.ascontiguousarray(rgb[:, ::-1]))
        best = min(difference(got, plain), difference(got, mirrored))
        assert best < TRAIN_TOLERANCE
        for name, wrong in MISTAKES.items():
            flipped = np.ascontiguousarray(rgb[:, ::-1])
            assert min(difference(got, wrong(rgb)), difference(got, wrong(flipped))) > MISTAKE, name


def test_train_crops_are_random_windows_of_the_requested_area(jpegs: list[bytes]) -> None:
    """With a quarter of the area, the output is the scaled-up window of some 1/4 crop:
    it matches no whole-image resize, and differs from seed to seed."""
    blob = jpegs[0]
    outputs = []
    for seed in (1, 2):
        settings = PipelineSettings(
            image_size=SIZE, train=True, num_threads=1, random_area=(0.25, 0.25), seed=seed
        )
        outputs.append(dali(settings, blob))
    whole = normalise(np.asarray(decode(blob).resize((SIZE, SIZE), Image.Resampling.BILINEAR)))
    assert all(difference(out, whole) > MISTAKE for out in outputs)
    assert difference(outputs[0], outputs[1]) > MISTAKE
