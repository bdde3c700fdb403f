"""ShardLoader: torchdata's StatefulDataLoader, with a ``len()`` that is the truth.

A DataLoader over an ``IterableDataset`` computes ``len(loader)`` as
``ceil(len(dataset) / batch_size)`` (``floor`` with ``drop_last``), but its workers each
batch their own share of the epoch: with ``W`` workers up to ``W`` batches come out
short, so more batches come out than that (1,000 samples, batches of 16, 2 workers: 63
by the formula, 64 in fact), and with ``drop_last`` up to ``W`` short batches are dropped
(fewer). The dataset alone cannot fix it: ``len(dataset)`` is called without the batch
size or the number of workers. :class:`ShardLoader` asks the stream instead
(:meth:`ShardStream.batches`), which knows every worker's share.

It also keeps the position of an iterator that a framework drops before it is finished:
PyTorch Lightning sets ``loader._iterator = None`` when ``fit()`` ends (after
``max_steps``, say), so StatefulDataLoader's ``state_dict()`` would then start a fresh
iterator and report its start, and ``trainer.save_checkpoint()`` would record that.
:class:`ShardLoader` answers with the dropped iterator's state instead, until a new
iterator starts or a state is loaded.
"""

from __future__ import annotations

import warnings
from collections.abc import Sized
from typing import Any, cast

from torchdata.stateful_dataloader import StatefulDataLoader

from .._exceptions import StateError
from ._mapped import MappedStream
from ._state import STATE_KIND, find_states
from ._stream import ShardStream

__all__ = ["ShardLoader"]

SET_VITAL = "'set_vital' is deprecated"


class ShardLoader(StatefulDataLoader):
    """A :class:`torchdata.stateful_dataloader.StatefulDataLoader` whose ``len()`` is the
    number of batches it yields, whatever the number of workers and ``drop_last``.

    It takes StatefulDataLoader's arguments and behaves as it does (exact resume through
    its ``state_dict()``), with two differences. ``len()``, for a
    :class:`~asyncstream.ShardStream` or a stage on one (``stream.map(fn)``), is the sum of
    every worker's batches of this rank's epoch, each worker ending with its own short
    batch (dropped with ``drop_last=True``); for any other dataset it is
    StatefulDataLoader's. And ``state_dict()`` after a framework dropped an unfinished
    iterator (Lightning, when ``fit()`` returns) is that iterator's position, not the start
    of a new one. StatefulDataLoader's warning that ``torch.set_vital`` is deprecated is
    not shown.
    """

    def __init__(self, dataset: Any, *args: Any, **kwargs: Any) -> None:
        self.__dict__["_dropped_state"] = None
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", SET_VITAL, UserWarning)
            super().__init__(dataset, *args, **kwargs)

    @property
    def _iterator(self) -> Any:
        return self.__dict__.get("_live_iterator")

    @_iterator.setter
    def _iterator(self, iterator: Any) -> None:
        old = self.__dict__.get("_live_iterator")
        if iterator is None and old is not None and not getattr(old, "_finished", True):
            self.__dict__["_dropped_state"] = old.state_dict()  # dropped mid-epoch
        elif iterator is not None:
            self.__dict__["_dropped_state"] = None
        self.__dict__["_live_iterator"] = iterator

    def state_dict(self) -> dict[str, Any]:
        """StatefulDataLoader's state, or that of the iterator dropped last, unfinished
        (see the module docstring)."""
        dropped = self.__dict__["_dropped_state"]
        if self._iterator is None and dropped is not None:
            return dict(dropped)
        return dict(super().state_dict())

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """StatefulDataLoader's: the next iterator starts from ``state_dict``.

        The state is checked here, in the main process, before any worker starts: the
        state of another kind of object (a ``DALIImageLoader``'s, a bare ``ShardStream``'s)
        and, over a :class:`~asyncstream.ShardStream` or a stage on one, a stream state
        that the stream refuses (another dataset or configuration, corrupted) raise here
        rather than in a worker at the first batch.

        Raises:
            StateError: the state is not a StatefulDataLoader's, or the stream refuses the
                states inside it.
        """
        _check_kind(state_dict, self.num_workers)
        stream = _stream_of(self.dataset)
        if stream is not None and any(True for _ in find_states(state_dict)):
            stream._check_state(state_dict)
        super().load_state_dict(state_dict)
        self.__dict__["_dropped_state"] = None

    def __len__(self) -> int:
        batches = getattr(self.dataset, "batches", None)
        if self.batch_size is None or not callable(batches):
            return int(super().__len__())
        # As DataLoader.__len__ does: torch warns if more samples come than that.
        self._IterableDataset_len_called = len(cast(Sized, self.dataset))
        return int(batches(self.batch_size, num_workers=self.num_workers, drop_last=self.drop_last))


_DALI_KIND = "asyncstream.DALIImageLoader"


def _kind_of(state: Any) -> str:
    """What saved ``state``, as a user would name it."""
    if not isinstance(state, dict):
        return f"a {type(state).__name__}, not a state_dict"
    if state.get("kind") == STATE_KIND or ("position" in state and "dataset" in state):
        return "a ShardStream state_dict (give it to the stream's load_state_dict)"
    if state.get("kind") == _DALI_KIND or {"batches", "stream"} <= state.keys():
        return "a DALIImageLoader state_dict (give it to a DALIImageLoader)"
    return f"a dict with keys {sorted(map(str, state))[:8]}"


def _check_kind(state: Any, num_workers: int) -> None:
    """Refuse a state that is not a StatefulDataLoader's, naming what it is, or one of
    the other layout (with workers, without)."""
    if not (isinstance(state, dict) and "_iterator_finished" in state):
        raise StateError(
            f"ShardLoader.load_state_dict takes a ShardLoader (StatefulDataLoader) "
            f"state_dict; this is {_kind_of(state)}"
        )
    saved = "_snapshot" in state
    if saved != (num_workers > 0):
        raise StateError(
            f"this ShardLoader state_dict was saved {'with' if saved else 'without'} "
            f"DataLoader workers and this ShardLoader has num_workers={num_workers}: "
            "StatefulDataLoader resumes only the same layout (give the stream the states "
            "inside it, stream.load_state_dict(state), to split them over other workers)"
        )


def _stream_of(dataset: Any) -> ShardStream | None:
    """The ShardStream under ``dataset`` (itself, or under its stages), else None."""
    if isinstance(dataset, MappedStream):
        dataset = dataset.stream
    return dataset if isinstance(dataset, ShardStream) else None
