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


def _label(target: str) -> str | None:
    """A shared-memory segment's label from a ``/proc`` link or maps path: a memfd's
    (``/memfd:NAME (deleted)``) or a /dev/shm segment's (``/dev/shm/NAME``)."""
    target = target.strip().removesuffix(" (deleted)")
    for prefix in ("/memfd:", "/dev/shm/"):
        if target.startswith(prefix):
            return target[len(prefix) :]
    return None


def _pid_of(label: str) -> int | None:
    field = label.rsplit("-", 2)[-2] if label.count("-") >= 2 else ""
    return int(field) if field.isdigit() else None


def segments(prefixes: tuple[str, ...], pids: set[int] | None = None) -> set[str]:
    """The shared-memory segments labelled with one of ``prefixes`` that are still alive:
    named in /dev/shm, or held (a descriptor or a mapping) by a live process (of ``pids``,
    which also made the named ones; ``None``: any process on the machine). Segments have
    no name: one nobody holds is gone, so this is every segment that leaks."""
    found = set()
    if os.path.isdir("/dev/shm"):  # named ones: made by one of ``pids`` (``<tag>-<pid>-<hex>``)
        named = (n for n in os.listdir("/dev/shm") if n.startswith(prefixes))
        found |= {n for n in named if pids is None or _pid_of(n) in pids}
    procs = [str(p) for p in pids] if pids is not None else os.listdir("/proc")
    for pid in procs:
        if not pid.isdigit():
            continue
        targets: list[str] = []
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                try:
                    targets.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
                except OSError:
                    continue
            with open(f"/proc/{pid}/maps") as maps:
                targets += [line.split(None, 5)[5] for line in maps if line.count(" ") >= 5]
        except (OSError, IndexError):
            pass
        labels = (_label(t) for t in targets)
        found |= {label for label in labels if label and label.startswith(prefixes)}
    return found


def segment_usage(prefix: str, pid: int | str = "self") -> dict[str, int]:
    """The segments labelled ``prefix...`` that process ``pid`` holds a descriptor of:
    count, size, and bytes in use (tmpfs allocates a page when it is first written)."""
    seen: dict[tuple[int, int], os.stat_result] = {}
    for fd in os.listdir(f"/proc/{pid}/fd"):
        path = f"/proc/{pid}/fd/{fd}"
        try:
            label = _label(os.readlink(path))
            if label is not None and label.startswith(prefix):
                st = os.stat(path)
                seen[(st.st_dev, st.st_ino)] = st
        except OSError:  # closed meanwhile (listdir's own, for one)
            continue
    return {
        "segments": len(seen),
        "size": sum(st.st_size for st in seen.values()),
        "used": sum(st.st_blocks * 512 for st in seen.values()),
    }
