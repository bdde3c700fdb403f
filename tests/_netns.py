"""Nodes as Linux network namespaces, for the many-node tests (root and ``ip`` only).

:class:`Nodes` makes ``n`` node namespaces and one for a store, each with its loopback up,
wired with veth pairs (no bridge, nothing in this namespace)::

      node 0 ──── the node link (10.77.0.0/24, ``node`` in each) ──── node 1 ...
         │                                                              │
       store0 (10.77.11.0/30)                                      store1 (10.77.12.0/30)
         │                                                              │
         └────────────── the store: STORE_IP on its loopback ───────────┘

Every node reaches the store at one address, :data:`STORE_IP` (a /32 on the store's
loopback, routed through each node's own link to it), so that every node reads the same
URLs; the store sees each node's requests come from that node's link address
(:meth:`Nodes.client_ip`). Nodes reach each other on the node link (:meth:`Nodes.node_ip`,
the interface ``node``: ``GLOO_SOCKET_IFNAME`` for gloo).

Names carry a random suffix, so that runs beside each other do not meet; :meth:`Nodes.close`
deletes every namespace made (the veths in them go with them), also after a failure half-way
through setting up. Commands run in a node through :meth:`Nodes.command` (``ip netns exec``);
a function runs in a namespace on the thread of :func:`thread_in` (``setns`` on a thread of
its own: sockets it opens and processes it starts are the namespace's).
"""

from __future__ import annotations

import ctypes
import os
import secrets
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

STORE_IP = "10.77.10.1"
_CLONE_NEWNET = 0x40000000
_NETNS_DIR = Path("/var/run/netns")


class NetnsUnavailable(RuntimeError):
    """Network namespaces cannot be made here (not root, no ``ip``, or refused)."""


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise NetnsUnavailable(f"ip {' '.join(args)}: {done.stderr.strip()}")


def inode(name: str) -> int:
    """The namespace's inode: what ``readlink /proc/PID/ns/net`` shows as ``net:[N]`` for
    a process in it."""
    return os.stat(_NETNS_DIR / name).st_ino


def _enter(name: str) -> None:
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    with open(_NETNS_DIR / name) as ns:
        if libc.setns(ns.fileno(), _CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns into {name}")


def thread_in(name: str) -> ThreadPoolExecutor:
    """One thread that entered the network namespace ``name`` first, as an executor: what
    it runs opens its sockets and starts its processes there. Shut it down only once those
    processes are stopped: a child started with a parent-death signal (nginx's) gets it
    when the *thread* that started it ends."""
    return ThreadPoolExecutor(1, f"netns-{name}", _enter, (name,))


class Nodes:
    """``n`` (one or two) node namespaces and a store's, wired (module docstring), by
    :meth:`open` or on entering a ``with`` block."""

    def __init__(self, n: int = 2) -> None:
        if n not in (1, 2):
            raise ValueError(f"one or two nodes (one veth pair between them), not {n}")
        self.n = n
        tag = secrets.token_hex(3)
        self.nodes = [f"asn-n{i + 1}-{tag}" for i in range(n)]
        self.store = f"asn-store-{tag}"
        self._made: list[str] = []

    @property
    def names(self) -> list[str]:
        """Every namespace's name: the nodes', then the store's."""
        return [*self.nodes, self.store]

    def node_ip(self, node: int) -> str:
        """Node ``node``'s address on the node link."""
        return f"10.77.0.{node + 1}"

    def client_ip(self, node: int) -> str:
        """Node ``node``'s address on its link to the store (what the store sees)."""
        return f"10.77.{11 + node}.1"

    def command(self, node: int, argv: list[str]) -> list[str]:
        """``argv`` run in node ``node``'s namespace."""
        return ["ip", "netns", "exec", self.nodes[node], *argv]

    def pids(self, name: str) -> list[int]:
        """The processes in namespace ``name`` now."""
        done = subprocess.run(
            ["ip", "netns", "pids", name], capture_output=True, text=True, check=True
        )
        return [int(p) for p in done.stdout.split()]

    def open(self) -> Nodes:
        """Make and wire the namespaces (:meth:`close` deletes them).

        Raises:
            NetnsUnavailable: not root, no ``ip``, or the kernel refused a namespace or
                veth (what was made is deleted).
        """
        if os.geteuid() != 0:
            raise NetnsUnavailable("network namespaces need root")
        if shutil.which("ip") is None:
            raise NetnsUnavailable("no `ip` (iproute2) on PATH")
        try:
            self._wire()
        except BaseException:
            self.close()
            raise
        return self

    def _wire(self) -> None:
        for name in self.names:
            _ip("netns", "add", name)
            self._made.append(name)
            _ip("-n", name, "link", "set", "lo", "up")
        _ip("-n", self.store, "addr", "add", f"{STORE_IP}/32", "dev", "lo")
        for i, node in enumerate(self.nodes):
            if i == 1:  # the node link: one veth pair, node 0 to node 1
                _ip(
                    "link", "add", "node", "netns", self.nodes[0], "type", "veth",
                    "peer", "name", "node", "netns", node,
                )  # fmt: skip
            # the node's own link to the store
            _ip(
                "link", "add", "store", "netns", node, "type", "veth",
                "peer", "name", f"n{i}", "netns", self.store,
            )  # fmt: skip
            _ip("-n", node, "addr", "add", f"{self.client_ip(i)}/30", "dev", "store")
            _ip("-n", self.store, "addr", "add", f"10.77.{11 + i}.2/30", "dev", f"n{i}")
            _ip("-n", node, "link", "set", "store", "up")
            _ip("-n", self.store, "link", "set", f"n{i}", "up")
            _ip("-n", node, "route", "add", f"{STORE_IP}/32", "via", f"10.77.{11 + i}.2")
        for i, node in enumerate(self.nodes if self.n > 1 else []):
            _ip("-n", node, "addr", "add", f"{self.node_ip(i)}/24", "dev", "node")
            _ip("-n", node, "link", "set", "node", "up")

    def close(self) -> None:
        """Delete every namespace made (their veths go with them); safe to call twice."""
        while self._made:
            name = self._made.pop()
            subprocess.run(["ip", "netns", "del", name], capture_output=True, check=False)

    def __enter__(self) -> Nodes:
        return self.open()

    def __exit__(self, *exc_info: object) -> None:
        self.close()
