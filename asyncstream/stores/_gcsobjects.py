"""The Google Cloud Storage store's blocking half: listing, metadata, whole objects and
uploads, at open and for ``pack`` and ``index``.

Plain JSON API calls (``storage/v1``) on a ``requests`` session, with a bearer token from
``google-auth`` (:class:`~._gcs.GoogleAuth`), not the ``google-cloud-storage`` SDK: the
same URLs and error documents as the engine's reads (:mod:`._gcsstore`), one error map
(:func:`~._gcs.gcs_error`), no retry layer of a client's own under ours, and two light
dependencies instead of the SDK's six (see the Stores guide for the figures). Every call
is retried under the one table (:mod:`._errors`, :func:`~._retry.retrying_sync`):
throttling (429, 503), 5xx, 408 and connection failures are retried; 401, 403, 404 and
412 are raised at once. Every request at open (metadata, a listing page, a small object's
``GET`` and its body), its retries included, ends within the setting ``open_deadline``
(:mod:`._deadline`: the session's connections are shut at the deadline); uploads are not
bounded.

An object's version tag is its *generation* (a number that changes whenever the object is
replaced): :meth:`GCSObjects.list` and :meth:`GCSObjects.head` give it as the shard's
``etag``, and the engine reads every chunk of that generation only.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import requests

from .._exceptions import NotFoundError, PermanentFetchError
from ..shards._urls import Shard
from ._deadline import attempt_under, bounded, deadline_session
from ._gcs import GCSSettings, GoogleAuth, gcs_error, object_path, parse_gs_url
from ._limits import MAX_OPEN_BYTES, Pages, too_large
from ._retry import RetryPolicy, retrying_sync

__all__ = ["GCSObjects"]

T = TypeVar("T")
_TIMEOUT = (10.0, 60.0)  # connect, read: seconds
_LIST_FIELDS = "items(name,size,generation),nextPageToken"


class GCSObjects:
    """Listing, metadata and whole objects on Cloud Storage (module docstring).

    Args:
        settings: the store's settings.
        auth: the credentials (shared with the engine's half where both run here).
        attempts: attempts per call, the first included.
    """

    def __init__(self, settings: GCSSettings, auth: GoogleAuth, *, attempts: int = 5) -> None:
        self.settings = settings
        self.auth = auth
        self._policy = RetryPolicy(max_attempts=attempts, base_delay=0.1)
        self._local = threading.local()  # one session per thread (uploads run in threads)
        self._sessions: list[requests.Session] = []
        self._lock = threading.Lock()

    @property
    def _session(self) -> requests.Session:
        session: requests.Session | None = getattr(self._local, "session", None)
        if session is None:
            session = self._local.session = deadline_session()
            with self._lock:
                self._sessions.append(session)
        return session

    def close(self) -> None:
        """Close every thread's session (their kept-alive connections)."""
        with self._lock:
            sessions, self._sessions = self._sessions, []
        for session in sessions:
            session.close()
        self._local = threading.local()

    # -- one request ---------------------------------------------------------------------

    def _request(
        self,
        method: str,
        url: str,
        path: str,
        *,
        ok: Iterable[int] = (),
        at_open: bool = True,
        **kwargs: Any,
    ) -> requests.Response:
        """One request (``path`` under the endpoint) about ``url``, retried under the one
        table; an error answer other than those in ``ok`` raised as :func:`gcs_error`.
        ``at_open``: within ``open_deadline``, retries included."""
        attempt = self._attempt(method, url, path, ok=ok, **kwargs)
        return self.call(url, attempt, at_open=at_open)

    def _attempt(
        self, method: str, url: str, path: str, *, ok: Iterable[int] = (), **kwargs: Any
    ) -> Callable[[], requests.Response]:
        """One try of :meth:`_request`."""
        target = f"{self.settings.endpoint}/{path}"
        allowed = set(ok)
        extra: dict[str, str] = kwargs.pop("headers", {})

        def attempt() -> requests.Response:
            headers = {**self.auth.headers(url), **extra}
            body: Any = kwargs.get("data")
            if hasattr(body, "seek"):
                body.seek(0)  # a retried upload sends the file again from its start
            try:
                answer = self._session.request(
                    method, target, headers=headers, timeout=_TIMEOUT, **kwargs
                )
            except requests.exceptions.SSLError as exc:
                raise PermanentFetchError(
                    f"{url}: {self.settings.describe()}: TLS failed: {exc}", url=url
                ) from exc
            if answer.status_code >= 300 and answer.status_code not in allowed:
                raise gcs_error(answer.status_code, answer.content, url, self.settings)
            return answer

        return attempt

    def call(self, url: str, attempt: Callable[[], T], *, at_open: bool = False) -> T:
        """``attempt`` retried under the one table (:mod:`._errors`); ``at_open``: all
        within ``open_deadline`` seconds (:mod:`._deadline`)."""
        if not at_open:
            return retrying_sync(attempt, url=url, policy=self._policy)
        seconds = self.settings.open_deadline
        with bounded(seconds, f"configure_store('gs', open_deadline={seconds:g})") as deadline:
            bounded_attempt = attempt_under(deadline, attempt)
            return retrying_sync(
                bounded_attempt, url=url, policy=self._policy, until=deadline.until
            )

    # -- the store's blocking half -------------------------------------------------------

    def list(self, url: str) -> list[Shard]:
        """Every object under the prefix ``url``, with its size and generation, sorted.

        Raises:
            NotFoundError: the bucket does not exist.
        """
        bucket, prefix = parse_gs_url(url)
        shards = [
            Shard(f"gs://{bucket}/{item['name']}", int(item["size"]), str(item["generation"]))
            for item in self._pages(url, bucket, prefix)
            if not item["name"].endswith("/")  # a console "folder" placeholder
        ]
        return sorted(shards, key=lambda s: s.url)

    def _pages(self, url: str, bucket: str, prefix: str) -> Iterator[dict[str, Any]]:
        token = ""
        pages = Pages(url)
        while True:
            params = {"prefix": prefix, "maxResults": self.settings.page_size}
            params["fields"] = _LIST_FIELDS
            if token:
                params["pageToken"] = token
            try:
                page = self._request("GET", url, f"storage/v1/b/{bucket}/o", params=params)
            except NotFoundError:
                raise NotFoundError(self._no_bucket(url, bucket), url=url) from None
            found = page.json()
            yield from found.get("items", [])
            token = found.get("nextPageToken", "")
            if not token:
                return
            pages.follow(str(token))

    def head(self, url: str) -> Shard:
        """One object's size and generation.

        Raises:
            NotFoundError: no such object (the message says whether the bucket exists).
        """
        bucket, name = parse_gs_url(url)
        try:
            answer = self._request("GET", url, f"storage/v1/{object_path(bucket, name)}")
        except NotFoundError:
            self.check_bucket(url)
            hint = self._prefix_hint(url, bucket, name)
            raise NotFoundError(
                f"{url}: {self.settings.describe()}: no such object in bucket {bucket!r}{hint}",
                url=url,
            ) from None
        found = answer.json()
        return Shard(url, int(found["size"]), str(found["generation"]))

    def _prefix_hint(self, url: str, bucket: str, name: str) -> str:
        """Where a missing object names a folder: say that a prefix ends with ``/``."""
        if not name or name.endswith("/"):
            return ""
        params = {"prefix": f"{name}/", "maxResults": 1, "fields": "items(name)"}
        page = self._request("GET", url, f"storage/v1/b/{bucket}/o", params=params).json()
        if page.get("items"):
            return f"; objects are under gs://{bucket}/{name}/: a prefix needs its trailing '/'"
        return ""

    def read(self, url: str) -> bytes | None:
        """A whole (small) object, or ``None`` where there is none.

        Raises:
            NotFoundError: the bucket does not exist.
        """
        bucket, name = parse_gs_url(url)
        path = f"download/storage/v1/{object_path(bucket, name)}"
        send = self._attempt("GET", url, path, params={"alt": "media"}, ok=(404,), stream=True)

        def get() -> bytes | None:  # the body read within the try, and its deadline
            answer = send()
            with contextlib.closing(answer):
                if answer.status_code == 404:
                    return None
                declared = answer.headers.get("content-length", "")
                if declared.isdigit() and int(declared) > MAX_OPEN_BYTES:
                    raise too_large(url, MAX_OPEN_BYTES, int(declared))
                data: bytes = answer.raw.read(MAX_OPEN_BYTES + 1, decode_content=True)
                if len(data) > MAX_OPEN_BYTES:
                    raise too_large(url, MAX_OPEN_BYTES)
                return data

        data = self.call(url, get, at_open=True)
        if data is None:
            self.check_bucket(url)
        return data

    def write(self, url: str, data: bytes | Any) -> str:
        """Write a whole object in one request (``data``: bytes or a file opened for
        reading); returns its new generation."""
        bucket, name = parse_gs_url(url)
        answer = self._request(
            "POST",
            url,
            f"upload/storage/v1/b/{bucket}/o",
            params={"uploadType": "media", "name": name},
            headers={"Content-Type": "application/octet-stream"},
            data=data,
            at_open=False,
        )
        return str(answer.json()["generation"])

    def upload(self, url: str, path: Path) -> str:
        """Store the local file ``path`` as the object ``url`` (one request, streamed from
        the file); returns its generation."""
        with path.open("rb") as body:
            return self.write(url, body)

    def delete(self, urls: Iterable[str]) -> None:
        """Remove objects; missing ones are fine."""
        for url in urls:
            bucket, name = parse_gs_url(url)
            path = f"storage/v1/{object_path(bucket, name)}"
            self._request("DELETE", url, path, ok=(404,), at_open=False)

    def check_bucket(self, url: str) -> None:
        """Raise ``NotFoundError`` unless the bucket of ``url`` exists (and is allowed):
        by a listing of one object, which a reader of the bucket may make (a bucket's own
        metadata needs more than that)."""
        bucket = parse_gs_url(url)[0]
        params = {"maxResults": 1, "fields": "nextPageToken"}
        try:
            self._request("GET", url, f"storage/v1/b/{bucket}/o", params=params)
        except NotFoundError:
            raise NotFoundError(self._no_bucket(url, bucket), url=url) from None

    def _no_bucket(self, url: str, bucket: str) -> str:
        return f"{url}: {self.settings.describe()}: no such bucket {bucket!r}"
