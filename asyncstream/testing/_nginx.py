"""nginx as a store for tests and benchmarks: a folder over HTTP and HTTPS, for the web
store and, path-style, for the S3 store, on a link that costs the reader nothing.

The stores of the other test servers (moto, s3rver, the Python web server, the fault
proxy's shaping) pay per GET on the same cores as the reader they serve, so a benchmark
through them measures them as much as the reader. nginx is C with ``sendfile``: a GET
costs it microseconds, and :class:`Nginx` can pin it to a CPU of its own (``cpu=``, as
``taskset`` would) while the reader runs on the others.

What it serves, from ``root``:

* the web store: ``http://HOST:PORT/path/to/file`` (and ``https://`` with ``tls``):
  ``GET`` and ``HEAD``, single byte ranges (``206``, ``416``), ``ETag`` and
  ``Last-Modified``, ``If-Match``, ``If-Range``, keep-alive;
* the S3 store, path-style: each folder of ``root`` a bucket, each file under it an
  object (``s3://bucket/key`` with :meth:`Nginx.options`): the same GETs and HEADs, the
  signature ignored (any credentials do), S3's XML ``NoSuchKey`` / ``NoSuchBucket`` 404s,
  ``HEAD`` of a bucket and ListObjectsV2 (prefix, delimiter, pages) from a snapshot of
  the folder taken at start (:meth:`Nginx.refresh` takes another), in Lua
  (:mod:`._nginxlua`). Read-only: nothing is written through it.

The link: ``profile=NetworkProfile(first_byte_latency=(low, high),
bandwidth_bytes_per_s=rate)`` paces each connection to ``rate`` (the kernel's TCP pacing of
its socket, ``SO_MAX_PACING_RATE``: every body on it leaves at that rate, as the fault
proxy's token bucket paces a connection; nginx's ``limit_rate`` is the fallback, since it
delivers two thirds of its setting here) and delays every response by a uniform draw in
``[low, high]`` (``ngx.sleep``; no thread held), both in ``access_by_lua_block``
(:mod:`._nginxlua`). ``NetworkProfile.s3_like()`` is the fault proxy's S3-like link
without its CPU.

It runs as one process (``master_process off``, ``daemon off``) of this user, non-root
safe: every path (its configuration, logs, pid and temporary folders) lives in a temporary
prefix of its own, removed on close; it listens on free ports of ``host`` (loopback by
default; another address of the network namespace it starts in, a veth's say, for
clients in other namespaces); the kernel stops it when the process that started it dies
(Linux). nginx with its Lua module is found on the machine or unpacked from Debian's
packages on first use (:mod:`._nginxinstall`);
where it cannot be, :class:`NginxUnavailable` says why (the fixtures skip). One that is
there but does not start raises :class:`NginxStartError` (the end of its error log).

Example::

    with Nginx(folder, tls=certs.server, ca_bundle=certs.ca,
               profile=NetworkProfile.s3_like(), cpu=1) as nginx:
        ShardStream(f"{nginx.url}/ds/part-{{0..3}}.tar")            # the web store
        ShardStream("s3://ds/", s3=nginx.options(https=True))         # the S3 store
"""

from __future__ import annotations

import contextlib
import ctypes
import ipaddress
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..stores._s3 import S3Credentials, S3Options
from ._network import NetworkProfile
from ._nginxinstall import Installation, NginxUnavailable, install
from ._nginxlua import LINK_LUA, LISTING_LUA, write_listing
from ._served import Served
from ._webserver import ServedRequest

__all__ = ["CREDENTIALS", "Nginx", "NginxStartError", "NginxUnavailable"]

CREDENTIALS = S3Credentials("nginx", "nginx")  # any will do: signatures are not checked
_START_TIMEOUT = 30.0
_PORT_TRIES = 5
_UNSAFE = re.compile(r'["\\$\n\r]')  # what a quoted nginx path must not hold


class NginxStartError(RuntimeError):
    """nginx is installed but did not start: a failure, not a reason to skip."""


