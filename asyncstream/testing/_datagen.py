"""Deterministic synthetic "photographs" for the demo, the benchmark and the tests.

The images are procedural landscape scenes drawn with numpy and encoded by Pillow's JPEG
encoder. They are built to look like a natural-image dataset (ImageNet-like) to everything
a data loader can measure, without shipping or downloading any real data:

* **Size**: about 108 KB per file on average, spread like photographs' (5th-95th
  percentile about 64-159 KB), at ImageNet-like dimensions: mostly landscape (28 % exactly
  500x375), about a fifth portrait, widths 350-640, heights 250-500.
* **Statistics**: sky and ground gradients with soft clouds, fractal horizons and ridges,
  soft-edged shaded objects with cast shadows and small clutter, a 1/f-amplitude texture
  in luma and chroma, vignetting, a camera-like tone curve, a slight lens blur (stronger
  on a fifth of the images) and a faint sensor-noise floor. Decoded, the luma has a power
  spectrum falling as about 1/f^2.6 and an adjacent-pixel correlation of about 0.89 (at
  least ~0.8); files are about 5x smaller than raw RGB, and JPEG-encoding the same pixels
  shuffled costs about 1.65x as much. Random noise has no such structure.
* **Classes**: the class index drives the palette (hues evenly spread over ``n_classes``),
  the object and clutter shapes (6 families), the number, size and aspect of objects, the
  texture slope, orientation and tint, the horizon height, the sky and the lighting;
  samples vary around all of these. A linear probe on 8x8 thumbnails plus a hue histogram
  tells 10 classes apart at 98-100 % accuracy.
* **Determinism**: :func:`make_jpeg` is a pure function of its arguments; the same
  arguments give byte-identical files, in this process or any other, on the same numpy and
  Pillow builds. (FFT rounding and the libjpeg version may differ between builds, so bytes
  are not promised to match across machines or library upgrades.)
* **Speed**: about 7 ms per image on one core (a half-resolution scene, two FFTs, one JPEG
  encode); :func:`generate_imagefolder` fans out over a process pool: ~225 images/s with
  two workers on a 2-core machine, file writes and worker start-up included.

The module is private: the demo, the benchmark and the tests use it; the library does not.
"""

from __future__ import annotations

import colorsys
import concurrent.futures
import functools
import io
import math
import multiprocessing
import os
import pathlib
from dataclasses import dataclass
from typing import TypeAlias

import numpy as np
import numpy.typing as npt
from PIL import Image

__all__ = ["class_names", "generate_imagefolder", "make_jpeg"]

F32: TypeAlias = npt.NDArray[np.float32]

# Domain-separation tags so that class prototypes and samples never share a random stream.
_CLASS_TAG = 0x5EED_C1A5
_SAMPLE_TAG = 0x5EED_5A3B

_N_SHAPES = 6
"""Object shape families: blob, box, star, ring, tree, rock (see :func:`_shape_distance`)."""

# Tuning. Measured over 2,000 images these give a mean of ~108 KB per file; over 200, a mean
# adjacent-pixel (luma) correlation of ~0.89. More texture gain means more bytes and less
# correlation; the lens blur buys correlation back at the cost of bytes.
_TEXTURE_GAIN = 2.0
"""Contrast of the fine luminance texture (its high-frequency band), in units of ~128 levels."""
_LUMA_LINK = 0.4
"""How much the texture amplitude follows the local brightness (0: additive, 1: multiplicative)."""
_CHROMA_DETAIL = 0.7
"""Strength of the colour texture, relative to the local luma."""
_BETA = (1.0, 1.3)
"""Range of the per-class texture amplitude slope (amplitude ~ 1 / f**beta)."""
_KNEE = (48.0, 160.0)
"""Range of the per-image largest texture feature size, in pixels."""
_BAND = 0.125
"""The texture contrast is set on frequencies at or above this (cycles per pixel)."""
_OLPF = 0.35
"""Sigma (pixels) of the optical low-pass that every image gets, as through a camera lens."""
_GRAIN = (0.0, 0.1)
"""Range of the white sensor-noise floor, relative to the texture at the Nyquist frequency."""
_TOE, _SHOULDER = 24.0, 224.0
"""Luma below / above which the tone curve rolls off softly instead of clipping."""
_GROUND_MOD = 0.4
"""Relative large-scale brightness variation of the ground."""
_HORIZON = (0.12, 0.42)
"""Range of the per-class horizon height, as a fraction of the image height."""
_CLUTTER = (8, 30)
"""Range of the per-class maximum number of small clutter objects."""
_QUALITY = (88, 92)
"""JPEG quality range, inclusive; drawn per image."""


# --------------------------------------------------------------------------------------
# Argument checks
# --------------------------------------------------------------------------------------


