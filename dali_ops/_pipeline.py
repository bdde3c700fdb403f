"""The DALI graph: decode, augment, normalise; fed batch by batch from Python.

The pipeline has one input, an ``fn.external_source`` with two outputs, called once per
iteration for a whole batch: the encoded images (a list of 1-D ``uint8`` arrays, or a
``TensorListCPU`` of them) and an ``int64`` array of labels. Batches may be shorter than
``batch_size`` (DALI's batch size is a maximum), which is how a final partial batch or a
batch that lost a sample goes through.

Training, as DALI's own ResNet-50 example does it: ``decoders.image_random_crop`` decodes
only a random window (area and aspect ratio drawn as torchvision's ``RandomResizedCrop``
draws them, up to 10 attempts, then the centre), ``resize`` to ``image_size`` square
(linear, antialiased), ``crop_mirror_normalize`` with a coin-flip mirror. Evaluation, as
torchvision's ``Resize(image_size / crop_ratio)`` + ``CenterCrop(image_size)``:
``decoders.image``, ``resize`` of the shorter side (linear, antialiased), a centre crop.
Output: NCHW float32 or float16, RGB, ``(x - mean) / std`` with ``mean`` and ``std`` in
0-255 units; labels as int64.

On the GPU (``"mixed"``) the decoder's buffers are allocated once, for the largest
ImageNet images (DALI's ResNet-50 example's paddings and hints), so that neither the first
batches nor a large image later make it reallocate; ``hw_decoder_load`` sends that share
of the JPEGs to the hardware decoder (A100, H100, H200), DALI's default of 0.65 (restored
as the default in DALI's decoder in 2026 after 0.9 lengthened its tail latencies).
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
from nvidia.dali import fn
from nvidia.dali import pipeline as _dali_pipeline
from nvidia.dali.types import DALIDataType, DALIImageType, DALIInterpType

# DALI's Pipeline is only partly annotated: use it untyped here.
_Pipeline: Any = _dali_pipeline.Pipeline

__all__ = [
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "Batch",
    "PipelineSettings",
    "build_pipeline",
    "dali_reason",
    "find_undecodable",
    "pipeline_seed",
    "release_pipeline",
]

IMAGENET_MEAN = (0.485 * 255, 0.456 * 255, 0.406 * 255)
IMAGENET_STD = (0.229 * 255, 0.224 * 255, 0.225 * 255)

Batch = tuple[Any, npt.NDArray[np.int64]]
"""What a source returns per call: the encoded images (a list of 1-D ``uint8`` arrays, or a
``TensorListCPU`` of them) and their labels."""

# nvJPEG's buffers, preallocated for ImageNet's largest images (DALI's ResNet-50 example).
_MIXED_DECODER = {
    "device_memory_padding": 211_025_920,
    "host_memory_padding": 140_544_512,
    "preallocate_width_hint": 5_980,
    "preallocate_height_hint": 6_430,
}
_ATTEMPTS = 10  # random crop windows tried before the centre one, as torchvision


def _check_numbers(name: str, value: object, count: int) -> None:
    if not (isinstance(value, tuple) and len(value) == count) or not all(
        isinstance(v, int | float) and math.isfinite(v) for v in value
    ):
        raise ValueError(f"{name} must be a tuple of {count} finite numbers, got {value!r}")


def _check_range(name: str, value: tuple[float, float], low: float, high: float) -> None:
    _check_numbers(name, value, 2)
    if not low < value[0] <= value[1] <= high:
        raise ValueError(f"{name} must satisfy {low} < min <= max <= {high}, got {value!r}")


@dataclass(frozen=True, kw_only=True)
class PipelineSettings:
    """What the pipeline computes and how hard it works; the repr lists every field.

    Attributes:
        image_size: side of the square output, in pixels.
        train: random resized crop and random flip (``True``), or resize and centre crop.
        mean: per-channel mean, RGB, in 0-255 units (ImageNet's by default).
        std: per-channel standard deviation, RGB, in 0-255 units.
        dtype: ``"float32"`` or ``"float16"`` output.
        num_threads: DALI CPU worker threads.
        prefetch_queue_depth: batches DALI works on ahead of the consumer.
        hw_decoder_load: share of JPEG work sent to the hardware decoder (``"mixed"`` on
            A100/H100 class GPUs; ignored on CPU).
        crop_ratio: evaluation resizes the shorter side to ``image_size / crop_ratio``.
        random_area: training crop area range, relative to the image.
        random_aspect_ratio: training crop aspect-ratio range.
        seed: seed of DALI's random operators.
    """

    image_size: int = 224
    train: bool = True
    mean: tuple[float, float, float] = IMAGENET_MEAN
    std: tuple[float, float, float] = IMAGENET_STD
    dtype: Literal["float32", "float16"] = "float32"
    num_threads: int = 4
    prefetch_queue_depth: int = 2
    hw_decoder_load: float = 0.65
    crop_ratio: float = 0.875
    random_area: tuple[float, float] = (0.08, 1.0)
    random_aspect_ratio: tuple[float, float] = (3 / 4, 4 / 3)
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("image_size", "num_threads", "prefetch_queue_depth"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"seed must be an integer >= 0, got {self.seed!r}")
        if not isinstance(self.train, bool):
            raise ValueError(f"train must be a bool, got {self.train!r}")
        if self.dtype not in ("float32", "float16"):
            raise ValueError(f"dtype must be 'float32' or 'float16', got {self.dtype!r}")
        _check_numbers("mean", self.mean, 3)
        _check_numbers("std", self.std, 3)
        if not all(s > 0 for s in self.std):
            raise ValueError(f"std must be > 0, got {self.std!r}")
        if not 0.0 <= self.hw_decoder_load <= 1.0:
            raise ValueError(f"hw_decoder_load must be in [0, 1], got {self.hw_decoder_load!r}")
        if not 0.0 < self.crop_ratio <= 1.0:
            raise ValueError(f"crop_ratio must be in (0, 1], got {self.crop_ratio!r}")
        _check_range("random_area", self.random_area, 0.0, 1.0)
        _check_range("random_aspect_ratio", self.random_aspect_ratio, 0.0, math.inf)


def build_pipeline(
    settings: PipelineSettings,
    source: Callable[[], Batch],
    *,
    batch_size: int,
    device: Literal["cpu", "mixed"] = "cpu",
    device_id: int | None = None,
    seed: int | None = None,
) -> Any:
    """A built pipeline whose outputs are ``(images NCHW, labels)``.

    Args:
        settings: what to compute.
        source: called once per iteration, from the thread that runs the pipeline; returns
            a batch (at most ``batch_size`` images; the arrays must stay alive and unchanged
            until DALI is done with them, as they are passed with ``no_copy``), or raises
            ``StopIteration`` to end the epoch.
        batch_size: the largest batch.
        device: ``"cpu"`` decodes with libjpeg-turbo on CPU threads; ``"mixed"`` decodes on
            the GPU (nvJPEG, hardware decoder where there is one) and returns GPU outputs.
        device_id: the GPU for ``"mixed"``; ignored for ``"cpu"`` (a CPU-only pipeline).
        seed: overrides ``settings.seed``.

    Returns:
        The built pipeline. Drive it with ``schedule_run`` / ``outputs`` (or ``run``).
    """
    if device not in ("cpu", "mixed"):
        raise ValueError(f"device must be 'cpu' or 'mixed', got {device!r}")
    s = settings
    pipe = _Pipeline(
        batch_size=batch_size,
        num_threads=s.num_threads,
        device_id=device_id if device == "mixed" else None,
        seed=s.seed if seed is None else seed,
        prefetch_queue_depth=s.prefetch_queue_depth,
        exec_dynamic=True,  # outputs stay valid after the next iteration
    )
    decoder: dict[str, Any] = {"device": device, "output_type": DALIImageType.RGB}
    if device == "mixed":
        decoder.update(_MIXED_DECODER, hw_decoder_load=s.hw_decoder_load)
    size = [s.image_size, s.image_size]
    linear: dict[str, Any] = {"interp_type": DALIInterpType.INTERP_LINEAR, "antialias": True}
    with pipe:
        jpegs, labels = fn.external_source(
            source=source,
            num_outputs=2,
            batch=True,
            dtype=[DALIDataType.UINT8, DALIDataType.INT64],
            ndim=[1, 0],
            no_copy=True,
        )
        mirror: Any = 0
        crop_at: dict[str, Any] = {}
        if s.train:
            images: Any = fn.decoders.image_random_crop(
                jpegs,
                random_area=list(s.random_area),
                random_aspect_ratio=list(s.random_aspect_ratio),
                num_attempts=_ATTEMPTS,
                **decoder,
            )
            images = fn.resize(images, resize_x=s.image_size, resize_y=s.image_size, **linear)
            mirror = fn.random.coin_flip(probability=0.5)
        else:
            decoded = fn.decoders.image(jpegs, **decoder)
            images, crop_at = _torchvision_eval(jpegs, decoded, s, linear)
        images = fn.crop_mirror_normalize(
            images,
            crop=size,
            **crop_at,
            mirror=mirror,
            mean=list(s.mean),
            std=list(s.std),
            dtype=DALIDataType.FLOAT16 if s.dtype == "float16" else DALIDataType.FLOAT,
            output_layout="CHW",
        )
        pipe.set_outputs(images, labels.gpu() if device == "mixed" else labels)
    pipe.build()
    return pipe


def _torchvision_eval(
    jpegs: Any, images: Any, s: PipelineSettings, linear: dict[str, Any]
) -> tuple[Any, dict[str, Any]]:
    """torchvision's ``Resize(short)`` + ``CenterCrop(size)``, to the pixel.

    ``Resize(short)`` makes the shorter side ``short`` and the longer
    ``int(short * long / shorter)`` (truncated, where DALI's ``resize_shorter`` rounds);
    ``CenterCrop`` starts at ``round((side - size) / 2)``, Python's round, half to even
    (DALI's centre crop rounds half up). A pixel either way is a visible shift on
    textured images, so both are computed per image from its header.

    Returns:
        The resized images and the ``crop_pos_x`` / ``crop_pos_y`` arguments that make
        ``crop_mirror_normalize`` crop there (its anchor is ``crop_pos * (side - size)``,
        rounded: exact for ``start / (side - size)``).
    """
    short = eval_resize(s)
    shape = fn.peek_image_shape(jpegs, dtype=DALIDataType.INT64)
    h, w = shape[0], shape[1]
    portrait = fn.cast(w <= h, dtype=DALIDataType.INT64)
    landscape = 1 - portrait
    longer = (short * (portrait * h + landscape * w)) // (portrait * w + landscape * h)
    new_w = portrait * short + landscape * longer
    new_h = portrait * longer + landscape * short
    images = fn.resize(
        images,
        resize_x=fn.cast(new_w, dtype=DALIDataType.FLOAT),
        resize_y=fn.cast(new_h, dtype=DALIDataType.FLOAT),
        **linear,
    )

    def position(side: Any) -> Any:  # round(extra / 2), half to even, over extra
        extra = side - s.image_size
        half = extra // 2
        start = half + ((extra % 2) & (half % 2))
        spare = fn.cast(extra, dtype=DALIDataType.FLOAT)
        return fn.cast(start, dtype=DALIDataType.FLOAT) / (spare + (spare == 0))

    return images, {"crop_pos_x": position(new_w), "crop_pos_y": position(new_h)}


def eval_resize(settings: PipelineSettings) -> int:
    """The shorter side evaluation resizes to: ``image_size / crop_ratio`` (256 for 224)."""
    return round(settings.image_size / settings.crop_ratio)


def pipeline_seed(seed: int, epoch: int, batch: int, attempt: int = 0) -> int:
    """DALI's seed for a pipeline started at ``batch`` of ``epoch`` (after ``attempt`` rebuilds).

    ``seed`` itself for the start of epoch 0, so that a plain DALI pipeline with the same
    seed reproduces a first pass; a hash of all four otherwise.
    """
    if (epoch, batch, attempt) == (0, 0, 0):
        return seed
    digest = hashlib.blake2b(f"{seed}:{epoch}:{batch}:{attempt}".encode(), digest_size=4)
    return int.from_bytes(digest.digest(), "little") & 0x7FFFFFFF


def release_pipeline(pipe: Any) -> None:
    """Stop a pipeline's threads now rather than whenever it is garbage collected."""
    # DALI has no public close; ``_shutdown`` is what ``Pipeline.__del__`` calls.
    shutdown = getattr(pipe, "_shutdown", None)
    if callable(shutdown):
        shutdown()


def dali_reason(error: BaseException, image: bytes | None = None) -> str:
    """The informative part of a DALI error message (it repeats the graph's traceback).

    DALI's decoder often says no more than ``nvImageCodec failure: '#3'`` (a status code);
    given the ``image``, Pillow's own reading of it is added, which names the problem
    (``broken data stream``, ``image file is truncated``, ``cannot identify image file``).
    """
    lines = [line.strip() for line in str(error).splitlines()]
    lines = [line for line in lines if line and "no longer valid" not in line]
    if "encountered:" in lines:
        lines = lines[lines.index("encountered:") + 1 :]
    reason = " ".join(lines)[-300:] or type(error).__name__
    if "nvImageCodec failure" in reason:
        reason += " (DALI's decoder rejected the image data)"
    if image is not None:
        reason += f"; Pillow: {_pillow_reason(image)}"
    return reason


def _pillow_reason(image: bytes) -> str:
    """What Pillow says of an image DALI could not decode."""
    import io

    from PIL import Image

    try:
        with Image.open(io.BytesIO(image)) as opened:
            opened.load()
    except Exception as exc:  # Pillow raises many types for bad data
        message = re.sub(r" <_io\.BytesIO object at 0x[0-9a-f]+>", "", str(exc))
        return f"{type(exc).__name__}: {message}"[:200]
    return "it decodes, leniently (the data may be damaged in a way DALI's decoder refuses)"


def find_undecodable(
    images: Sequence[npt.NDArray[np.uint8]],
    *,
    device: Literal["cpu", "mixed"],
    device_id: int | None = None,
) -> dict[int, str]:
    """The images DALI's decoder rejects, decoding them one at a time: ``{index: reason}``.

    A failed decode leaves a DALI pipeline unusable, so the probe pipeline is rebuilt after
    each failure. Slow by design (one image per iteration); used only after a failed batch.
    """
    bad: dict[int, str] = {}
    pipe: Any = None
    try:
        for index, image in enumerate(images):
            if pipe is None:
                pipe = _Pipeline(
                    batch_size=1,
                    num_threads=1,
                    device_id=device_id if device == "mixed" else None,
                    prefetch_queue_depth=1,
                    exec_dynamic=True,
                )
                with pipe:
                    data = fn.external_source(name="data", dtype=DALIDataType.UINT8, ndim=1)
                    pipe.set_outputs(fn.decoders.image(data, device=device))
                pipe.build()
            try:
                pipe.run(data=[image])
            except Exception as exc:  # DALI reports decode failures as RuntimeError
                bad[index] = dali_reason(exc, image.tobytes())
                release_pipeline(pipe)
                pipe = None
    finally:
        release_pipeline(pipe)
    return bad
