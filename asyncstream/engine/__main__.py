"""``python -m asyncstream.engine FD IDLE [MODULE ...]``: the fetch engine's own process.

:func:`~._launch.spawn` starts it, with one end of a socket pair as ``FD``, the seconds
to wait for its settings (``-``: no limit) and the modules to import meanwhile; the
engine's side is :func:`._server.serve`. Run as a package's ``__main__``, the engine's
modules are imported once, by their names, so the settings the consumer sends (pickled
by those names) need no second copy of them.
"""

import sys

from ._server import serve

serve(int(sys.argv[1]), None if sys.argv[2] == "-" else float(sys.argv[2]), sys.argv[3:])
