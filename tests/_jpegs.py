"""Real JPEGs of chosen sizes, for tests that need many varied images, fast.

``pack`` decodes every image before packing it, so random bytes named ``.jpg`` are no
longer a dataset: :func:`jpeg_of` makes an 8x8 grey JPEG of noise and pads it with
comment (``COM``) segments, which decoders skip, to the size asked for.
"""

from __future__ import annotations

import io
import random

from PIL import Image

__all__ = ["SMALLEST", "jpeg_of"]

SMALLEST = 200
"""No JPEG :func:`jpeg_of` makes is smaller than about this many bytes (its tables)."""

_COM = 65535 + 2  # the largest comment segment, marker included


def jpeg_of(rng: random.Random, size: int) -> bytes:
    """A decodable JPEG, different for each draw of ``rng``, of ``size`` bytes.

    Exactly ``size`` where ``size`` is above :data:`SMALLEST`, give or take 3 bytes.
    """
    out = io.BytesIO()
    Image.frombytes("L", (8, 8), rng.randbytes(64)).save(out, "JPEG", quality=50, optimize=True)
    core = out.getvalue()
    pad = size - len(core)
    segments = []
    while pad >= 4:
        total = min(pad, _COM)
        if 0 < pad - total < 4:
            total -= 4
        body = rng.randbytes(total - 4)
        segments.append(b"\xff\xfe" + (total - 2).to_bytes(2, "big") + body)
        pad -= total
    return core[:2] + b"".join(segments) + core[2:]
