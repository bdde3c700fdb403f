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

The module is private; :mod:`asyncstream.testing` exports what the demo, the benchmark and
the tests use. The building blocks are in :mod:`._photo_parts`, the ImageFolder writer in
:mod:`._datagen`.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from PIL import Image

from ._photo_parts import (
    _BAND,
    _CHROMA_DETAIL,
    _GRAIN,
    _GROUND_MOD,
    _KNEE,
    _LUMA_LINK,
    _OLPF,
    _QUALITY,
    _SAMPLE_TAG,
    _SHOULDER,
    _TEXTURE_GAIN,
    _TOE,
    F32,
    _check_int,
    _class_style,
    _ClassStyle,
    _fractal_line,
    _hsv,
    _image_size,
    _pink_field,
    _rgb,
    _shape_distance,
    _smooth_field,
)

__all__ = ["make_jpeg"]


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
