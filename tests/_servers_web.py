"""The web servers of the ``http(s)://`` shard URL tests (tests/test_webstore.py): one
folder of foreign shards served by :class:`~asyncstream.testing.WebServer` over HTTP, over
HTTPS, and by a second server on another port (a CDN that the first redirects to), each
started once per session and reset (switches, log, injections) before each test."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from asyncstream import configure_store
from asyncstream.testing import TestCertificates, WebServer

__all__ = ["WebData", "cdn", "web", "web_data", "web_servers", "web_tls"]

SHARDS = 4


@dataclass(frozen=True)
class WebData:
    """The served folder (``root``), its shards under ``ds/`` and every sample's bytes."""

    root: Path
    counts: list[int]
    samples: dict[str, dict[str, bytes]]

    def urls(self, base: str, folder: str = "ds") -> list[str]:
        return [f"{base}/{folder}/part-{i:05d}.tar" for i in range(len(self.counts))]

    def pattern(self, base: str, folder: str = "ds") -> str:
        return f"{base}/{folder}/part-{{00000..{len(self.counts) - 1:05d}}}.tar"


@pytest.fixture(scope="session")
def web_data(tmp_path_factory: pytest.TempPathFactory) -> WebData:
    from _foreign import write_foreign_shards  # webdataset imports PyTorch
    from _servers import _samples

    root = tmp_path_factory.mktemp("web")
    shards = write_foreign_shards(root / "ds", SHARDS, seed=5, samples=(8, 14), prefix="part")
    paths = sorted((root / "ds").glob("*.tar"))
    return WebData(root, shards.counts, _samples(paths))


@pytest.fixture(scope="session")
def web_servers(web_data: WebData, certs: TestCertificates) -> Iterator[dict[str, WebServer]]:
    """The session's three servers: ``http``, ``https`` and ``cdn`` (plain HTTP)."""
    servers = {
        "http": WebServer(web_data.root),
        "https": WebServer(web_data.root, tls=certs.server),
        "cdn": WebServer(web_data.root),
    }
    try:
        for server in servers.values():
            server.start()
        yield servers
    finally:
        for server in servers.values():
            server.close()


def _reset(server: WebServer) -> WebServer:
    server.clear()
    server.ranges, server.etags, server.token = True, True, None
    return server


@pytest.fixture
def web(web_servers: dict[str, WebServer]) -> Iterator[WebServer]:
    """The plain-HTTP server, reset; ``http`` store settings forgotten after."""
    yield _reset(web_servers["http"])
    configure_store("http")


@pytest.fixture
def cdn(web_servers: dict[str, WebServer]) -> WebServer:
    """A second plain-HTTP server (another origin), reset."""
    return _reset(web_servers["cdn"])


@pytest.fixture
def web_tls(web_servers: dict[str, WebServer], certs: TestCertificates) -> Iterator[WebServer]:
    """The HTTPS server, reset, with the ``https`` store trusting the test CA."""
    configure_store("https", ca_bundle=certs.ca)
    yield _reset(web_servers["https"])
    configure_store("https")
