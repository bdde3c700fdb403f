"""Shared memory with no name: a segment known only by its file descriptors and mappings,
gone with the last of them.

Where the kernel has ``memfd_create`` (Linux), a segment is a memfd: it lives in the
kernel's own tmpfs, not in /dev/shm, so the size of /dev/shm (64 MB in a container by
default: Docker, Kubernetes without a memory volume) does not bind; the memory of the
machine or of the container's cgroup does. Elsewhere (macOS, or a seccomp filter that
refuses ``memfd_create``) it is a POSIX segment opened and unlinked at once: /dev/shm's size
binds there. Either way no name is left anywhere, so nothing outlives its processes, a
killed one included, and another process reaches a segment only through a descriptor it
was handed (``pass_fds``, ``SCM_RIGHTS``) or, for its own children, ``/proc/PID/fd``.

Tmpfs takes any size at creation and kills the process with SIGBUS (memfd: the cgroup's
OOM killer) at the first write past what it can hold, so :func:`check` refuses up front
what cannot fit, with the exact size to ask for.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from dataclasses import dataclass

__all__ = ["Room", "check", "create", "memory_free", "room", "shm_free"]

_MiB = 1 << 20


def create(tag: str, nbytes: int) -> int:
    """A new segment of ``nbytes`` (zeroes, not yet backed), private to this process
    (0600, close-on-exec), named ``<tag>-<pid>-<8 hex>`` where it shows
    (``/proc/PID/fd``, ``/proc/PID/maps``: ``/memfd:<name> (deleted)``).

    Returns:
        Its file descriptor, the caller's to close.
    """
    name = f"{tag}-{os.getpid()}-{secrets.token_hex(4)}"
    if hasattr(os, "memfd_create"):
        try:
            fd = os.memfd_create(name, os.MFD_CLOEXEC)
        except OSError:  # refused (ENOSYS, or EPERM under seccomp): the fallback
            pass
        else:
            return _sized(fd, nbytes)
    return _sized(_posix(name), nbytes)


def _posix(name: str) -> int:
    import _posixshmem  # type: ignore[import-not-found]  # what SharedMemory uses

    while True:
        with contextlib.suppress(FileExistsError):
            fd: int = _posixshmem.shm_open("/" + name, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
            break
        name = f"{name.rsplit('-', 1)[0]}-{secrets.token_hex(4)}"
    _posixshmem.shm_unlink("/" + name)  # from now on, only descriptors reach it
    os.set_inheritable(fd, False)
    return fd


def _sized(fd: int, nbytes: int) -> int:
    try:
        os.ftruncate(fd, nbytes)
    except BaseException:
        os.close(fd)
        raise
    return fd


@dataclass(frozen=True, slots=True)
class Room:
    """Where segments live and the bytes free there."""

    free: int
    where: str  # "memory" (memfd) or "/dev/shm"
    limit: str  # what bounds it, for the message


def shm_free() -> int | None:
    """Bytes free in /dev/shm, or ``None`` where there is none."""
    if not os.path.isdir("/dev/shm"):
        return None
    st = os.statvfs("/dev/shm")
    return st.f_bavail * st.f_frsize


def _shm_size() -> int:
    st = os.statvfs("/dev/shm")
    return st.f_blocks * st.f_frsize


def _read_int(path: str) -> int | None:
    try:
        with open(path) as file:
            text = file.read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _cgroup_free() -> int | None:
    """Bytes the memory cgroup of this process may still take (its limit less its use),
    ``None`` where there is no limit or none can be read (cgroup v2, then v1)."""
    try:
        with open("/proc/self/cgroup") as file:
            lines = file.read().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            bases, limit_file, usage_file = ("/sys/fs/cgroup",), "memory.max", "memory.current"
        elif "memory" in controllers.split(","):
            bases = ("/sys/fs/cgroup/memory",)
            limit_file, usage_file = "memory.limit_in_bytes", "memory.usage_in_bytes"
        else:
            continue
        for folder in (bases[0] + path.rstrip("/"), bases[0]):  # a cgroup namespace: root
            limit, usage = (_read_int(f"{folder}/{name}") for name in (limit_file, usage_file))
            if limit is not None and usage is not None:
                return max(0, limit - usage) if limit < 1 << 60 else None
    return None


def memory_free() -> tuple[int, str] | None:
    """Bytes of memory a memfd segment can still take here, and what bounds them: the
    machine's available memory and swap, or the cgroup's limit where lower; ``None``
    where neither can be read."""
    found: list[tuple[int, str]] = []
    with contextlib.suppress(OSError, ValueError):
        with open("/proc/meminfo") as file:
            fields = {k: int(v.split()[0]) * 1024 for k, v in (line.split(":", 1) for line in file)}
        found.append((fields["MemAvailable"] + fields.get("SwapFree", 0), "available memory"))
    cgroup = _cgroup_free()
    if cgroup is not None:
        found.append((cgroup, "the memory limit of this container (cgroup)"))
    return min(found) if found else None


def room() -> Room | None:
    """Where a new segment goes and its free bytes (``None`` where unknown)."""
    if hasattr(os, "memfd_create"):
        memory = memory_free()
        return None if memory is None else Room(memory[0], "memory", memory[1])
    free = shm_free()
    return None if free is None else Room(free, "/dev/shm", "the size of /dev/shm")


def check(nbytes: int, what: str, hint: str) -> None:
    """Refuse ``nbytes`` of segments where they cannot fit.

    Args:
        nbytes: the bytes asked for.
        what: what asks for them, for the message ("a ring of 300 MiB").
        hint: how to ask for less.

    Raises:
        ValueError: they do not fit; the message gives both sizes, the size to ask for
            (/dev/shm's new size, or the memory to add) and the ways out.
    """
    found = room()
    if found is None or nbytes <= found.free:
        return
    need, free = -(-nbytes // _MiB), found.free // _MiB
    if found.where == "/dev/shm":
        size = -(-(_shm_size() - found.free + nbytes) // _MiB)
        raise ValueError(
            f"{what}: {need} MiB needed in /dev/shm, {free} MiB free there: {hint}, or "
            f"enlarge /dev/shm to at least {size} MiB (docker run --shm-size={size}m, or a "
            "Kubernetes emptyDir with medium: Memory and sizeLimit)"
        )
    more = need - free
    raise ValueError(
        f"{what}: {need} MiB of memory needed, {free} MiB left ({found.limit}): {hint}, "
        f"or give this machine or container at least {more} MiB more memory"
    )
