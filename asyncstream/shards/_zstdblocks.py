"""Where to cut zstd input so that one decompress call makes a bounded output.

``zstandard``'s ``decompressobj().decompress(data)`` returns everything ``data`` decodes
to, with no output limit: a few kilobytes of RLE blocks (4 bytes each, up to 128 KiB of
output) make gigabytes. :class:`ZstdCuts` reads a stream's frame and block headers as its
bytes go by (RFC 8878: a frame header, then blocks, each with a 3-byte header giving its
type and size, then an optional checksum; skippable frames), and cuts the input where the
blocks begun so far could decode to more than a bound: a raw or RLE block decodes to its
stated size, a compressed one to at most 128 KiB. Input of ordinary data goes through in
pieces of megabytes; a bomb, 64 blocks at a time.

The decompressor stays the judge of what is valid: a header this reader cannot follow (a
bad magic number, a reserved block type) ends the cutting, and the decompressor raises on
those bytes before it writes any output for them. A cut also falls at each frame's end, so
the decompressor, which stops there, leaves nothing unread behind it.
"""

from __future__ import annotations

__all__ = ["ZstdCuts"]

_MAGIC = 0xFD2FB528
_SKIPPABLE, _SKIPPABLE_MASK = 0x184D2A50, 0xFFFFFFF0
_BLOCK_MAX = 128 << 10  # the most one block decodes to
_DICT_ID = (0, 1, 2, 4)
_CONTENT_SIZE = (0, 2, 4, 8)
# What the next header bytes are: a frame's magic, a frame header descriptor, a
# skippable frame's size, a block header; or nothing more to follow (left to zstd).
_FRAME, _DESCRIPTOR, _SKIP_SIZE, _BLOCK, _LOST = range(5)
_WANT = {_FRAME: 4, _DESCRIPTOR: 1, _SKIP_SIZE: 4, _BLOCK: 3}


class ZstdCuts:
    """The headers of one zstd stream, followed across the pieces it is fed in."""

    __slots__ = ("_checksum", "_head", "_skip", "_state")

    def __init__(self) -> None:
        self._state = _FRAME
        self._head = b""  # the bytes of the header being read, so far
        self._skip = 0  # bytes to pass before the next header
        self._checksum = False  # the frame ends with a 4-byte checksum

    def cut(self, buf: memoryview, limit: int) -> int:
        """How many bytes of ``buf`` (the stream's next bytes) to decompress next: at least
        one where ``buf`` is not empty; up to the end of a frame, and no further than the
        blocks begun make ``limit`` bytes of output (or one block, if that alone is more).
        The bytes returned are taken as fed."""
        n, at, out = len(buf), 0, 0
        while at < n:
            if self._skip:
                step = min(self._skip, n - at)
                self._skip -= step
                at += step
                if self._skip == 0 and self._state == _FRAME:
                    return at  # a frame ended: the decompressor stops there
                continue
            if self._state == _LOST:
                return n
            need = _WANT[self._state] - len(self._head)
            take = bytes(buf[at : at + need])
            if len(take) < need:  # the header goes on in the next piece
                self._head += take
                return n
            head, self._head = self._head + take, b""
            if self._state == _BLOCK:
                value = int.from_bytes(head, "little")
                bound = _bound(value)
                if out and out + bound > limit:
                    self._head = head[: len(head) - len(take)]  # not taken: cut before
                    return at
                out += bound
                self._block(value)
            else:
                self._frame_part(int.from_bytes(head, "little"))
            at += need
            if self._state == _FRAME and self._skip == 0:
                return at  # an empty frame's end
        return n

    def _frame_part(self, value: int) -> None:
        """A frame's magic, descriptor or skippable size, read."""
        state = self._state
        if state == _FRAME:
            if value == _MAGIC:
                self._state = _DESCRIPTOR
            elif value & _SKIPPABLE_MASK == _SKIPPABLE:
                self._state = _SKIP_SIZE
            else:
                self._state = _LOST
        elif state == _SKIP_SIZE:
            self._state, self._skip = _FRAME, value
        else:  # the frame header descriptor: the rest of the header is skipped
            single = (value >> 5) & 1
            fcs = _CONTENT_SIZE[value >> 6] or single
            self._skip = (1 - single) + _DICT_ID[value & 3] + fcs
            self._checksum = bool((value >> 2) & 1)
            self._state = _BLOCK

    def _block(self, value: int) -> None:
        """A block header, read: its contents (and the checksum after the last) skipped."""
        last, kind, size = value & 1, (value >> 1) & 3, value >> 3
        if kind == 3:  # reserved: zstd refuses it
            self._state = _LOST
            return
        self._skip = 1 if kind == 1 else size
        if last:
            self._skip += 4 if self._checksum else 0
            self._state = _FRAME


def _bound(value: int) -> int:
    """The most bytes the block of the header ``value`` decodes to."""
    kind, size = (value >> 1) & 3, value >> 3
    if kind == 3:
        return 0
    return min(size, _BLOCK_MAX) if kind != 2 else _BLOCK_MAX
