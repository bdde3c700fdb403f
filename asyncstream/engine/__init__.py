"""The fetch engine: K chunk downloads in flight into a shared-memory ring.

The engine and its handle (:mod:`._engine`; its process is ``python -m
asyncstream.engine``, :mod:`.__main__`), the ring of slots (:mod:`._ring`) and the local
disk cache, a store in front of a store (:mod:`._cache`, :mod:`._cachedir`).

Layer: stands on :mod:`asyncstream.stores` and below. Its process imports only this
folder and what it stands on: no torch, no Pillow, no moto, no test support (checked by
the import contracts in ``pyproject.toml`` and by ``tests/test_layers.py``).
"""
