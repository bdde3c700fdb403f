"""The peers of asyncstream in the benchmark: the libraries users would pick instead, each
run over the same tar shards, on the same server, in a process of its own.

* ``naive``: one boto3 GET per shard and ``tarfile`` (:mod:`bench.peers.naive`);
* ``webdataset``: tar over HTTP, ``shardshuffle`` and a sample buffer (:mod:`bench.peers.wds`);
* ``s3torchconnector``: its ``S3IterableDataset`` over the tars (:mod:`bench.peers.s3connector`);
* ``mosaic``: MosaicML streaming, after its ``MDSWriter`` (:mod:`bench.peers.mosaic`);
* ``litdata``: after its ``optimize`` (:mod:`bench.peers.lit`).

The harness calls :func:`available`, then :func:`run_peer` for each peer and
:func:`shuffle_quality_of` on the results; for its mixing scenario, :func:`run_mix`.
MosaicML streaming and litdata live in an isolated environment that :func:`ensure_env`
(``python -m bench.peers.setup``) builds; see ``bench/peers/README.md``. Importing this
package imports no peer library and not asyncstream.
"""

from ._common import PEERS, PeerInfo
from ._env import ensure_env
from ._host import (
    PEERS_VENV,
    PeerSettings,
    available,
    default_target,
    interpreters,
    locate,
    run_mix,
    run_peer,
    shuffle_quality_of,
)

__all__ = [
    "PEERS",
    "PEERS_VENV",
    "PeerInfo",
    "PeerSettings",
    "available",
    "default_target",
    "ensure_env",
    "interpreters",
    "locate",
    "run_mix",
    "run_peer",
    "shuffle_quality_of",
]
