"""The one seam to where shards live: the store interface and its implementations.

The interface (:mod:`._store`: what a store implements), the registry from URL scheme to
store, the one place a scheme is read (:mod:`._registry`), the consumer's stores, one per
scheme (:mod:`._stores`), local files (:mod:`._localstore`), the S3 store
(:mod:`._s3store`; its blocking half :mod:`._s3objects`, its uploads :mod:`._s3upload`,
its options and clients :mod:`._s3`, its own HTTP/1.1 client :mod:`._http`,
:mod:`._httpconn` and :mod:`._origin`), the one table from third-party errors to
asyncstream's (:mod:`._errors`) and the retry policy and timeouts that act on it
(:mod:`._retry`).

Layer: stands on :mod:`asyncstream.shards` (a shard's URL) and the exception tree; the
fetch engine, opening and packing stand on it.
"""
