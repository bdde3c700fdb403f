"""``python -m bench``: see :mod:`bench.harness`."""

from .harness import main

main()
