"""The Azure Blob store's server: one Azurite per test session (``asyncstream.testing.Azurite``),
a container of foreign shards on it, and the store configured for it (or for a FaultProxy in
front of it).

Azurite is installed from npm on first use; where it cannot be (no Node.js, offline with
nothing cached) its tests are skipped with the reason, and an installed Azurite that does
not start fails them. The process's ``AZURE_*`` variables are cleared for the session, so
no test reaches a real account, and no test leaves the store without an explicit key:
``DefaultAzureCredential`` (which would probe the network for a managed identity) is never
reached.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from asyncstream.stores._registry import configure_store
from asyncstream.testing._azurite import ACCOUNT, Azurite, AzuriteUnavailable

__all__ = ["AzData", "az_data", "azurite", "use_azure"]

CONTAINER = "data"
_CLEARED = [name for name in os.environ if name.startswith(("AZURE_", "MSI_", "IDENTITY_"))]


@dataclass(frozen=True)
class AzData:
    """Foreign shards in Azurite's container ``data``: URLs, bytes, samples, counts."""

    server: Azurite
    counts: list[int]
    blobs: dict[str, bytes]  # az:// URL -> the shard's bytes
    samples: dict[str, dict[str, bytes]]  # key -> {extension: bytes}
    prefix: str = f"az://{CONTAINER}/train/"

    def url(self, shard: int) -> str:
        return f"{self.prefix}part-{shard:05d}.tar"

    def name(self, shard: int) -> str:
        """The blob's name, which FaultProxy faults match."""
        return f"train/part-{shard:05d}.tar"

    def container(self) -> Any:
        """The SDK's client of the container (to replace or delete blobs)."""
        from azure.storage.blob import BlobServiceClient

        service = BlobServiceClient(
            self.server.endpoint_url,
            credential={"account_name": ACCOUNT, "account_key": self.server.settings()["key"]},
        )
        return service.get_container_client(CONTAINER)


@pytest.fixture(scope="session")
def azurite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Azurite]:
    """Azurite's blob service on a free loopback port, for the whole session."""
    pytest.importorskip("azure.storage.blob", reason="the azure extra is not installed")
    with pytest.MonkeyPatch.context() as mp:
        for name in _CLEARED:
            mp.delenv(name, raising=False)
        server = Azurite(tmp_path_factory.mktemp("azurite"), in_memory=True)
        try:
            server.start()
        except AzuriteUnavailable as exc:
            pytest.skip(f"Azurite, the Azure Blob emulator, cannot be installed here: {exc}")
        with server:
            yield server


@pytest.fixture(scope="session")
def az_data(azurite: Azurite, tmp_path_factory: pytest.TempPathFactory) -> AzData:
    """Six foreign shards uploaded to ``az://data/train/`` (and one blob elsewhere)."""
    from _foreign import write_foreign_shards  # webdataset imports PyTorch
    from _servers import _samples

    folder: Path = tmp_path_factory.mktemp("az-shards")
    shards = write_foreign_shards(folder, 6, seed=5, samples=(10, 20))
    data = AzData(azurite, shards.counts, {}, _samples(sorted(folder.glob("*.tar"))))
    container = data.container()
    container.create_container()
    for i, path in enumerate(sorted(folder.glob("*.tar"))):
        container.upload_blob(data.name(i), path.read_bytes())
        data.blobs[data.url(i)] = path.read_bytes()
    container.upload_blob("other/readme.txt", b"not a shard")
    return data


@pytest.fixture
def use_azure(azurite: Azurite) -> Iterator[Any]:
    """Configure the ``az`` store for Azurite (call the yielded function again to point it
    elsewhere: a proxy, a wrong key); forgotten after the test."""

    def configure(**overrides: Any) -> dict[str, Any]:
        settings = azurite.settings(**overrides)
        configure_store("az", **settings)
        return settings

    configure()
    yield configure
    configure_store("az")
