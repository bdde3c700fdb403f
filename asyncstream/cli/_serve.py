"""``asyncstream serve``: the embedded S3 server (:class:`~asyncstream.LocalS3`) for a shell.

It prints the endpoint and one ``export`` line to paste into another shell, after which
``asyncstream pack``, ``ls`` and ``index`` (and the AWS CLI, boto3, anything on
botocore's configuration chain) reach it with no flag; then it serves until Ctrl-C or
SIGTERM, and stops cleanly: the socket closed, the buckets and objects dropped (they live
in memory only), the ``--tls`` certificates deleted.

What it exposes: S3 with no authentication, to whoever reaches the port (loopback by
default; ``--host`` widens it). Web browsers and moto's admin API are refused
(:mod:`asyncstream.testing._guard`).
"""

from __future__ import annotations

import argparse
import contextlib
import shlex
import signal
import sys
import tempfile
import time
from typing import Any

__all__ = ["register"]

_REGION = "us-east-1"


def register(sub: Any) -> None:
    """Add the ``serve`` subcommand to the ``asyncstream`` command's subparsers."""
    serve = sub.add_parser(
        "serve",
        help="run the embedded S3 server (moto, in memory) until Ctrl-C",
        description=(
            "Run the embedded S3 server and print the environment that points other "
            "shells at it (AWS_ENDPOINT_URL, credentials, region). For local work and "
            "tests only: it is an S3 server with no authentication (it accepts any "
            "credentials), holding everything in memory, and anyone who can "
            "reach its port can list, read, write and delete every bucket. It listens on "
            "loopback (127.0.0.1) unless --host widens it. Web browsers are refused "
            "(requests from another origin, CORS preflights and, on loopback, host "
            "names that are not loopback ones), and so is moto's admin API (/moto-api/)."
        ),
    )
    serve.add_argument(
        "--host",
        default="127.0.0.1",
        help="the address to listen on (default: 127.0.0.1, loopback only); another address "
        "exposes every bucket, unauthenticated, to anyone who can reach it",
    )
    serve.add_argument("--port", type=int, default=0, help="the port to listen on; 0: a free one")
    serve.add_argument(
        "--bucket",
        action="append",
        metavar="NAME",
        help="create this bucket at start; repeat for more (default: none)",
    )
    serve.add_argument(
        "--tls",
        action="store_true",
        help="serve HTTPS with a test certificate made now, trusted through AWS_CA_BUNDLE "
        "(default: plain HTTP)",
    )
    serve.set_defaults(func=run)


def exports(endpoint_url: str, ca_bundle: str | None) -> dict[str, str]:
    """The environment that points botocore (and so asyncstream) at the server."""
    from ..testing._local import LOCAL_CREDENTIALS

    env = {
        "AWS_ENDPOINT_URL": endpoint_url,
        "AWS_ACCESS_KEY_ID": LOCAL_CREDENTIALS.access_key_id,
        "AWS_SECRET_ACCESS_KEY": LOCAL_CREDENTIALS.secret_access_key,
        "AWS_DEFAULT_REGION": _REGION,
    }
    if ca_bundle is not None:
        env["AWS_CA_BUNDLE"] = ca_bundle
    return env


def run(args: argparse.Namespace) -> int:
    """Serve until SIGINT or SIGTERM; returns the exit code."""
    from .._exceptions import ShardURLError
    from ..stores._s3 import check_bucket
    from ..testing import LocalS3, make_test_certificates

    for bucket in args.bucket or ():
        try:
            check_bucket(bucket)
        except ShardURLError as exc:  # before the server starts, as `pack` says it
            print(f"asyncstream: error: --bucket {exc}", file=sys.stderr)
            return 1
    # Signals held through the clean-up too, so that a second Ctrl-C cannot cut it short.
    with _signals_held() as wait, contextlib.ExitStack() as stack:
        tls = ca_bundle = None
        if args.tls:
            folder = stack.enter_context(tempfile.TemporaryDirectory(prefix="asyncstream-serve-"))
            hosts = dict.fromkeys((args.host, "127.0.0.1", "localhost"))
            certs = make_test_certificates(folder, hosts=list(hosts))
            tls, ca_bundle = certs.server, certs.ca
        server = LocalS3(host=args.host, port=args.port, tls=tls, ca_bundle=ca_bundle)
        try:
            server.start()
        except (OSError, RuntimeError) as exc:
            print(f"asyncstream: error: the S3 server did not start: {exc}", file=sys.stderr)
            return 1
        stack.callback(server.close)
        client = server.client()
        for bucket in args.bucket or ():
            client.create_bucket(Bucket=bucket)
        variables = exports(server.endpoint_url, ca_bundle)
        env = " ".join(f"{name}={shlex.quote(value)}" for name, value in variables.items())
        buckets = ", ".join(f"s3://{b}/" for b in args.bucket or ()) or "none yet"
        print(
            f"asyncstream: S3 server (moto, in memory) at {server.endpoint_url}; "
            f"buckets: {buckets}\n"
            "To use it from another shell (asyncstream, the AWS CLI, boto3):\n\n"
            f"export {env}\n\n"
            "Ctrl-C stops it; nothing it holds is kept.",
            flush=True,
        )
        received = wait()
    print(f"asyncstream: S3 server stopped ({received})", file=sys.stderr)
    return 0


@contextlib.contextmanager
def _signals_held() -> Any:
    """Hold SIGINT and SIGTERM for the block and yield a function that waits for one.

    They are blocked before the server's threads start (which inherit the mask), so
    whichever comes is taken by the wait, whenever it comes: no handler, no race.
    Where signals cannot be blocked (Windows), the wait ends on Ctrl-C.
    """
    held = {signal.SIGINT, signal.SIGTERM}
    if not hasattr(signal, "pthread_sigmask"):

        def sleep() -> str:
            try:
                while True:
                    time.sleep(3600)
            except KeyboardInterrupt:
                return "SIGINT"

        yield sleep
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, held)

    def wait() -> str:
        return signal.Signals(signal.sigwait(held)).name

    try:
        yield wait
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
