"""The order of samples: pure functions and small states, no I/O.

The epoch plan (which samples of which shards each reader reads, :mod:`._plan`), the
chunked window shuffle (:mod:`._shuffle`), weighted mixing of sources (:mod:`._mix`) and
its measure (:mod:`._mixquality`), and a reader's saved position (:mod:`._position`).
They decide what comes next from their inputs alone (seed, epoch, sizes, topology), so
they are tested, and resumed, without a store or an engine.

Layer: imports nothing of asyncstream but the exception tree (``asyncstream._exceptions``).
"""
