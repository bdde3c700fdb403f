"""The hypothesis settings of the fuzzers that compare native code with its Python
reference (``test_native_tar``, ``test_native_draw``, ``test_native_batch``): a bounded,
derandomized number of examples (``ASYNCSTREAM_FUZZ_EXAMPLES``, 150 by default; ``make
sanitize`` runs fewer), so every run, and every sanitized one, tries the same inputs."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

FUZZ = settings(
    max_examples=int(os.environ.get("ASYNCSTREAM_FUZZ_EXAMPLES", "150")),
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
