"""The stream: ``ShardStream`` and the stages of an epoch, driven together.

The public stream (:mod:`._stream`), what opening it does (:mod:`._open`: arguments to
settings, the dataset or sources opened) and its settings (:mod:`._settings`). One epoch
of one reader (:mod:`._run`) and its stages: the plan source (:mod:`._plansource`), the
chunk reader (:mod:`._lanes`), prefetch (:mod:`._prefetch`) and emit (:mod:`._emit`),
beside the shuffle and the blend of :mod:`asyncstream.order`. The one owner of their
state (:mod:`._checkpoint`) and the saved state it builds, checks and resumes
(:mod:`._state`). Which epoch comes next and how DataLoader workers agree on it
(:mod:`._epochs`, :mod:`._workers`); the iterator (:mod:`._iteration`), per-sample stages
(:mod:`._mapped`), the loader with a true ``len()`` (:mod:`._loader`) and the stall meter
(:mod:`._stall`).

Layer: stands on :mod:`asyncstream.dataset` and below; the only layer that imports torch.
"""
