"""The child process of ``LocalS3(mode="process")``: ``python -m asyncstream.testing._s3child``.

Kept apart from ``_local.py`` (which ``import asyncstream`` loads), so that running it as
``__main__`` does not load it twice. It prints ``WARNING <text>`` for each warning of the
start (the parent raises them again), then ``READY <host> <port>``, and serves until its
stdin closes: when the parent closes it, or dies. The parent hands it the token that
opens moto's admin endpoints in its environment (:data:`._guard.ADMIN_TOKEN_ENV`).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import warnings

from . import _moto_ranges
from ._guard import ADMIN_TOKEN_ENV
from ._motoserver import MotoServer


def main() -> None:
    """Serve until stdin closes."""
    parser = argparse.ArgumentParser(description="embedded S3 server (internal)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--cert")
    parser.add_argument("--key")
    args = parser.parse_args()
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _moto_ranges.install()
    for warning in caught:
        if issubclass(warning.category, _moto_ranges.MotoRangesWarning):
            print("WARNING " + " ".join(str(warning.message).split()), flush=True)
    token = os.environ.pop(ADMIN_TOKEN_ENV, None)  # None: /moto-api/ closed to all
    tls = (args.cert, args.key) if args.cert else None
    server = MotoServer(args.host, args.port, tls, token)
    try:
        server.start()
    except OSError as exc:  # an address in use, certificate files that do not load
        print(f"asyncstream.testing._s3child: {type(exc).__name__}: {exc}", file=sys.stderr)
        sys.exit(1)
    bound_host, port = server.get_host_and_port()
    print(f"READY {bound_host} {port}", flush=True)
    sys.stdin.read()  # blocks until EOF
    server.stop()


if __name__ == "__main__":
    main()
