"""``python -m asyncstream.cli``: the ``asyncstream`` command, where no script is installed."""

import sys

from ._cli import main

sys.exit(main())
