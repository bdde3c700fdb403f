"""The ``asyncstream`` command (:mod:`._cli`) and its ``serve`` (:mod:`._serve`).

Layer: the top; stands on everything else, test support included (``generate``,
``serve``). ``python -m asyncstream.cli`` runs it where no script is installed.
"""