def _check_int(name: str, value: object, minimum: int) -> int:
    """Return ``value`` as an int, or raise ValueError naming what was expected."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return int(value)


def class_names(n_classes: int) -> list[str]:
    """Return the folder names of ``n_classes`` classes.

    Names are zero-padded (at least three digits) so that sorting them alphabetically gives
    index order, which is what ``torchvision.datasets.ImageFolder`` and friends rely on.

    Args:
        n_classes: Number of classes, at least 1.

    Returns:
        ``["class_000", "class_001", ...]``, ``n_classes`` names in index order.

    Raises:
        ValueError: If ``n_classes`` is not an int >= 1.
    """
    n = _check_int("n_classes", n_classes, 1)
    width = max(3, len(str(n - 1)))
    return [f"class_{i:0{width}d}" for i in range(n)]


# --------------------------------------------------------------------------------------
# Class prototypes
# --------------------------------------------------------------------------------------


def _hsv(h: float, s: float, v: float) -> tuple[float, float, float]:
    """HSV to RGB in [0, 1]; hue wraps around, saturation and value are clamped."""
    r, g, b = colorsys.hsv_to_rgb(h % 1.0, min(max(s, 0.0), 1.0), min(max(v, 0.0), 1.0))
    return (r, g, b)


@dataclass(frozen=True)
class _ClassStyle:
    """Everything that is shared by the samples of one class."""

    hue: float  # ground/object hue in [0, 1), evenly spread over the classes
    sky_hue: float
    sky_sat: float
    ground_sat: float
    ground_val: float
    object_hue: float
    object_sat: float
    shape: int  # 0..._N_SHAPES-1
    petals: int  # star arms / rock bumps
    aspect: float  # object height / width
    n_objects: tuple[int, int]  # inclusive range
    object_scale: float  # typical object radius as a fraction of the image height
    horizon: float  # horizon height as a fraction of the image height
    ridge: float  # amplitude of the far mountain ridge, fraction of image height
    beta: float  # texture amplitude slope: amplitude ~ 1 / f**beta
    anisotropy: float  # >1: horizontal streaks, <1: vertical streaks
    texture: float  # texture contrast
    light: float  # light direction angle in radians
    tint: tuple[float, float]  # unit (Cb, Cr) direction of the texture's colour variation
    clutter: int  # at most this many small objects, at least half of it
    clutter_shape: int
    clutter_hue: float
    clutter_scale: float


def _tint(hue: float, turn: float) -> tuple[float, float]:
    """Unit (Cb, Cr) direction of the colour texture: mostly saturation changes of ``hue``.

    ``turn`` (radians) rotates it towards neighbouring hues, as grass goes from green to
    yellow or rock from grey to brown.
    """
    r, g, b = _hsv(hue, 1.0, 1.0)
    cb = -0.168736 * r - 0.331264 * g + 0.5 * b
    cr = 0.5 * r - 0.418688 * g - 0.081312 * b
    angle = math.atan2(cr, cb) + turn
    return (math.cos(angle), math.sin(angle))


@functools.lru_cache(maxsize=4096)
def _class_style(seed: int, class_index: int, n_classes: int) -> _ClassStyle:
    """Draw the look shared by all samples of a class (cached: it is drawn per image)."""
    rng = np.random.default_rng([_CLASS_TAG, seed, n_classes, class_index])
    # Hues evenly spread over the classes, with a seed-dependent rotation.
    hue = (class_index / n_classes + (seed * 0.618034) % 1.0) % 1.0
    # Daytime blue skies mostly, some dusk (orange) and overcast (low saturation) classes.
    sky_kind = rng.random()
    if sky_kind < 0.6:
        sky_hue, sky_sat = 0.55 + rng.uniform(-0.04, 0.06), rng.uniform(0.35, 0.7)
    elif sky_kind < 0.8:
        sky_hue, sky_sat = rng.uniform(0.02, 0.12), rng.uniform(0.35, 0.65)
    else:
        sky_hue, sky_sat = rng.uniform(0.0, 1.0), rng.uniform(0.03, 0.15)
    lo = 1 + class_index % 3
    return _ClassStyle(
        hue=hue,
        sky_hue=float(sky_hue),
        sky_sat=float(sky_sat),
        ground_sat=float(rng.uniform(0.35, 0.8)),
        ground_val=float(rng.uniform(0.35, 0.7)),
        object_hue=float((hue + 0.5 + rng.uniform(-0.12, 0.12)) % 1.0),
        object_sat=float(rng.uniform(0.45, 0.9)),
        shape=class_index % _N_SHAPES,
        petals=int(rng.integers(3, 9)),
        aspect=float(rng.uniform(0.6, 1.6)),
        n_objects=(lo, lo + int(rng.integers(1, 4))),
        object_scale=float(rng.uniform(0.09, 0.2)),
        horizon=float(rng.uniform(_HORIZON[0], _HORIZON[1])),
        ridge=float(rng.uniform(0.03, 0.18)),
        beta=float(rng.uniform(_BETA[0], _BETA[1])),
        anisotropy=float(np.exp(rng.uniform(-0.6, 0.6))),
        texture=float(rng.uniform(0.7, 1.3)),
        light=float(rng.uniform(-2.6, -0.5)),
        tint=_tint(hue, float(rng.uniform(-1.0, 1.0))),
        clutter=int(rng.integers(_CLUTTER[0], _CLUTTER[1] + 1)),
        clutter_shape=int(rng.integers(0, _N_SHAPES)),
        clutter_hue=float((hue + rng.uniform(-0.25, 0.25)) % 1.0),
        clutter_scale=float(rng.uniform(0.015, 0.04)),
    )


# --------------------------------------------------------------------------------------
# Building blocks
# --------------------------------------------------------------------------------------


def _image_size(rng: np.random.Generator) -> tuple[int, int]:
    """Draw an ImageNet-like (width, height)."""
    if rng.random() < 0.8:  # landscape
        width = 500 if rng.random() < 0.55 else int(rng.integers(350, 641))
        ratio = 0.75 if rng.random() < 0.6 else float(rng.uniform(0.56, 0.8))
        height = round(width * ratio)
    else:  # portrait
        height = 500 if rng.random() < 0.6 else int(rng.integers(440, 501))
        width = round(height * (0.75 if rng.random() < 0.6 else float(rng.uniform(0.7, 0.8))))
    return min(max(width, 350), 640), min(max(height, 250), 500)


def _fft_len(n: int) -> int:
    """Next multiple of 32 at or above ``n`` (FFT-friendly, few distinct plan sizes)."""
    return -(-n // 32) * 32


@functools.lru_cache(maxsize=64)
def _freq_grid(fh: int, fw: int) -> tuple[F32, F32, F32]:
    """Squared frequencies (cycles per pixel) of an ``irfft2`` grid: ``fy², fx², fy² + fx²``."""
    fy = np.fft.fftfreq(fh).astype(np.float32)[:, None]
    fx = np.fft.rfftfreq(fw).astype(np.float32)[None, :]
    grids = (fy * fy + np.zeros_like(fx), np.zeros_like(fy) + fx * fx, fy * fy + fx * fx)
    for grid in grids:
        grid.flags.writeable = False
    return grids


@functools.lru_cache(maxsize=64)
def _norm_weights(fh: int, fw: int, band: float) -> F32:
    """How often each rfft coefficient counts in the full spectrum (0 below ``band``)."""
    weights = np.full((fh, fw // 2 + 1), 2.0, dtype=np.float32)
    weights[:, 0] = 1.0  # the zero-frequency column has no mirror image
    if fw % 2 == 0:
        weights[:, -1] = 1.0  # neither has the Nyquist column
    if band > 0.0:
        weights[_freq_grid(fh, fw)[2] < np.float32(band * band)] = 0.0
    weights.flags.writeable = False
    return weights


def _pink_field(
    rng: np.random.Generator,
    height: int,
    width: int,
    beta: float,
    *,
    anisotropy: float = 1.0,
    knee: float = 0.0,
    band: float = 0.0,
    blur: float = 0.0,
    white: float = 0.0,
) -> F32:
    """2-D noise whose amplitude spectrum falls as ``1 / f**beta``, zero mean.

    With ``beta`` near 1 the power spectrum falls as ``1/f²``, like natural images. The field
    is scaled so that the part of its power law at frequencies of ``band`` cycles per pixel
    and above has an *expected* standard deviation of 1 (the realised one varies from draw
    to draw, as the contrast of photographs does). With ``band`` around 1/8 that pins the
    fine detail that JPEG has to spend bits on, and so the file size, whatever the slope.

    Args:
        rng: Random stream.
        height: Rows of the result.
        width: Columns of the result.
        beta: Spectral slope of the amplitude.
        anisotropy: Stretch of the spectrum; > 1 gives horizontal streaks, < 1 vertical ones.
        knee: Frequency (cycles per pixel) below which the spectrum flattens, so that the
            field has no structure much larger than ``1 / knee`` pixels; 0 for none.
        band: Lowest frequency that counts for the normalisation; 0 normalises the whole.
        blur: Gaussian low-pass sigma in pixels (defocus), 0 for none. Applied after the
            normalisation, so it does remove detail.
        white: Flat (white, sensor-noise-like) amplitude added at all frequencies, relative
            to the power law at the Nyquist frequency; added after the normalisation.
    """
    fh, fw = _fft_len(height), _fft_len(width)
    fy2, fx2, r2 = _freq_grid(fh, fw)
    f2 = fy2 * np.float32(1.0 / anisotropy) + fx2 * np.float32(anisotropy)
    f2 += np.float32(knee * knee)
    f2[0, 0] = 1.0
    amp = f2 ** np.float32(-beta / 2.0)
    amp[0, 0] = 0.0
    # Expected variance of the irfft2 output: the sum over the full (Hermitian) spectrum of
    # E|X|^2 = amp^2 / 6 (uniform coefficients, below), divided by N^2.
    power = amp * amp
    power *= _norm_weights(fh, fw, band)
    total = float(power.sum(dtype=np.float64))
    scale = (fh * fw) / math.sqrt(max(total, 1e-30) / 6.0)
    if white > 0.0:
        amp += np.float32(white * 0.5**-beta)
        amp[0, 0] = 0.0
    if blur > 0.0:
        amp *= np.exp(r2 * np.float32(-2.0 * (math.pi * blur) ** 2))
    amp *= np.float32(scale)
    # Uniform rather than Gaussian coefficients: five times cheaper to draw, and the inverse
    # FFT sums so many of them that the field is Gaussian all the same.
    shape = amp.shape
    spec = np.empty(shape, dtype=np.complex64)
    spec.real = rng.random(shape, dtype=np.float32)
    spec.imag = rng.random(shape, dtype=np.float32)
    spec -= np.complex64(0.5 + 0.5j)
    spec *= amp
    field = np.fft.irfft2(spec, s=(fh, fw))[:height, :width]
    return np.ascontiguousarray(field, dtype=np.float32)


def _smooth_field(rng: np.random.Generator, height: int, width: int) -> F32:
    """Three planes of low-frequency noise, about unit std, shape (3, H, W); cheap clouds."""
    small_h, small_w = max(8, height // 8), max(8, width // 8)
    planes = np.stack([_pink_field(rng, small_h, small_w, 1.6) for _ in range(3)], axis=-1)
    planes *= np.float32(40.0)
    planes += np.float32(128.0)
    packed = np.clip(planes, 0.0, 255.0).astype(np.uint8)
    img = Image.fromarray(packed).resize((width, height), Image.Resampling.BICUBIC)
    out = np.ascontiguousarray(np.asarray(img).transpose(2, 0, 1), dtype=np.float32)
    out -= np.float32(128.0)
    out *= np.float32(1.0 / 40.0)
    return out


def _fractal_line(rng: np.random.Generator, width: int, beta: float) -> F32:
    """A 1-D fractal profile (zero mean, unit std) for horizons and ridges."""
    n = _fft_len(width) * 2
    freqs = np.fft.rfftfreq(n)
    freqs[0] = 1.0
    amp = freqs**-beta
    amp[0] = 0.0
    spec = (rng.standard_normal(freqs.shape) + 1j * rng.standard_normal(freqs.shape)) * amp
    line = np.fft.irfft(spec, n=n)[:width]
    line = (line - line.mean()) / (line.std() + 1e-9)
    return _f32(line)


def _shape_distance(shape: int, u: F32, v: F32, petals: int, phase: float) -> F32:
    """Normalised distance of object-frame coordinates to a shape: < 1 inside, 1 on the edge."""
    if shape == 0:  # blob (ellipse)
        return _f32(np.sqrt(u * u + v * v))
    if shape == 1:  # rounded box / building
        return _f32((np.abs(u) ** 6 + np.abs(v) ** 6) ** np.float32(1 / 6))
    r = np.sqrt(u * u + v * v)
    theta = np.arctan2(v, u)
    if shape == 2:  # star / flower
        return _f32(r / (np.float32(0.62) + np.float32(0.38) * np.cos(petals * theta + phase)))
    if shape == 3:  # ring
        return _f32(np.abs(r - np.float32(0.68)) / np.float32(0.32))
    if shape == 4:  # tree / cone: narrows towards the top (v = -1)
        half_width = np.clip((v + np.float32(1.0)) * np.float32(0.5), 0.02, None) ** np.float32(0.8)
        return _f32(np.maximum(np.abs(u) / half_width, np.abs(v)))
    # rock: lumpy blob
    bumps = (
        np.float32(1.0)
        + np.float32(0.18) * np.cos(petals * theta + phase)
        + np.float32(0.09) * np.cos(np.float32(2.3 * petals) * theta)
    )
    return _f32(r / bumps)


def _f32(array: object) -> F32:
    """``array`` as float32 (no copy when it already is)."""
    return np.asarray(array, dtype=np.float32)


def _rgb(color: tuple[float, float, float]) -> F32:
    """A colour as a (3, 1, 1) array, to broadcast against channel-first images."""
    return np.asarray(color, dtype=np.float32).reshape(3, 1, 1)


# --------------------------------------------------------------------------------------
# Scene
# --------------------------------------------------------------------------------------


def _blend(dst: F32, src: F32 | float, weight: F32) -> None:
    """``dst = dst + (src - dst) * weight``, in place."""
    tmp = src - dst
    tmp *= weight
    dst += tmp


@dataclass(frozen=True)
class _Object:
    """One object of a scene, in image-height units (``cx`` in image-width units)."""

    shape: int
    cx: float
    base_y: float  # where it touches the ground
    radius: float
    aspect: float  # height / width
    rot: float
    phase: float
    softness: float  # edge width, in pixels
    color: tuple[float, float, float]
    shadow: bool


def _draw_object(
    img: F32, detail: F32, ys: F32, xs: F32, obj: _Object, petals: int, lx: float, ly: float
) -> None:
    """Draw a shaded object (and its cast shadow) into ``img`` and ``detail``, in place."""
    height, width = detail.shape
    ry = obj.radius * obj.aspect
    rx = obj.radius * height / width
    cx, base_y = obj.cx, obj.base_y
    cy = base_y - ry * 0.85  # objects stand on the ground
    y0 = max(0, int((cy - ry * 1.3) * height))
    y1 = min(height, int((base_y + ry * 0.5) * height) + 2)
    x0 = max(0, int((cx - rx * 1.6) * width))
    x1 = min(width, int((cx + rx * 1.6) * width) + 2)
    if y1 - y0 < 3 or x1 - x0 < 3:
        return
    yy = ys[y0:y1]
    xx = xs[:, x0:x1]
    patch = img[:, y0:y1, x0:x1]
    if obj.shadow:  # a flattened soft ellipse at the base, away from the light
        su = (xx - np.float32(cx - lx * rx * 0.6)) / np.float32(rx * 1.3)
        sv = (yy - np.float32(base_y)) / np.float32(ry * 0.18)
        shadow = np.clip(np.float32(1.2) - np.sqrt(su * su + sv * sv), 0.0, 1.0)
        patch *= np.float32(1.0) - np.float32(0.45) * shadow
    # the body, in its rotated frame, with fake sphere shading
    du = (xx - np.float32(cx)) / np.float32(rx)
    dv = (yy - np.float32(cy)) / np.float32(ry)
    cr, sr = np.float32(math.cos(obj.rot)), np.float32(math.sin(obj.rot))
    u = du * cr - dv * sr
    v = du * sr + dv * cr
    d = _shape_distance(obj.shape, u, v, petals, obj.phase)
    edge = np.float32(max(1.0 / (ry * height), 0.01) * obj.softness)
    mask = np.clip((np.float32(1.0) - d) / edge, 0.0, 1.0)
    nz = np.sqrt(np.float32(1.0) - np.minimum(d, np.float32(1.0)) ** 2)
    lambert = np.float32(0.35) * nz - np.float32(0.5) * (
        u * np.float32(lx) + v * np.float32(ly)
    ) * (np.float32(1.0) - np.float32(0.5) * nz)
    lambert = np.clip(lambert + np.float32(0.6), 0.1, 1.3)
    _blend(patch, _rgb(obj.color) * lambert, mask)
    sub = detail[y0:y1, x0:x1]
    sub += (np.float32(0.12) - sub) * mask


def _render_base(
    rng: np.random.Generator, style: _ClassStyle, height: int, width: int
) -> tuple[F32, F32]:
    """Render the smooth part of a scene, channel-first, at (height, width).

    Returns:
        ``(rgb, detail)``: colours in [0, 1], shape (3, H, W), and the per-pixel strength of
        the fine texture that is added later at full resolution, shape (H, W).
    """
    ys = np.linspace(0.0, 1.0, height, dtype=np.float32)[:, None]
    xs = np.linspace(0.0, 1.0, width, dtype=np.float32)[None, :]
    aa = np.float32(height / 1.2)  # about one pixel of anti-aliasing on horizons

    def jitter(scale: float) -> float:
        return float(rng.uniform(-scale, scale))

    hue = style.hue + jitter(0.035)
    horizon = style.horizon + jitter(0.07)
    lowfreq = _smooth_field(rng, height, width)

    # ---- sky: vertical gradient plus soft clouds
    sky_top = _rgb(
        _hsv(style.sky_hue + jitter(0.02), style.sky_sat + jitter(0.1), 0.55 + jitter(0.1))
    )
    sky_low = _rgb(_hsv(style.sky_hue + jitter(0.04), style.sky_sat * 0.45, 0.92 + jitter(0.05)))
    t_sky = np.clip(ys / np.float32(max(horizon, 0.05)), 0.0, 1.0) ** np.float32(0.8)
    sky = sky_top + (sky_low - sky_top) * t_sky  # (3, H, 1)
    clouds = np.clip(lowfreq[0] * np.float32(0.7) + np.float32(jitter(0.4)), 0.0, 1.0)
    img = sky + (np.float32(0.97) - sky) * (clouds * np.float32(0.5 + jitter(0.2)))
    detail = np.float32(0.01) + np.float32(0.02) * clouds

    # ---- far mountain ridge, hazy
    ridge_line = (
        horizon
        - style.ridge * (1.0 + jitter(0.4)) * (1.0 + 0.45 * _fractal_line(rng, width, 1.7))
        - 0.01
    )
    ridge_mask = np.clip((ys - ridge_line[None, :]) * aa + np.float32(0.5), 0.0, 1.0)
    ridge_col = _rgb(_hsv(hue + 0.05, style.ground_sat * 0.4, style.ground_val * 0.8 + 0.15))
    ridge_col = ridge_col * np.float32(0.65) + sky_low * np.float32(0.35)
    _blend(img, ridge_col, ridge_mask)
    _blend(detail, 0.2, ridge_mask)

    # ---- ground with a rough horizon; nearer ground is darker and more detailed
    ground_line = horizon + 0.015 * _fractal_line(rng, width, 1.3)
    ground_mask = np.clip((ys - ground_line[None, :]) * aa + np.float32(0.5), 0.0, 1.0)
    g_far = _rgb(_hsv(hue + jitter(0.02), style.ground_sat * 0.8, style.ground_val + 0.1))
    g_near = _rgb(_hsv(hue + 0.03 + jitter(0.02), style.ground_sat, style.ground_val * 0.75))
    t_ground = np.clip((ys - horizon) / np.float32(max(1.0 - horizon, 0.05)), 0.0, 1.0)
    ground = (g_far + (g_near - g_far) * t_ground) * (
        np.float32(1.0) + np.float32(_GROUND_MOD) * lowfreq[1]
    )
    _blend(img, ground, ground_mask)
    _blend(detail, np.float32(0.26) + np.float32(0.1) * t_ground, ground_mask)

    # ---- objects: a few class objects, one of them a large "subject" near the middle, and
    # small clutter (pebbles, flowers, tufts) in the class's clutter shape; drawn far to near
    light = style.light + jitter(0.4)
    lx, ly = math.cos(light), math.sin(light)
    objects: list[_Object] = []
    n_obj = int(rng.integers(style.n_objects[0], style.n_objects[1] + 1))
    subject = int(rng.integers(0, n_obj))
    for k in range(n_obj):
        base_y = float(rng.uniform(horizon - 0.05, 0.97))
        depth = (base_y - horizon + 0.1) / (1.0 - horizon + 0.1)
        radius = style.object_scale * (0.45 + 0.9 * depth) * math.exp(rng.normal(0.0, 0.2))
        cx = float(rng.uniform(0.05, 0.95))
        if k == subject:
            radius = max(radius * 1.6, style.object_scale * 1.3)
            cx = 0.5 + jitter(0.2)
        color = _hsv(
            style.object_hue + jitter(0.04), style.object_sat + jitter(0.15), 0.6 + jitter(0.3)
        )
        objects.append(
            _Object(
                shape=style.shape,
                cx=cx,
                base_y=base_y,
                radius=radius,
                aspect=style.aspect * (1.0 + jitter(0.2)),
                rot=jitter(0.25),
                phase=jitter(math.pi),
                softness=float(rng.uniform(1.0, 3.0)),
                color=color,
                shadow=True,
            )
        )
    n_clutter = int(rng.integers(style.clutter // 2, style.clutter + 1))
    for _ in range(n_clutter):
        base_y = float(rng.uniform(horizon + 0.02, 1.05))
        depth = (base_y - horizon + 0.05) / (1.0 - horizon + 0.05)
        radius = style.clutter_scale * (0.3 + depth) * math.exp(rng.normal(0.0, 0.3))
        color = _hsv(
            style.clutter_hue + jitter(0.06), style.object_sat + jitter(0.2), 0.55 + jitter(0.4)
        )
        objects.append(
            _Object(
                shape=style.clutter_shape,
                cx=float(rng.uniform(0.0, 1.0)),
                base_y=base_y,
                radius=radius,
                aspect=1.0 + jitter(0.4),
                rot=jitter(math.pi),
                phase=jitter(math.pi),
                softness=1.0,
                color=color,
                shadow=False,
            )
        )
    objects.sort(key=lambda o: o.base_y)
    for obj in objects:
        _draw_object(img, detail, ys, xs, obj, style.petals, lx, ly)

    # ---- colour cast, vignette, exposure
    vignette = np.float32(1.0) - np.float32(rng.uniform(0.1, 0.5)) * (
        (xs - np.float32(0.5)) ** 2 + (ys - np.float32(0.5)) ** 2
    )
    vignette *= np.float32(math.exp(rng.normal(0.0, 0.1)))
    lowfreq *= np.float32(0.05)
    lowfreq += vignette
    img *= lowfreq
    return img, detail


# JFIF (full-range BT.601) RGB -> YCbCr, as rows of (Y, Cb, Cr) weights on 0-255 values.
_RGB_TO_YCBCR = (
    np.asarray(
        [[0.299, 0.587, 0.114], [-0.168736, -0.331264, 0.5], [0.5, -0.418688, -0.081312]],
        dtype=np.float32,
    )
    * np.float32(255.0)
)[:, :, None, None]


def _tone_curve(luma: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """Camera-like tone curve: identity between toe and shoulder, soft roll-off outside.

    Values beyond ``[_TOE, _SHOULDER]`` approach 0 and 255 along a tanh instead of clipping.
    """
    lo, hi = _TOE, _SHOULDER
    out = np.clip(luma, lo, hi)
    out += (255.0 - hi) * np.tanh(np.maximum(luma - hi, 0.0) / (255.0 - hi))
    out -= lo * np.tanh(np.maximum(lo - luma, 0.0) / lo)
    return out


# Luma -> uint8 lookup table for the tone curve: entry i is for luma i / _LUT_STEPS - offset.
_LUT_STEPS = 4
_LUT_OFFSET = 256.0
_TONE_LUT = np.clip(
    _tone_curve(np.arange(768 * _LUT_STEPS) / _LUT_STEPS - _LUT_OFFSET + 0.5 / _LUT_STEPS) + 0.5,
    0.0,
    255.0,
).astype(np.uint8)


def _render(seed: int, class_index: int, sample_index: int, n_classes: int) -> Image.Image:
    """Render one scene as a JPEG-ready ``YCbCr`` (JFIF, full range) Pillow image."""
    style = _class_style(seed, class_index, n_classes)
    rng = np.random.default_rng([_SAMPLE_TAG, seed, n_classes, class_index, sample_index])
    width, height = _image_size(rng)
    texture = style.texture * math.exp(rng.normal(0.0, 0.15))  # contrast of this sample
    # every lens blurs a little; a fifth of the shots are also somewhat out of focus
    blur = float(rng.uniform(0.4, 1.0)) if rng.random() < 0.2 else _OLPF
    grain = float(rng.uniform(_GRAIN[0], _GRAIN[1]))  # sensor noise floor
    knee = 1.0 / float(rng.uniform(_KNEE[0], _KNEE[1]))

    # The smooth content is drawn at half resolution and upsampled by Pillow.
    half_h, half_w = (height + 1) // 2, (width + 1) // 2
    rgb, detail = _render_base(rng, style, half_h, half_w)
    m = _RGB_TO_YCBCR
    ycc = m[:, 0] * rgb[0]
    ycc += m[:, 1] * rgb[1]
    ycc += m[:, 2] * rgb[2]
    # Colour texture (lichen on rock, flowers in grass) along the class's tint direction.
    tint = _pink_field(rng, half_h, half_w, style.beta, anisotropy=style.anisotropy, knee=knee * 2)
    tint *= detail
    tint *= ycc[0]
    tint *= np.float32(texture * _CHROMA_DETAIL)
    # Chroma: JPEG keeps it at half resolution (4:2:0) and libjpeg averages 2x2 blocks, so
    # nearest-neighbour upsampling hands the encoder (nearly) the half-resolution values.
    packed = np.zeros((half_h, half_w, 4), dtype=np.uint8)
    plane = np.empty((half_h, half_w), dtype=np.float32)
    for c in (1, 2):
        np.multiply(tint, np.float32(style.tint[c - 1]), out=plane)
        plane += ycc[c]
        plane += np.float32(128.5)
        packed[..., c] = np.clip(plane, 0.0, 255.0, out=plane)
    small = Image.frombuffer("RGBX", (half_w, half_h), packed, "raw", "RGBX", 0, 1)
    _, cb, cr, _ = small.resize((width, height), Image.Resampling.NEAREST).split()
    # Luma and texture strength: smooth upsampling, then a full-resolution 1/f texture
    # (with a white sensor-noise floor) of ``detail`` times the local amplitude.
    size = (width, height)
    luma = np.asarray(Image.fromarray(ycc[0]).resize(size, Image.Resampling.BICUBIC))
    strength = np.asarray(Image.fromarray(detail).resize(size, Image.Resampling.BILINEAR))
    tex = _pink_field(
        rng,
        height,
        width,
        style.beta,
        anisotropy=style.anisotropy,
        knee=knee,
        band=_BAND,
        blur=blur,
        white=grain,
    )
    tex *= strength
    # amplitude in grey levels, a little larger on bright surfaces than on dark ones
    amp = luma * np.float32(_LUMA_LINK)
    amp += np.float32(128.0 * (1.0 - _LUMA_LINK))
    amp *= np.float32(texture * _TEXTURE_GAIN)
    tex *= amp
    tex += luma
    # Tone curve (soft toe and shoulder instead of hard clipping), through a lookup table.
    tex += np.float32(_LUT_OFFSET)
    tex *= np.float32(_LUT_STEPS)
    np.clip(tex, 0.0, np.float32(len(_TONE_LUT) - 1), out=tex)
    y = Image.fromarray(_TONE_LUT[tex.astype(np.intp)])
    return Image.merge("YCbCr", (y, cb, cr))


def make_jpeg(seed: int, class_index: int, sample_index: int, n_classes: int) -> bytes:
    """Render one deterministic synthetic photograph and encode it as a baseline JPEG.

    Args:
        seed: Dataset seed, an int >= 0. Changes every image and the class look.
        class_index: Class of the image, ``0 <= class_index < n_classes``.
        sample_index: Index of the image, an int >= 0; distinct indices give distinct images.
        n_classes: Number of classes in the dataset, >= 1 (class hues are spread over it).

    Returns:
        The bytes of a baseline JFIF file (YCbCr 4:2:0, quality 88-92) that decodes to RGB.
        Same arguments, same bytes.

    Raises:
        ValueError: If an argument is out of range.
    """
    seed = _check_int("seed", seed, 0)
    n_classes = _check_int("n_classes", n_classes, 1)
    class_index = _check_int("class_index", class_index, 0)
    sample_index = _check_int("sample_index", sample_index, 0)
    if class_index >= n_classes:
        raise ValueError(f"class_index must be in [0, n_classes={n_classes}), got {class_index}")
    image = _render(seed, class_index, sample_index, n_classes)
    rng = np.random.default_rng([_SAMPLE_TAG + 1, seed, n_classes, class_index, sample_index])
    quality = int(rng.integers(_QUALITY[0], _QUALITY[1] + 1))
    buf = io.BytesIO()
    image.save(buf, format="JPEG", quality=quality, subsampling="4:2:0")
    return buf.getvalue()


# --------------------------------------------------------------------------------------
# ImageFolder writer
# --------------------------------------------------------------------------------------


def _write_one(job: tuple[str, int, int, int, int]) -> str:
    """Process-pool worker: render one image and write it atomically. Top level: spawn-safe."""
    path, seed, class_index, index, n_classes = job
    data = make_jpeg(seed, class_index, index, n_classes)
    target = pathlib.Path(path)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def generate_imagefolder(
    dest: str | os.PathLike[str],
    n_images: int,
    n_classes: int,
    *,
    seed: int = 0,
    workers: int | None = None,
) -> list[pathlib.Path]:
    """Write a synthetic dataset in ``torchvision`` ImageFolder layout.

    Image ``i`` (``0 <= i < n_images``) belongs to class ``i % n_classes`` (round-robin, so the
    classes are balanced to within one image) and is written to
    ``dest/<class_name>/<class_name>_<i:06d>.jpg`` with the bytes of
    ``make_jpeg(seed, i % n_classes, i, n_classes)``. Because an image depends only on its own
    index, a larger ``n_images`` gives a superset of a smaller one.

    The call is idempotent: files are rewritten atomically with the same bytes. Files that
    are already in ``dest`` and not part of this dataset are left alone. When ``n_classes >
    n_images`` only the first ``n_images`` class folders are created.

    Args:
        dest: Root folder; created if missing.
        n_images: Number of images, an int >= 1.
        n_classes: Number of classes, an int >= 1.
        seed: Dataset seed, an int >= 0.
        workers: Worker processes. ``None`` means ``os.cpu_count()``; ``1`` renders in this
            process. The pool uses the ``spawn`` start method on every platform, so it is
            safe to call from a process that runs threads (an event loop, an S3 server, ...)
            and the bytes do not depend on the platform's default; as with any spawned
            pool, a calling *script* needs the ``if __name__ == "__main__":`` guard.

    Returns:
        The paths of the ``n_images`` files written, sorted.

    Raises:
        ValueError: If an argument is out of range.
    """
    n_images = _check_int("n_images", n_images, 1)
    names = class_names(n_classes)
    n_classes = len(names)
    seed = _check_int("seed", seed, 0)
    n_workers = (os.cpu_count() or 1) if workers is None else _check_int("workers", workers, 1)
    n_workers = min(n_workers, n_images)

    root = pathlib.Path(dest)
    jobs: list[tuple[str, int, int, int, int]] = []
    for c in range(min(n_classes, n_images)):
        (root / names[c]).mkdir(parents=True, exist_ok=True)
    for i in range(n_images):
        c = i % n_classes
        path = root / names[c] / f"{names[c]}_{i:06d}.jpg"
        jobs.append((os.fspath(path), seed, c, i, n_classes))

    if n_workers == 1:
        written = [_write_one(job) for job in jobs]
    else:
        chunksize = max(1, min(32, len(jobs) // (n_workers * 8)))
        ctx = multiprocessing.get_context("spawn")
        with concurrent.futures.ProcessPoolExecutor(max_workers=n_workers, mp_context=ctx) as pool:
            written = list(pool.map(_write_one, jobs, chunksize=chunksize))
    return sorted(pathlib.Path(p) for p in written)