def _quoted(path: str | Path, what: str) -> str:
    text = str(path)
    if _UNSAFE.search(text):
        raise ValueError(f"{what} {text!r} holds a character nginx's configuration cannot")
    return f'"{text}"'


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def _child_setup(cpu: int | None) -> None:  # pragma: no cover - runs in the child before exec
    """Pin the child to ``cpu`` (``taskset``'s call) and have the kernel stop it when the
    process that started it dies."""
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class Nginx(Served):
    """nginx serving ``root`` on free ports of ``host``, as a context manager (module
    docstring).

    Args:
        root: the folder served (for S3: each folder in it a bucket).
        tls: ``(cert_pem, key_pem)``: also serve HTTPS, on a port of its own.
        ca_bundle: the CA of ``tls``'s certificate, for :meth:`options`.
        profile: the link: first-byte delay and per-connection rate (none by default).
        cpu: the CPU to pin nginx to, or None (where the scheduler puts it).
        seed: the seed of the delays' draws.
        host: the IPv4 address it listens on (one of this network namespace's).

    Attributes:
        url: ``http://HOST:PORT`` once started.
        https_url: ``https://HOST:PORT`` once started with ``tls``, else ``""``.
        installation: the nginx that runs (its binary, modules, where it came from).
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        tls: tuple[str, str] | None = None,
        ca_bundle: str | None = None,
        profile: NetworkProfile | None = None,
        cpu: int | None = None,
        seed: int = 0,
        host: str = "127.0.0.1",
    ) -> None:
        self.root = Path(root).resolve()
        self.host = str(ipaddress.IPv4Address(host))  # refused here if it is no address
        self.tls = tls
        self.ca_bundle = ca_bundle
        self.profile = profile or NetworkProfile.loopback()
        if cpu is not None and cpu not in os.sched_getaffinity(0):
            raise ValueError(f"cpu {cpu} is not one this process may run on")
        self.cpu = cpu
        self.seed = seed
        self.url = ""
        self.https_url = ""
        self.installation: Installation | None = None
        self._prefix: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    # -- life ----------------------------------------------------------------------------

    def start(self) -> Nginx:
        """Install if need be, start, and wait until it listens (once).

        Raises:
            NginxUnavailable: nginx with its Lua module cannot be found or installed.
            NginxStartError: it is there but does not start (the end of its error log).
            ValueError: a path nginx's configuration cannot hold.
        """
        if self._proc is not None:
            return self
        if not self.root.is_dir():
            raise ValueError(f"root {str(self.root)!r} is not a folder")
        _quoted(self.root, "root")  # refused before anything is made
        for path in self.tls or ():
            _quoted(path, "tls")
        self.installation = install()
        self._prefix = Path(tempfile.mkdtemp(prefix="asyncstream-nginx-"))
        (self._prefix / "bucket.lua").write_text(LISTING_LUA)
        (self._prefix / "asyncstream_link.lua").write_text(LINK_LUA)
        self.refresh()
        error = ""
        for _ in range(_PORT_TRIES):  # a free port may be taken before nginx binds it
            ports = (_free_port(self.host), _free_port(self.host) if self.tls else None)
            error = self._launch(*ports)
            if not error:
                self.url = f"http://{self.host}:{ports[0]}"
                self.https_url = f"https://{self.host}:{ports[1]}" if ports[1] else ""
                return self
            if "Address already in use" not in error:
                break
        self.close()
        raise NginxStartError(f"nginx ({self.installation.binary}) did not start: {error}")

    def _launch(self, port: int, tls_port: int | None) -> str:
        """Start nginx on these ports; ``""`` once it listens, else the end of its log."""
        assert self._prefix is not None
        assert self.installation is not None
        conf = self._prefix / "nginx.conf"
        conf.write_text(self.configuration(port, tls_port))
        log = self._prefix / "error.log"
        log.write_text("")
        command = [str(self.installation.binary), "-p", f"{self._prefix}/"]
        command += ["-c", str(conf), "-e", str(log)]
        linux = sys.platform.startswith("linux")
        cpu = self.cpu
        with open(self._prefix / "stderr.log", "ab") as stderr:
            self._proc = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                env=self.installation.environment(),
                preexec_fn=(lambda: _child_setup(cpu)) if linux else None,
            )
        deadline = time.monotonic() + _START_TIMEOUT
        # nginx says nothing once it listens: its ports are asked until one answers.
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                break
            with (
                contextlib.suppress(OSError),
                socket.create_connection((self.host, port), timeout=1),
            ):
                return ""
            time.sleep(0.02)
        code = self._proc.poll()
        self._stop()
        tail = (log.read_text(errors="replace") + self._stderr())[-800:].strip()
        how = f"exited with code {code}" if code is not None else "did not listen in time"
        return f"{how}: {tail}"

    def _stderr(self) -> str:
        assert self._prefix is not None
        with contextlib.suppress(OSError):
            return (self._prefix / "stderr.log").read_text(errors="replace")
        return ""

    def _stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        proc.terminate()  # nginx's fast shutdown
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def close(self) -> None:
        """Stop nginx and remove its prefix; safe to call more than once."""
        self._stop()
        prefix, self._prefix = self._prefix, None
        if prefix is not None:
            shutil.rmtree(prefix, ignore_errors=True)

    # -- what it runs ------------------------------------------------------------------------

    def configuration(self, port: int, tls_port: int | None = None) -> str:
        """nginx's configuration for these ports (what :meth:`start` writes)."""
        assert self._prefix is not None
        assert self.installation is not None
        prefix = self._prefix
        lines = [
            "daemon off;",
            "master_process off;",  # one process: the one pinned, and stopped by the kernel
            f"pid {_quoted(prefix / 'nginx.pid', 'prefix')};",
            f"lock_file {_quoted(prefix / 'nginx.lock', 'prefix')};",
            f"error_log {_quoted(prefix / 'error.log', 'prefix')} warn;",
            *(f"load_module {_quoted(m, 'module')};" for m in self.installation.modules),
            "events { worker_connections 4096; }",
            "http {",
            "  log_format served '$request_method\\t$uri\\t$status\\t$http_range'",
            "                    '\\t$body_bytes_sent\\t$connection\\t$remote_addr';",
            f"  access_log {_quoted(prefix / 'access.log', 'prefix')} served;",
            *(
                f"  {kind}_temp_path {_quoted(prefix / kind, 'prefix')};"
                for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
            ),
        ]
        lua_path = f"{prefix}/?.lua;{self.installation.lua_path};"
        lines.append(f"  lua_package_path {_quoted(lua_path, 'lua')};")
        lines += [
            f"  init_by_lua_block {{ math.randomseed({int(self.seed)}) }}",
            "  default_type application/octet-stream;",
            "  types { application/x-tar tar; application/json json; text/plain txt; }",
            "  sendfile on; tcp_nopush on; tcp_nodelay on; server_tokens off;",
            "  keepalive_timeout 75s; keepalive_requests 1000000;",
            "  server {",
            f"    listen {self.host}:{port};",
        ]
        if self.tls and tls_port:
            cert, key = self.tls
            lines += [
                f"    listen {self.host}:{tls_port} ssl;",
                f"    ssl_certificate {_quoted(cert, 'certificate')};",
                f"    ssl_certificate_key {_quoted(key, 'key')};",
                "    ssl_protocols TLSv1.2 TLSv1.3;",
            ]
        lines.append(f"    root {_quoted(self.root, 'root')};")
        rate = self.profile.bandwidth_bytes_per_s
        rate = 0 if rate is None else max(1, min(round(rate), 2**32 - 1))
        low, high = self.profile.first_byte_latency
        # On the locations a request enters from outside, not the named ones it is sent
        # on to, so that it waits once.
        delay = (
            "access_by_lua_block { require('asyncstream_link')"
            f".enter({rate}, {low!r}, {high - low!r}) }}"
            if rate or high > 0
            else ""
        )
        lua = _quoted(prefix / "bucket.lua", "prefix")
        listing = _quoted(prefix / "listing.tsv", "prefix")
        lines += [
            f"    location / {{ {delay} error_page 404 = @s3; }}",
            f'    location ~ "^/[^/]+/?$" {{ {delay} try_files $uri @s3; }}',
            f"    location @s3 {{ set $s3_listing {listing}; content_by_lua_file {lua}; }}",
            "  }",
            "}",
        ]
        return "\n".join(lines) + "\n"

    def refresh(self) -> int:
        """Take a new snapshot of ``root`` for the S3 listings (and buckets); returns the
        number of objects. Files are served as they are whether listed or not."""
        if self._prefix is None:
            raise RuntimeError("the server is not started")
        return write_listing(self.root, self._prefix / "listing.tsv")

    # -- what it tells -----------------------------------------------------------------------

    @property
    def pid(self) -> int | None:
        """nginx's process id once started, else None."""
        return self._proc.pid if self._proc is not None else None

    def cpus(self) -> set[int]:
        """The CPUs nginx may run on, as the kernel has them (its pinning).

        Raises:
            RuntimeError: the server is not started.
        """
        if self._proc is None:
            raise RuntimeError("the server is not started")
        return set(os.sched_getaffinity(self._proc.pid))

    def version(self) -> str:
        """nginx's version (``nginx -v``), e.g. ``"nginx/1.22.1"``."""
        installation = self.installation or install()
        done = subprocess.run(
            [str(installation.binary), "-v"],
            capture_output=True,
            text=True,
            env=installation.environment(),
            check=False,
        )
        return done.stderr.strip().rpartition(": ")[2]

    def requests(self) -> list[ServedRequest]:
        """Every request answered so far, from the access log: method, path, ``range``
        header (where sent), status, the client's address and the connection's serial
        number (distinct serials from one address: the connections it opened)."""
        if self._prefix is None:
            return []
        served = []
        with contextlib.suppress(FileNotFoundError):
            text = (self._prefix / "access.log").read_text(errors="replace")
            for line in text.splitlines():
                fields = line.split("\t")
                if len(fields) < 6 or not fields[2].isdigit():
                    continue
                headers = {"range": fields[3]} if fields[3] not in ("", "-") else {}
                connection = int(fields[5]) if fields[5].isdigit() else 0
                client = fields[6] if len(fields) > 6 else ""
                served.append(
                    ServedRequest(fields[0], fields[1], headers, int(fields[2]), client, connection)
                )
        return served

    def options(self, *, https: bool = False, **overrides: Any) -> S3Options:
        """:class:`S3Options` for the S3 store (path-style, any credentials), over HTTP or
        over HTTPS (with ``ca_bundle``), resolved.

        Raises:
            RuntimeError: not started, or ``https`` without ``tls``.
        """
        endpoint = self.https_url if https else self.url
        if not endpoint:
            raise RuntimeError("the server is not started" + (" with tls" if https else ""))
        options = S3Options(
            endpoint_url=endpoint,
            credentials=CREDENTIALS,
            ca_bundle=self.ca_bundle if https else None,
            addressing_style="path",
        )
        return replace(options, **overrides).resolve()
