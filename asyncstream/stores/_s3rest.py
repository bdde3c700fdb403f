"""S3's requests at open, sent by the store itself where botocore is not needed for them.

Where an endpoint is read path-style (MinIO, moto, Ceph, R2, nginx:
:meth:`~._s3.S3Options.path_base`) and no HTTP proxy sits in front of it, a listing page
(ListObjectsV2), the ``HEAD`` of an object or a bucket and the ``GET`` of a small object
are four fixed requests: this module builds them, signs them (:mod:`._sigv4`, checked
against botocore's signer), sends them on the deadline-bounded sender of
:mod:`._s3objects` and reads their answers. Errors are raised as :class:`S3ErrorResponse`
with the code and message botocore would give (the error document's, else the status and
its reason phrase), which :mod:`._errors` judges by the one table.

Why not botocore's client, as before (and as for AWS's own endpoints, virtual hosts and
proxies still): making one costs 0.18 to 0.20 s of CPU in a fresh process (its service
model's JSON and the client class), most of what the consumer spends opening a dataset
before its first sample (``bench/RESULTS.md``, the first sample over nginx); the
credentials still come from botocore's chain (:func:`~._s3.chain_credentials`).

Answers are hostile bytes: a body is read up to ``MAX_OPEN_BYTES`` and no further; an
XML document with a DTD is refused before it is parsed (no entity of it is expanded); a
listing's keys are checked as they are decoded (a key that names nothing, or a size that
is not a count, is the server's error).
"""

from __future__ import annotations

import http
import threading
import xml.etree.ElementTree as ElementTree
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote_plus

from ._errors import S3ErrorResponse
from ._s3 import S3Options, chain_credentials, object_url
from ._sigv4 import SigV4Signer, query_string

__all__ = ["Listed", "S3Rest", "error_document", "error_response"]

# send(method, url, headers, most) -> (status, headers, body of at most ``most`` + 1 bytes)
Send = Callable[[str, str, Mapping[str, str], int], tuple[int, Mapping[str, str], bytes]]
_PAGE_BYTES = 16 << 20  # the most a listing page may be (1,000 keys of 1 kB are 1.5 MB)


@dataclass(frozen=True)
class Listed:
    """One listing page: ``(key, size, etag)`` of each object, and the token of the next
    page (empty on the last)."""

    objects: list[tuple[str, int, str | None]]
    token: str
    count: int


