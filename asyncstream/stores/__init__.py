"""The one seam to where shards live: the store interface and its implementations.

The interface (:mod:`._store`), local files (:mod:`._localstore`), the S3 store
(:mod:`._s3store`; its blocking half :mod:`._s3objects`, its options and clients
:mod:`._s3`, its own HTTP/1.1 client :mod:`._http` and :mod:`._origin`), what picks a
store by scheme (:mod:`._stores`), the one table from third-party errors to
asyncstream's (:mod:`._errors`) and the retry policy and timeouts that act on it
(:mod:`._retry`).

Layer: stands on :mod:`asyncstream.shards` (a shard's URL) and the exception tree; the
fetch engine, opening and packing stand on it.
"""
