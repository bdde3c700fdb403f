"""The fetch engine: K chunk downloads in flight into a shared-memory ring.

The consumer's side: the handle and the engine's lifecycle (:mod:`._engine`; its settings
:mod:`._config`; its process, started ahead of its settings, :mod:`._launch`). Between the
two sides, the typed messages of :mod:`._protocol`. The engine's side (its own process
is ``python -m asyncstream.engine``, :mod:`.__main__`): the connection and the stores
(:mod:`._server`), the scheduler (:mod:`._scheduler`), its policies, each a small unit
with an injected clock (:mod:`._policies`: adaptive concurrency, hedging, coalescing),
and its statistics (:mod:`._stats`). Also the ring of
slots (:mod:`._ring`) and the local disk cache, a store in front of a store
(:mod:`._cache`, :mod:`._cachedir`).

Layer: stands on :mod:`asyncstream.stores` and below. Its process imports only this
folder and what it stands on: no torch, no Pillow, no moto, no test support (checked by
the import contracts in ``pyproject.toml`` and by ``tests/test_layers.py``).
"""