class S3Rest:
    """Listing, ``HEAD`` and small ``GET`` on a path-style endpoint (module docstring).

    Args:
        options: resolved options with a path-style endpoint.
        send: the bounded sender (:class:`~._s3objects._Sender`'s ``send``).
    """

    def __init__(self, options: S3Options, send: Send) -> None:
        self.options = options
        self._send = send
        self._signer = SigV4Signer(options.signing_region)
        self._chain: Any = None
        self._lock = threading.Lock()

    def _keys(self) -> tuple[str, str, str | None]:
        explicit = self.options.credentials
        if explicit is not None:
            return explicit.access_key_id, explicit.secret_access_key, explicit.session_token
        with self._lock:
            if self._chain is None:
                found = chain_credentials(self.options)
                if found is None:
                    import botocore.exceptions

                    raise botocore.exceptions.NoCredentialsError()
                self._chain = found
        frozen = self._chain.get_frozen_credentials()
        return frozen.access_key, frozen.secret_key, frozen.token

    def _request(
        self, method: str, url: str, params: Mapping[str, str] | None = None, most: int = 0
    ) -> tuple[Mapping[str, str], bytes]:
        query = query_string(params or {})
        access, secret, token = self._keys()
        headers = self._signer.headers(
            url,
            {},
            access_key=access,
            secret_key=secret,
            token=token,
            method=method,
            query=query,
        )
        status, fields, body = self._send(method, f"{url}?{query}" if query else url, headers, most)
        if status >= 300:
            raise error_response(status, body)
        return fields, body

    def _base(self, bucket: str) -> str:
        base = self.options.path_base(bucket)
        assert base is not None, "S3Rest serves path-style endpoints only"
        return base

    def list_page(self, bucket: str, prefix: str, token: str, max_keys: int) -> Listed:
        """One ListObjectsV2 page, its keys URL-encoded by the server and decoded here
        (as botocore asks and decodes them: a key may hold what XML cannot)."""
        params = {"list-type": "2", "max-keys": str(max_keys), "encoding-type": "url"}
        if prefix:
            params["prefix"] = prefix
        if token:
            params["continuation-token"] = token
        fields, body = self._request("GET", self._base(bucket).rstrip("/"), params, _PAGE_BYTES)
        if _declared(fields, len(body)) > _PAGE_BYTES:
            raise S3ErrorResponse(
                200, "ListingTooLarge", f"a listing page of more than {_PAGE_BYTES} bytes"
            )
        root = _document(body, "ListBucketResult")
        encoded = _text(root, "EncodingType") == "url"
        objects = []
        for item in _children(root, "Contents"):
            key = _text(item, "Key") or ""
            if encoded:
                key = unquote_plus(key)  # as botocore decodes them (a "+" is a space)
            size = _text(item, "Size") or ""
            if not key or not size.isdigit():
                raise S3ErrorResponse(200, "MalformedListing", f"a listed object {key!r}")
            objects.append((key, int(size), _text(item, "ETag")))
        truncated = (_text(root, "IsTruncated") or "").lower() == "true"
        following = (_text(root, "NextContinuationToken") or "") if truncated else ""
        count = _text(root, "KeyCount") or ""
        return Listed(objects, following, int(count) if count.isdigit() else len(objects))

    def head(self, bucket: str, key: str) -> tuple[int, str | None]:
        """The object's size and ETag."""
        fields, _ = self._request("HEAD", object_url(self._base(bucket), key))
        length = str(fields.get("content-length", ""))
        if not length.isdigit():
            raise S3ErrorResponse(200, "MalformedHead", "no Content-Length in the answer")
        return int(length), fields.get("etag")

    def head_bucket(self, bucket: str) -> None:
        self._request("HEAD", self._base(bucket).rstrip("/"))

    def get(self, bucket: str, key: str, most: int) -> tuple[int | None, bytes]:
        """The object's declared length and at most ``most`` + 1 of its bytes."""
        fields, body = self._request("GET", object_url(self._base(bucket), key), most=most)
        declared = str(fields.get("content-length", ""))
        return (int(declared) if declared.isdigit() else None), body


def _declared(fields: Mapping[str, str], read: int) -> int:
    """The body's length: its ``Content-Length`` where it says one, or what was read."""
    declared = str(fields.get("content-length", ""))
    return max(int(declared), read) if declared.isdigit() else read


def error_response(status: int, body: bytes) -> S3ErrorResponse:
    """The S3 error of an answer, as botocore reads it: its document's ``<Code>`` and
    ``<Message>``, else the status and its reason phrase (a ``HEAD`` has no body)."""
    code, detail = error_document(body)
    if not code:
        code = str(status)
    if not detail:
        try:
            detail = http.HTTPStatus(status).phrase
        except ValueError:
            detail = f"HTTP {status}"
    return S3ErrorResponse(status, code, detail)


def error_document(body: bytes) -> tuple[str, str]:
    """The ``<Code>`` and ``<Message>`` of an S3 error document (empty where the body is
    none, or not one: a DTD, broken XML, another root), for the open and the engine."""
    if not body.strip():
        return "", ""
    try:
        root = _document(body, "Error")
    except S3ErrorResponse:
        return "", ""
    return (_text(root, "Code") or "").strip(), (_text(root, "Message") or "").strip()


def _document(body: bytes, tag: str) -> ElementTree.Element:
    """The XML document of an answer, its root named ``tag``; a DTD (an entity bomb's
    carrier, in no S3 answer) or broken XML is the server's error."""
    if b"<!DOCTYPE" in body:  # XML is case-sensitive: this is every DTD
        raise S3ErrorResponse(200, "MalformedXML", "an answer with a DTD is refused")
    try:
        root = ElementTree.fromstring(body)
    except ElementTree.ParseError as exc:
        raise S3ErrorResponse(200, "MalformedXML", f"the answer is not XML: {exc}") from None
    if _local(root.tag) != tag:
        raise S3ErrorResponse(200, "MalformedXML", f"<{_local(root.tag)}> where <{tag}> was due")
    return root


def _local(tag: str) -> str:
    return tag.rpartition("}")[2]


def _children(root: ElementTree.Element, tag: str) -> list[ElementTree.Element]:
    return [child for child in root if _local(child.tag) == tag]


def _text(root: ElementTree.Element, tag: str) -> str | None:
    for child in root:
        if _local(child.tag) == tag:
            return child.text or ""
    return None
