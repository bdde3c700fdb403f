"""Trust boundaries of the stores (issue 28, items 4 to 6): what a hostile server, or a
secret in a URL, can make the reader do.

Each attack is played by :class:`BadServer`, a deliberately bad HTTP/1.1 server on a
loopback port (threads, raw sockets): it answers wrong ``Content-Range`` headers, trickles
its headers one byte at a time, sends huge bodies, redirects elsewhere, and logs every
request it got (the headers included) so that a test sees what the reader sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import socket
import socketserver
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from asyncstream import PermanentFetchError
from asyncstream.stores._errors import verdict
from asyncstream.stores._store import ChunkRequest

SIZE = 16384  # the pretend object's size
BODY = bytes(range(256)) * (SIZE // 256)


@dataclass
class Request:
    """One request the bad server got."""

    method: str
    target: str
    headers: dict[str, str]  # lower-case names
    raw: bytes


@dataclass
class Answer:
    """What the bad server sends back: pieces of bytes, each after a delay (seconds)."""

    pieces: list[tuple[float, bytes]] = field(default_factory=list)


Behaviour = Callable[[Request], Answer]


def reply(status: int, headers: dict[str, str], body: bytes = b"") -> Answer:
    head = f"HTTP/1.1 {status} X\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    return Answer([(0.0, head.encode("latin-1") + b"\r\n" + body)])


def ranged(request: Request, shift: int = 0) -> Answer:
    """A 206 for the range asked, its bytes and Content-Range taken ``shift`` bytes off
    (0: an honest answer)."""
    first, _, last = request.headers["range"].removeprefix("bytes=").partition("-")
    start, end = int(first) + shift, int(last) + shift
    fields = {
        "Content-Range": f"bytes {start}-{end}/{SIZE}",
        "Content-Length": str(end - start + 1),
        "ETag": '"v1"',
        "x-goog-generation": "1",
    }
    return reply(206, fields, BODY[start : end + 1])


class BadServer:
    """A loopback HTTP/1.1 server whose every answer is ``behaviour(request)``."""

    def __init__(self, behaviour: Behaviour) -> None:
        self.behaviour = behaviour
        self.log: list[Request] = []
        self.times: list[float] = []  # when each request of the log came (monotonic)
        self.finished = threading.Event()  # an answer was sent to its end
        self.cut = threading.Event()  # the reader closed a connection mid-answer
        outer = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                sock: socket.socket = self.request
                data = b""
                while True:
                    while b"\r\n\r\n" not in data:
                        piece = sock.recv(65536)
                        if not piece:
                            return
                        data += piece
                    head, _, data = data.partition(b"\r\n\r\n")
                    line, *lines = head.decode("latin-1").split("\r\n")
                    method, target, _ = line.split(" ", 2)
                    headers = {}
                    for text in lines:
                        name, _, value = text.partition(":")
                        headers[name.strip().lower()] = value.strip()
                    request = Request(method, target, headers, head)
                    outer.times.append(time.monotonic())
                    outer.log.append(request)
                    try:
                        for delay, chunk in outer.behaviour(request).pieces:
                            if delay:
                                time.sleep(delay)
                            sock.sendall(chunk)
                    except OSError:
                        outer.cut.set()
                        return  # the reader gave up: the answer did not finish
                    outer.finished.set()

        class Server(socketserver.ThreadingTCPServer):
            daemon_threads = True
            allow_reuse_address = True

        self._server = Server(("127.0.0.1", 0), Handler)
        self.port = self._server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> BadServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()


@pytest.fixture
def bad_server() -> Iterator[Callable[[Behaviour], BadServer]]:
    started: list[BadServer] = []

    def start(behaviour: Behaviour) -> BadServer:
        server = BadServer(behaviour).__enter__()
        started.append(server)
        return server

    yield start
    for server in started:
        server.__exit__(None, None, None)


# -- item 5: every store checks the range it got ------------------------------------------


def _s3_store(endpoint: str) -> Any:
    from asyncstream.stores._s3 import S3Credentials, S3Options
    from asyncstream.stores._s3store import S3Store

    options = S3Options(
        endpoint_url=endpoint,
        region_name="us-east-1",
        addressing_style="path",
        credentials=S3Credentials("AKIDEXAMPLE", "secret"),
    )
    return S3Store(options)


def _gcs_store(endpoint: str) -> Any:
    from asyncstream.stores._gcs import GCSSettings
    from asyncstream.stores._gcsstore import GCSStore

    return GCSStore(GCSSettings.of({"endpoint": endpoint, "anonymous": True}, {}))


SAS = "sv=2023-11-03&se=2030-01-01&sp=r&sig=SASSECRETSIGNATURE"


def _azure_store(endpoint: str) -> Any:
    from asyncstream.stores._azure import AzureConfig
    from asyncstream.stores._azurestore import AzureStore

    settings = {"account": "acct", "sas_token": SAS, "endpoint": f"{endpoint}/acct"}
    return AzureStore(AzureConfig.resolve(settings, {}))


def _web_store() -> Any:
    from asyncstream.stores._web import WebSettings
    from asyncstream.stores._webstore import HttpStore

    return HttpStore(WebSettings.of("http", {}))


def _store_and_url(kind: str, server: BadServer) -> tuple[Any, str]:
    if kind == "s3":
        return _s3_store(server.url), "s3://bucket/shard.tar"
    if kind == "gs":
        return _gcs_store(server.url), "gs://bucket/shard.tar"
    if kind == "az":
        return _azure_store(server.url), "az://data/shard.tar"
    return _web_store(), f"{server.url}/shard.tar"


async def _read(store: Any, url: str, offset: int, length: int, etag: str) -> bytes:
    out = bytearray(length)
    request = ChunkRequest(url, offset, length, etag, False, SIZE)
    if hasattr(store, "open"):
        await store.open()
    try:
        await store.read_into(request, memoryview(out))
    finally:
        await store.aclose()
    return bytes(out)


def _judged(store: Any, url: str, offset: int, length: int, etag: str) -> Any:
    """The verdict of the one table on what one read met (it must fail)."""
    try:
        asyncio.run(_read(store, url, offset, length, etag))
    except Exception as exc:  # judged below, as the engine judges it
        return verdict(exc, url)
    raise AssertionError("the read succeeded")


_ETAGS = {"s3": '"v1"', "gs": "1", "az": '"v1"', "web": '"v1"'}
_KINDS = ["s3", "gs", "az", "web"]


def _needs(kind: str) -> None:
    if kind == "az":
        pytest.importorskip("azure.storage.blob", reason="the azure extra is not installed")


@pytest.mark.parametrize("kind", _KINDS)
def test_honest_range_reads(kind: str, bad_server: Callable[[Behaviour], BadServer]) -> None:
    """The bad server's honest mode is read as the range asked (the attacks' baseline)."""
    _needs(kind)
    server = bad_server(ranged)
    store, url = _store_and_url(kind, server)
    assert asyncio.run(_read(store, url, 4096, 4096, _ETAGS[kind])) == BODY[4096:8192]


@pytest.mark.parametrize("kind", _KINDS)
def test_wrong_content_range_start_is_permanent(
    kind: str, bad_server: Callable[[Behaviour], BadServer]
) -> None:
    """Asked ``bytes=4096-8191``, answered ``bytes 0-4095/...`` of the right length: other
    bytes, never handed over as the range; a permanent error naming the shard."""
    _needs(kind)
    server = bad_server(lambda request: ranged(request, shift=-4096))
    store, url = _store_and_url(kind, server)
    judged = _judged(store, url, 4096, 4096, _ETAGS[kind])
    assert not judged.retry, judged
    assert isinstance(judged.error, PermanentFetchError)
    assert url in str(judged.error)
    assert "range" in str(judged.error)


@pytest.mark.parametrize("kind", _KINDS)
def test_206_without_content_range_is_permanent(
    kind: str, bad_server: Callable[[Behaviour], BadServer]
) -> None:
    """A 206 of the right length that says nothing of which bytes it holds is refused."""
    _needs(kind)

    def answer(request: Request) -> Answer:
        return reply(206, {"Content-Length": "4096", "ETag": '"v1"'}, BODY[:4096])

    server = bad_server(answer)
    store, url = _store_and_url(kind, server)
    judged = _judged(store, url, 4096, 4096, _ETAGS[kind])
    assert not judged.retry, judged
    assert isinstance(judged.error, PermanentFetchError)


# -- item 4: secrets stay secret -----------------------------------------------------------

SIGNED = "?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIDSECRET&X-Amz-Signature=SIGSECRET"


def test_presigned_query_is_redacted_in_errors(
    bad_server: Callable[[Behaviour], BadServer],
) -> None:
    """A presigned URL's signature and credential never reach an error message (the
    error's ``url`` keeps what the user gave)."""
    from asyncstream import NotFoundError
    from asyncstream.dataset._resolve import resolve_shards

    server = bad_server(lambda request: reply(404, {"Content-Length": "0"}))
    url = f"{server.url}/shard.tar{SIGNED}"
    with pytest.raises(NotFoundError) as caught:
        resolve_shards(url)
    assert "SIGSECRET" not in str(caught.value)
    assert "AKIDSECRET" not in str(caught.value)
    assert f"{server.url}/shard.tar" in str(caught.value)
    assert caught.value.url == url


