"""The stream: ``ShardStream`` and the stages of an epoch, driven together.

The public stream (:mod:`._stream`) and its settings (:mod:`._settings`); one epoch of
one reader (:mod:`._run`), its chunk reader (:mod:`._lanes`) and prefetch
(:mod:`._prefetch`); the state that saves and restores it (:mod:`._state`); which epoch
comes next and how DataLoader workers agree on it (:mod:`._epochs`, :mod:`._workers`);
the iterator (:mod:`._iteration`), per-sample stages (:mod:`._mapped`), the loader with a
true ``len()`` (:mod:`._loader`) and the stall meter (:mod:`._stall`).

Layer: stands on :mod:`asyncstream.dataset` and below; the only layer that imports torch.
"""
