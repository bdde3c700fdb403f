"""Processes as the tests see them, from /proc (shared by test modules and the child
scripts, which run with this folder first on ``sys.path``)."""

from __future__ import annotations

import os

_ENGINE_MODULE = b"asyncstream.engine"


def _stat(pid: int | str) -> list[str] | None:
    """The fields of ``/proc/PID/stat`` after the command name: state, ppid, ..."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()
    except (FileNotFoundError, ProcessLookupError):
        return None


def alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie is dead for our purposes)."""
    fields = _stat(pid)
    return fields is not None and fields[0] != "Z"


def engine_pids() -> list[int]:
    """Live children of this process that run the fetch engine."""
    me = os.getpid()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        fields = _stat(entry)
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read().split(b"\0")
        except OSError:
            continue
        if fields and int(fields[1]) == me and fields[0] != "Z" and _ENGINE_MODULE in cmdline:
            found.append(int(entry))
    return found
