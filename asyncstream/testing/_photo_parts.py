"""The building blocks of the synthetic photographs (see :mod:`._photos`): tuning
constants, argument checks, class names and per-class styles, image sizes, 1/f texture
fields, fractal lines and object shapes."""

from __future__ import annotations

import colorsys
import functools
import math
from dataclasses import dataclass
from typing import TypeAlias

import numpy as np
import numpy.typing as npt
from PIL import Image

__all__ = ["F32", "class_names"]

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
