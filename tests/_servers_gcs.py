"""The Google Cloud Storage emulator the gs:// tests run against (fake-gcs-server, see
``asyncstream.testing.GCSEmulator``): one per test session, and the gs:// store pointed at
it (or at a fault proxy in front of it) for one test."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from asyncstream import configure_store
from asyncstream.testing import GCSEmulator, GCSEmulatorUnavailable

__all__ = ["gcs_emulator", "gcs_env", "gcs_settings"]


@pytest.fixture(scope="session")
def gcs_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """No Google credentials or emulator of the user's: gcloud's folder empty, the
    metadata server a closed loopback port, asked once (refused at once)."""
    with pytest.MonkeyPatch.context() as mp:
        for name in ("GOOGLE_APPLICATION_CREDENTIALS", "STORAGE_EMULATOR_HOST"):
            mp.delenv(name, raising=False)
        mp.setenv("CLOUDSDK_CONFIG", str(tmp_path_factory.mktemp("gcloud")))
        mp.setenv("GCE_METADATA_DETECT_RETRIES", "1")
        mp.setenv("GCE_METADATA_HOST", "127.0.0.1:9")
        mp.setenv("GCE_METADATA_IP", "127.0.0.1:9")
        yield


@pytest.fixture(scope="session")
def gcs_emulator(gcs_env: None) -> Iterator[GCSEmulator]:
    """fake-gcs-server on a free loopback port, for the whole session; skipped, with the
    reason, where it is not installed; one that is installed but does not start fails."""
    emulator = GCSEmulator()
    try:
        emulator.start()
    except GCSEmulatorUnavailable as exc:
        pytest.skip(f"the Cloud Storage emulator cannot run here: {exc}")
    with emulator:
        yield emulator


@contextmanager
def gcs_settings(**settings: Any) -> Iterator[None]:
    """``configure_store("gs", **settings)`` for the block, forgotten after."""
    configure_store("gs", **settings)
    try:
        yield
    finally:
        configure_store("gs")