def test_sas_token_is_redacted_in_engine_errors(
    bad_server: Callable[[Behaviour], BadServer],
) -> None:
    """A chunk error that names a SAS-signed blob URL masks its signature."""
    from asyncstream.stores._retry import classify

    server = bad_server(lambda request: reply(400, {"Content-Length": "0"}))
    url = f"{server.url}/shard.tar?sv=2023-11-03&sp=r&sig=SASSECRET"
    judged = _judged(_web_store(), url, 0, 4096, '"v1"')
    assert "SASSECRET" not in str(judged.error)
    assert "SASSECRET" not in str(classify(RuntimeError(f"boom at {url}"), url)[1])


def test_counting_warning_redacts_the_signature(
    web: Any, web_data: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """The warning that shards are counted names the URL, never its signature."""
    from asyncstream import ShardStream

    urls = [u + SIGNED for u in web_data.urls(web.url)]
    with caplog.at_level(logging.WARNING, logger="asyncstream"), ShardStream(urls) as stream:
        assert len(list(stream)) == sum(web_data.counts)
    counting = [r.getMessage() for r in caplog.records if "counting" in r.getMessage()]
    assert counting, caplog.text
    assert "SIGSECRET" not in caplog.text
    assert "AKIDSECRET" not in caplog.text


def _redirecting(target: str) -> Behaviour:
    def answer(request: Request) -> Answer:
        return reply(302, {"Location": target + request.target, "Content-Length": "0"})

    return answer


def test_configured_headers_do_not_follow_a_redirect_to_another_origin(
    bad_server: Callable[[Behaviour], BadServer],
) -> None:
    """``headers={"X-Api-Key": ...}`` go to the shard's own origin only: neither the
    open-time HEAD nor the engine's GET carries them past a redirect elsewhere."""
    from asyncstream.stores._web import WebSettings
    from asyncstream.stores._webstore import HttpStore

    def honest(request: Request) -> Answer:
        if request.method == "HEAD":
            return reply(200, {"Content-Length": str(SIZE), "ETag": '"v1"'})
        return ranged(request)

    elsewhere = bad_server(honest)
    origin = bad_server(_redirecting(elsewhere.url))
    settings = WebSettings.of("http", {"headers": {"X-Api-Key": "KEYSECRET"}})
    store = HttpStore(settings)
    url = f"{origin.url}/shard.tar"
    assert store.head(url).size == SIZE
    assert asyncio.run(_read(store, url, 0, 4096, '"v1"')) == BODY[:4096]
    assert origin.log
    assert all(r.headers.get("x-api-key") == "KEYSECRET" for r in origin.log)
    assert elsewhere.log
    assert [r.headers.get("x-api-key") for r in elsewhere.log] == [None] * len(elsewhere.log)


def test_userinfo_never_reaches_the_host_header(
    bad_server: Callable[[Behaviour], BadServer],
) -> None:
    """A URL's ``user:password@`` is not sent in the clear in the engine's ``Host``."""
    server = bad_server(ranged)
    url = f"http://user:PASSSECRET@127.0.0.1:{server.port}/shard.tar"
    asyncio.run(_read(_web_store(), url, 0, 4096, '"v1"'))
    assert server.log
    assert all(r.headers["host"] == f"127.0.0.1:{server.port}" for r in server.log)
    assert b"PASSSECRET" not in b"".join(r.raw for r in server.log)


def test_userinfo_in_a_web_url_is_refused(bad_server: Callable[[Behaviour], BadServer]) -> None:
    """``https://user:password@host/...`` is refused with a clear ValueError that does not
    repeat the password (credentials go in ``token`` or ``headers``)."""
    from asyncstream.dataset._resolve import resolve_shards

    server = bad_server(lambda request: reply(200, {"Content-Length": str(SIZE)}))
    url = f"http://user:PASSSECRET@127.0.0.1:{server.port}/shard.tar"
    with pytest.raises(ValueError, match="user:password@") as caught:
        resolve_shards(url)
    assert "PASSSECRET" not in str(caught.value)
    assert server.log == []


# -- item 6: open-time requests are bounded ----------------------------------------------------

HUGE = (64 << 20) + (4 << 20)  # over the default cap on a body read at open


def _huge(chunked: bool) -> Behaviour:
    def answer(request: Request) -> Answer:
        piece = b"[" * (1 << 20)
        if chunked:
            head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
            frame = b"%x\r\n%b\r\n" % (len(piece), piece)
            frames = [(0.0, frame)] * (2 * HUGE >> 20)  # far more than the socket buffers
            return Answer([(0.0, head), *frames, (0.0, b"0\r\n\r\n")])
        head = f"HTTP/1.1 200 OK\r\nContent-Length: {HUGE}\r\n\r\n".encode()
        return Answer([(0.0, head), *[(0.0, piece)] * (HUGE >> 20)])

    return answer


@pytest.mark.parametrize("chunked", [False, True], ids=["declared", "chunked"])
def test_huge_index_body_is_refused(
    chunked: bool, bad_server: Callable[[Behaviour], BadServer]
) -> None:
    """An index file of 68 MiB (said so), or of 136 MiB in chunks with no length, is
    refused with an error naming the URL and the cap; it is not read whole first."""
    server = bad_server(_huge(chunked))
    url = f"{server.url}/ds/asyncstream.json"
    with pytest.raises(PermanentFetchError, match="max_open_bytes") as caught:
        _web_store().read(url)
    assert url in str(caught.value)
    assert not server.finished.wait(0.5)  # the body was not read to its end


@pytest.mark.parametrize("chunked", [False, True], ids=["declared", "chunked"])
def test_huge_s3_index_body_is_refused(
    chunked: bool, bad_server: Callable[[Behaviour], BadServer]
) -> None:
    """The S3 store's own GET of an index file: refused by its declared length (nothing
    read), or once more than the cap came without one; never read whole."""
    server = bad_server(_huge(chunked))
    url = "s3://bucket/ds/asyncstream.json"
    with pytest.raises(PermanentFetchError, match="max_open_bytes") as caught:
        _s3_store(server.url).read(url)
    assert url in str(caught.value)
    assert not server.finished.wait(0.5)


def _trickle(request: Request) -> Answer:
    """Headers one byte every 0.2 s: 60 bytes, 12 s in all; each read gets a byte."""
    head = f"HTTP/1.1 200 OK\r\nContent-Length: {SIZE}\r\nX-Pad: {'a' * 16}\r\n\r\n".encode()
    return Answer([(0.2, head[i : i + 1]) for i in range(len(head))])


@pytest.mark.parametrize("what", ["head", "index"])
def test_trickling_server_cannot_hold_an_open(
    what: str, bad_server: Callable[[Behaviour], BadServer]
) -> None:
    """A server that trickles its headers a byte at a time fails the open at the
    deadline (2 s here) with a transient error, long before its trickle ends; a
    per-read timeout alone never fires."""
    from asyncstream import TransientFetchError
    from asyncstream.stores._web import WebSettings
    from asyncstream.stores._webstore import HttpStore

    server = bad_server(_trickle)
    store = HttpStore(WebSettings.of("http", {"open_deadline": 2}))
    url = f"{server.url}/shard.tar"
    with pytest.raises(TransientFetchError, match="open_deadline") as caught:
        store.head(url) if what == "head" else store.read(url)
    assert url in str(caught.value)
    assert not server.finished.is_set()  # the trickle was cut short
    assert len(server.log) == 1  # and not retried


def _trickle_body(request: Request) -> Answer:
    """Headers at once, then a body of 60 bytes one byte every 0.2 s (12 s in all); a
    ``206`` where a range was asked (Azure's SDK asks for the first 32 MiB)."""
    ranged = "range" in request.headers or "x-ms-range" in request.headers
    status = "206 Partial Content" if ranged else "200 OK"
    fields = 'Content-Length: 60\r\nContent-Type: application/json\r\nETag: "v1"\r\n'
    if ranged:
        fields += "Content-Range: bytes 0-59/60\r\n"
    head = f"HTTP/1.1 {status}\r\n{fields}\r\n".encode()
    return Answer([(0.0, head), *[(0.2, b" ") for _ in range(60)]])


def _bounded_store(kind: str, server: BadServer, deadline: float) -> tuple[Any, str]:
    """The open-time half of a store of ``kind`` on ``server``, its deadline ``deadline``."""
    if kind == "s3":
        from asyncstream.stores._s3 import S3Credentials, S3Options
        from asyncstream.stores._s3store import S3Store

        options = S3Options(
            endpoint_url=server.url,
            region_name="us-east-1",
            addressing_style="path",
            credentials=S3Credentials("AKIDEXAMPLE", "secret"),
            open_deadline=deadline,
        )
        return S3Store(options), "s3://bucket/ds/asyncstream.json"
    if kind == "gs":
        from asyncstream.stores._gcs import GCSSettings
        from asyncstream.stores._gcsstore import GCSStore

        given = {"endpoint": server.url, "anonymous": True, "open_deadline": deadline}
        return GCSStore(GCSSettings.of(given, {})), "gs://bucket/ds/asyncstream.json"
    from asyncstream.stores._azure import AzureConfig
    from asyncstream.stores._azurestore import AzureStore

    settings = {
        "account": "acct",
        "sas_token": SAS,
        "endpoint": f"{server.url}/acct",
        "open_deadline": deadline,
    }
    return AzureStore(AzureConfig.resolve(settings, {})), "az://data/ds/asyncstream.json"


@pytest.mark.parametrize("kind", ["s3", "gs", "az"])
@pytest.mark.parametrize(
    ("what", "trickle"),
    [("head", _trickle), ("index", _trickle), ("index", _trickle_body)],
    ids=["head", "index", "index-body"],
)
def test_trickling_server_cannot_hold_an_object_store_open(
    kind: str, what: str, trickle: Behaviour, bad_server: Callable[[Behaviour], BadServer]
) -> None:
    """S3, GCS and Azure: a server that trickles its headers, or an index's body, a byte
    at a time fails the open at ``open_deadline`` (1 s here) with a transient error naming
    the URL and the deadline, long before its trickle ends, not retried past the deadline
    (a retry inside it is the design: the deadline bounds the request and its retries;
    Azure's SDK, on a loaded machine, sometimes ends its first try early); the reader
    closes the connection (the server sees it cut)."""
    from asyncstream import TransientFetchError

    _needs(kind)
    server = bad_server(trickle)
    store, url = _bounded_store(kind, server, 1.0)
    began = time.monotonic()
    try:
        with pytest.raises(TransientFetchError, match="open_deadline") as caught:
            store.head(url) if what == "head" else store.read(url)
    finally:
        store.close()
    assert url in str(caught.value)
    assert "1 s" in str(caught.value)
    assert server.cut.wait(5.0)  # the connection was closed: the trickle was cut short
    assert not server.finished.is_set()
    assert server.log  # and nothing asked once the deadline had passed
    assert all(at < began + 1.0 for at in server.times), [t - began for t in server.times]


def _real_store(kind: str, request: pytest.FixtureRequest, deadline: float) -> tuple[Any, str]:
    """The store of ``kind`` on its emulator (moto, the GCS emulator, Azurite), its
    ``open_deadline`` ``deadline``, and a prefix of a bucket (container) of its own."""
    if kind == "s3":
        from asyncstream.stores._s3store import S3Store

        server = request.getfixturevalue("s3_server")
        options = dataclasses.replace(server.options(), open_deadline=deadline)
        store = S3Store(options)
        store.objects.client.create_bucket(Bucket="deadline")
        return store, "s3://deadline/ds/"
    if kind == "gs":
        from asyncstream.stores._gcs import GCSSettings
        from asyncstream.stores._gcsstore import GCSStore

        emulator = request.getfixturevalue("gcs_emulator")
        emulator.create_bucket("deadline")
        given = {**emulator.settings(), "open_deadline": deadline}
        return GCSStore(GCSSettings.of(given, {})), "gs://deadline/ds/"
    from asyncstream.stores._azure import AzureConfig
    from asyncstream.stores._azurestore import AzureStore

    azurite = request.getfixturevalue("azurite")
    config = AzureConfig.resolve({**azurite.settings(), "open_deadline": deadline}, {})
    store = AzureStore(config)
    with contextlib.suppress(Exception):  # made by an earlier run of this test
        store.objects.container("az://deadline/").create_container()
    return store, "az://deadline/ds/"


@pytest.mark.parametrize("kind", ["s3", "gs", "az"])
def test_opens_on_real_servers_within_a_deadline(kind: str, request: pytest.FixtureRequest) -> None:
    """Listing (page by page), HEAD, an index read and a missing index, on the emulators,
    all under the deadline's watched connections, answer as before; uploads (not bounded)
    too."""
    _needs(kind)
    store, prefix = _real_store(kind, request, 30.0)
    try:
        for i in range(3):
            store.write(f"{prefix}shard-{i}.tar", BODY[: 1000 + i])
        store.write(f"{prefix}asyncstream.json", b'{"shards": []}')
        listed = store.list(prefix)
        assert [s.url for s in listed] == [
            f"{prefix}asyncstream.json",
            *(f"{prefix}shard-{i}.tar" for i in range(3)),
        ]
        assert [s.size for s in listed[1:]] == [1000, 1001, 1002]
        assert store.head(f"{prefix}shard-2.tar").size == 1002
        assert store.read(f"{prefix}asyncstream.json") == b'{"shards": []}'
        assert store.read(f"{prefix}missing.json") is None
    finally:
        store.close()


# -- the S3 store's own requests at open (stores/_s3rest.py) against hostile answers ------

_LISTING = (
    '<?xml version="1.0" encoding="UTF-8"?>\n'
    '<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">'
    "<EncodingType>url</EncodingType><IsTruncated>false</IsTruncated><KeyCount>2</KeyCount>"
    "<Contents><Key>ds/a%20b%2B%C3%BC.tar</Key><Size>1000</Size><ETag>&quot;e1&quot;</ETag>"
    "</Contents><Contents><Key>ds/c.tar</Key><Size>7</Size></Contents></ListBucketResult>"
)
_BOMB = (
    '<?xml version="1.0"?><!DOCTYPE l [<!ENTITY a "aaaaaaaaaa">'
    + "".join(
        f'<!ENTITY {b} "{("&" + a + ";") * 10}">'
        for a, b in zip("abcdefgh", "bcdefghi", strict=True)
    )
    + "]><ListBucketResult><Contents><Key>&i;</Key><Size>1</Size></Contents></ListBucketResult>"
)


def _listing(body: str | bytes, status: int = 200, kind: str = "application/xml") -> Behaviour:
    data = body.encode() if isinstance(body, str) else body

    def answer(request: Request) -> Answer:
        return reply(status, {"Content-Length": str(len(data)), "Content-Type": kind}, data)

    return answer


def test_the_s3_listing_is_the_stores_own_signed_request(
    bad_server: Callable[[Behaviour], BadServer],
) -> None:
    """No botocore client: one signed ListObjectsV2 request (keys asked URL-encoded and
    decoded, as botocore does), the sizes and ETags as listed."""
    server = bad_server(_listing(_LISTING))
    store = _s3_store(server.url)
    listed = store.list("s3://bucket/ds/")
    assert [(s.url, s.size, s.etag) for s in listed] == [
        ("s3://bucket/ds/a b+ü.tar", 1000, '"e1"'),
        ("s3://bucket/ds/c.tar", 7, None),
    ]
    assert store.objects._client is None  # botocore's client was never made
    (request,) = server.log
    assert request.method == "GET"
    assert request.target.startswith("/bucket?")
    assert "list-type=2" in request.target
    assert "encoding-type=url" in request.target
    assert "prefix=ds%2F" in request.target
    assert request.headers["authorization"].startswith("AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/")


@pytest.mark.parametrize(
    ("body", "said"),
    [
        (_BOMB, "DTD"),
        ("<ListBucketResult><Contents>", "not XML"),
        ("<Error><Code>X</Code></Error>", "<Error> where <ListBucketResult>"),
        (_LISTING.replace("<Size>7</Size>", "<Size>-7</Size>"), "MalformedListing"),
        (_LISTING.replace("<Key>ds/c.tar</Key>", "<Key></Key>"), "MalformedListing"),
    ],
    ids=["entity-bomb", "broken", "other-root", "negative-size", "empty-key"],
)
def test_a_hostile_s3_listing_is_refused_naming_the_prefix(
    body: str, said: str, bad_server: Callable[[Behaviour], BadServer]
) -> None:
    server = bad_server(_listing(body))
    with pytest.raises(PermanentFetchError, match="s3://bucket/ds/") as caught:
        _s3_store(server.url).list("s3://bucket/ds/")
    assert said in str(caught.value)
    assert len(server.log) == 1  # judged permanent: not retried


def test_a_huge_s3_listing_page_is_not_read_whole(
    bad_server: Callable[[Behaviour], BadServer],
) -> None:
    """A listing page said to be 68 MiB is refused by its length, not read."""
    server = bad_server(_huge(chunked=False))
    with pytest.raises(PermanentFetchError, match="ListingTooLarge"):
        _s3_store(server.url).list("s3://bucket/ds/")
    assert not server.finished.wait(0.5)


def test_s3_errors_at_open_read_as_botocores(
    bad_server: Callable[[Behaviour], BadServer],
) -> None:
    """A HEAD's 404 (no body) is a missing key, after the bucket is asked; an error
    document's code decides (AccessDenied); a 503 is retried."""
    from asyncstream import AccessDeniedError, NotFoundError

    def answer(request: Request) -> Answer:
        if request.method == "HEAD" and request.target == "/bucket":
            return reply(200, {"Content-Length": "0"})
        if request.method == "HEAD":
            return reply(404, {"Content-Length": "0"})
        if "list-type=2" in request.target:  # the hint: is the key a folder? no
            empty = b"<ListBucketResult><KeyCount>0</KeyCount></ListBucketResult>"
            return reply(200, {"Content-Length": str(len(empty))}, empty)
        if request.target == "/bucket/denied.json":
            doc = b"<Error><Code>AccessDenied</Code><Message>no</Message></Error>"
            return reply(403, {"Content-Length": str(len(doc))}, doc)
        if len(server.log) < 3:  # counted from the log's clearing below
            return reply(503, {"Content-Length": "0"})
        return reply(200, {"Content-Length": "2"}, b"{}")

    server = bad_server(answer)
    store = _s3_store(server.url)
    with pytest.raises(NotFoundError, match="no such key"):
        store.head("s3://bucket/missing.tar")
    with pytest.raises(AccessDeniedError, match="AccessDenied"):
        store.read("s3://bucket/denied.json")
    server.log.clear()
    assert store.read("s3://bucket/ok.json") == b"{}"
    assert len(server.log) == 3  # two 503s retried


@pytest.mark.parametrize("kind", ["s3", "web"])
def test_an_etag_with_a_line_break_adds_no_header(
    kind: str, bad_server: Callable[[Behaviour], BadServer]
) -> None:
    """A listing's (or an index's) ETag holding CR LF goes out as If-Match: refused before
    anything is sent, a permanent error naming the shard and the header, not its value."""
    server = bad_server(ranged)
    store, url = _store_and_url(kind, server)
    judged = _judged(store, url, 0, 100, '"v1"\r\nX-Injected: 1')
    assert not judged.retry, judged
    assert isinstance(judged.error, PermanentFetchError)
    assert url in str(judged.error)
    assert "If-Match" in str(judged.error)
    assert "X-Injected" not in str(judged.error)
    assert not any(b"x-injected" in r.raw.lower() for r in server.log)


_ENDLESS = {
    "s3": (
        "<ListBucketResult><IsTruncated>true</IsTruncated>"
        "<NextContinuationToken>again</NextContinuationToken><KeyCount>1</KeyCount>"
        "<Contents><Key>ds/a.tar</Key><Size>10</Size></Contents></ListBucketResult>"
    ),
    "gs": '{"items": [{"name": "ds/a.tar", "size": "10", "generation": "1"}], '
    '"nextPageToken": "again"}',
    "az": (
        '<?xml version="1.0" encoding="utf-8"?><EnumerationResults ContainerName="data">'
        "<Blobs><Blob><Name>ds/a.tar</Name><Properties><Content-Length>10</Content-Length>"
        "<Etag>0x1</Etag><BlobType>BlockBlob</BlobType></Properties></Blob></Blobs>"
        "<NextMarker>again</NextMarker></EnumerationResults>"
    ),
}


@pytest.mark.parametrize("kind", ["s3", "s3-botocore", "gs", "az"])
def test_a_listing_that_never_ends_is_refused(
    kind: str, bad_server: Callable[[Behaviour], BadServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A listing whose every page is truncated with the same continuation token would be
    read forever: refused at the repeat, naming the prefix, by every store (S3 by its own
    requests and by botocore's)."""
    from asyncstream.stores._s3objects import S3Objects

    store_kind = kind.partition("-")[0]
    _needs(store_kind)
    content = "application/json" if store_kind == "gs" else "application/xml"
    server = bad_server(_listing(_ENDLESS[store_kind], kind=content))
    if kind == "s3-botocore":
        monkeypatch.setattr(S3Objects, "rest", lambda self, bucket: None)
    store, url = _store_and_url(store_kind, server)
    prefix = url.rsplit("/", 1)[0] + "/ds/"
    with pytest.raises(PermanentFetchError, match="gives a continuation token it gave before"):
        store.list(prefix)
    assert len(server.log) == 2  # the first page, then the page that gave its token again


def _padded(request: Request, pad: int) -> Answer:
    """The honest range, its head padded by a header field of ``pad`` bytes."""
    answer = ranged(request)
    head, _, body = answer.pieces[0][1].partition(b"\r\n\r\n")
    return Answer([(0.0, head + b"\r\nX-Pad: " + b"p" * pad + b"\r\n\r\n" + body)])


async def _read_twice(store: Any, url: str) -> list[bytes]:
    """Two ranges, one after the other, on the store's kept-alive connection."""
    await store.open()
    try:
        out = []
        for offset in (4096, 0):
            buffer = bytearray(4096)
            request = ChunkRequest(url, offset, 4096, _ETAGS["web"], False, SIZE)
            await store.read_into(request, memoryview(buffer))
            out.append(bytes(buffer))
        return out
    finally:
        await store.aclose()


@pytest.mark.parametrize("pad", [0, 20_000, 60_000])
def test_a_head_of_any_size_up_to_the_limit_is_read_whole(
    pad: int, bad_server: Callable[[Behaviour], BadServer]
) -> None:
    """A head (with the first body bytes that come in its read) is read into a buffer the
    connection keeps: a head larger than it (20 kB, 60 kB: the buffer is 16 KiB) is read
    whole, the body bytes after it land in the slot, and the next request on the same
    connection starts clean."""
    server = bad_server(lambda request: _padded(request, pad))
    store, url = _store_and_url("web", server)
    assert asyncio.run(_read_twice(store, url)) == [BODY[4096:8192], BODY[:4096]]
    assert len(server.log) == 2


def test_a_head_over_64_kib_is_refused(bad_server: Callable[[Behaviour], BadServer]) -> None:
    """Headers that never end are not read without a bound."""
    server = bad_server(lambda request: _padded(request, 70_000))
    store, url = _store_and_url("web", server)
    judged = _judged(store, url, 4096, 4096, _ETAGS["web"])
    assert "response headers over 65536 bytes" in str(judged.error)
