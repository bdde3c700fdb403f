"""What a shard is and how its bytes read, no I/O: URLs, tar members, samples.

Shard URLs, brace patterns and schemes (:mod:`._urls`); the incremental tar reader that
indexes a chunk in place (:mod:`._tar`, with webdataset's member rules in
:mod:`._members`, tar headers in :mod:`._tarheaders` and sparse members in
:mod:`._sparse`; runs of plain members read by the native walk, ``_tarwalk.c``, or
its Python reference :mod:`._tarfast`); compressed shards decompressed on the way
(:mod:`._compressed`).

Layer: imports nothing of asyncstream but the exception tree.
"""
