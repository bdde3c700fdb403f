"""Opening a dataset: its shards, their sizes and the samples in each.

URLs resolved into shards through the stores (:mod:`._resolve`), the indexes beside them
read (:mod:`._index`) and applied (:mod:`._opener`) within what the user named
(:mod:`._trust`: what a remote index may name), the local cache of counted shards
(:mod:`._index_cache`), counting through the fetch engine where nothing else knows
(:mod:`._count`), and the whole open (:mod:`._dataset`), for one dataset or several
mixed (:mod:`._sources`, the public ``Source``).

Layer: stands on :mod:`asyncstream.engine` (counting) and below.
"""
