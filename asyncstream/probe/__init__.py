"""``asyncstream probe``: what will limit a stream of this dataset, on this machine?

Stage by stage, within a budget of seconds (:mod:`._run`): ranged GETs through the fetch
engine at several K (:mod:`._fetch`: the first byte, one connection's rate, MB/s against
K, the reader's CPU per GB and per GET), the stream without decode (:mod:`._stream`), the
feed and the decoder measured by ``dali_ops`` in a process of its own (:mod:`._decode`);
then each stage's ceiling, the one that binds and the settings to try
(:mod:`._verdict`), in words or JSON (:mod:`._report`).

Layer: between the command line and the stream; stands on :mod:`asyncstream.stream`, the
engine and the stores, and never imports DALI.
"""

from ._report import render
from ._run import DEFAULT_KS, probe
from ._verdict import STAGES, verdict

__all__ = ["DEFAULT_KS", "STAGES", "probe", "render", "verdict"]
