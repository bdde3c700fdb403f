"""``python -m asyncstream.engine FD``: the fetch engine's own process.

:class:`~._engine.Engine` starts it, with one end of a socket pair as ``FD``. Run as a
package's ``__main__``, the engine module itself is imported once, by its name, so the
engine settings the consumer sends (pickled by that name) need no second copy of it.
"""

import sys

from ._engine import _main

_main(int(sys.argv[1]))
