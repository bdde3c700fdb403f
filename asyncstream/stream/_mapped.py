"""A per-sample stage on a stream (decode, transform) that keeps the stream's exact resume.

``stream.map(fn)`` is an ``IterableDataset`` that yields ``fn(sample)`` for each sample
of the stream, in the process that reads it (a DataLoader worker, where CPU decode and
augmentation belong). It forwards ``state_dict`` / ``load_state_dict`` (and
``set_epoch``, ``len``, ``batches``) to the stream, so torchdata's StatefulDataLoader saves
and restores the stream's own position: a resume opens the saved shards at the saved
chunk, with no sample read or decoded twice. A user's own wrapping ``IterableDataset``
that does not forward the state still resumes, but by fast-forwarding: torchdata then
re-reads (and re-decodes) every sample before the checkpoint.

Since ``fn`` runs on each sample as it is drawn, the stream's position after a sample is
the position after its output: exact, whatever ``fn`` does, provided it is a function of
the sample (a random augmentation draws from the worker's RNG, which torch seeds per
worker and epoch, and which no checkpoint restores, as with any DataLoader).
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from torch.utils.data import IterableDataset

from .._exceptions import DecodeError

if TYPE_CHECKING:
    from PIL import Image

__all__ = ["IMAGE_KEYS", "MappedStream", "Resumable", "decode_image"]

T = TypeVar("T")
U = TypeVar("U")

IMAGE_KEYS = ("jpg", "jpeg", "png", "webp", "bmp", "tif", "tiff")


class Resumable(Protocol):
    """What a stage forwards to the stream under it: :class:`~asyncstream.ShardStream`'s
    samples, epoch, length, state and statistics. A protocol, so that this module stands
    below the stream whose :meth:`~asyncstream.ShardStream.map` makes stages."""

    @property
    def epoch(self) -> int: ...

    def __iter__(self) -> Iterator[dict[str, Any]]: ...

    def __len__(self) -> int: ...

    def batches(self, batch_size: int, *, num_workers: int = 0, drop_last: bool = False) -> int: ...

    def set_epoch(self, epoch: int) -> None: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: Any) -> None: ...

    def stats(self) -> dict[str, Any]: ...

    def close(self) -> None: ...


class MappedStream(IterableDataset[T], Generic[T]):
    """``fn(sample)`` for each sample of a :class:`~asyncstream.ShardStream`, resumable.

    Made by :meth:`ShardStream.map` (or :meth:`map` on another MappedStream, to chain).
    The stream's state, epoch and length are this stage's: ``state_dict``,
    ``load_state_dict``, ``set_epoch``, ``epoch``, ``len``, :meth:`batches`, ``stats``
    and ``close`` go to the stream. Give ``fn`` as a module-level function where the
    DataLoader spawns its workers (it is pickled then); forked workers take any callable.

    Args:
        source: the stream, or a stage on it.
        fn: called with each sample dict (or the previous stage's output).
    """

    def __init__(self, source: Resumable | MappedStream[Any], fn: Callable[[Any], T]) -> None:
        if not callable(fn):
            raise TypeError(f"fn must be callable, got {type(fn).__name__}")
        self._source = source
        self._fn = fn

    def __repr__(self) -> str:
        name = getattr(self._fn, "__qualname__", type(self._fn).__name__)
        return f"{self._source!r}.map({name})"

    def __iter__(self) -> Iterator[T]:
        return map(self._fn, iter(self._source))

    def map(self, fn: Callable[[T], U]) -> MappedStream[U]:
        """Another stage after this one."""
        return MappedStream(self, fn)

    @property
    def stream(self) -> Resumable:
        """The stream under every stage (the :class:`~asyncstream.ShardStream`)."""
        source = self._source
        return source if not isinstance(source, MappedStream) else source.stream

    @property
    def epoch(self) -> int:
        """The stream's :attr:`~asyncstream.ShardStream.epoch`."""
        return self.stream.epoch

    def __len__(self) -> int:
        return len(self.stream)

    def batches(self, batch_size: int, *, num_workers: int = 0, drop_last: bool = False) -> int:
        """The stream's :meth:`~asyncstream.ShardStream.batches`."""
        return self.stream.batches(batch_size, num_workers=num_workers, drop_last=drop_last)

    def set_epoch(self, epoch: int) -> None:
        """The stream's :meth:`~asyncstream.ShardStream.set_epoch`."""
        self.stream.set_epoch(epoch)

    def state_dict(self) -> dict[str, Any]:
        """The stream's state: where the next sample, and so the next output, comes from."""
        return self.stream.state_dict()

    def load_state_dict(self, state: Any) -> None:
        """The stream's :meth:`~asyncstream.ShardStream.load_state_dict`."""
        self.stream.load_state_dict(state)

    def stats(self) -> dict[str, Any]:
        """The stream's statistics."""
        return self.stream.stats()

    def close(self) -> None:
        """Close the stream."""
        self.stream.close()

    def __enter__(self) -> MappedStream[T]:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def decode_image(
    sample: dict[str, Any], keys: Sequence[str] = IMAGE_KEYS, mode: str | None = "RGB"
) -> Image.Image:
    """The sample's image, decoded with Pillow (as webdataset's ``decode("pil")``).

    Args:
        sample: a stream sample.
        keys: the members that may hold the encoded image, tried in order; default every
            extension ``asyncstream pack`` writes, and ``jpeg``, ``tif``, ``tiff``.
        mode: convert to this Pillow mode (``"RGB"``); ``None`` keeps the file's.

    Raises:
        DecodeError: no such member, or its bytes do not decode (naming the shard, the
            key and the member).
    """
    from PIL import Image, UnidentifiedImageError

    where = f"sample {sample.get('__key__')!r} of {sample.get('__url__')}"
    for key in keys:
        data = sample.get(key)
        if data is None:
            continue
        try:
            image = Image.open(io.BytesIO(data))
            image.load()
        except (OSError, UnidentifiedImageError, ValueError) as exc:
            raise DecodeError(f"{where}: {key!r} does not decode ({exc})") from exc
        return image.convert(mode) if mode is not None and image.mode != mode else image
    members = sorted(k for k in sample if not k.startswith("__"))
    raise DecodeError(f"{where} has no image member among {list(keys)} (it has {members})")
