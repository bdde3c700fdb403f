"""Two nodes: two network namespaces joined by a veth pair, each running a torchrun node of
2 ranks x 2 StatefulDataLoader workers, reading the web store through nginx in a third
namespace (tests/_netns.py), then resuming mid-epoch onto 1 node x 3 ranks.

Checked: every sample exactly once per epoch across the nodes (the whole epoch 0; epoch 1
read partly by the 2 nodes, saved, and finished by the 1 node), each node's rings (counted
from its processes' descriptors) and connections (at the store, by the node's address, and
by its readers' engines), every torchrun and DataLoader worker exiting 0 and no process
left in a namespace. Skipped, with the reason, without root, ``ip``, network namespaces or
nginx."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _netns import STORE_IP, NetnsUnavailable, Nodes, inode, thread_in
from _torchrun import command, environment

from asyncstream import pack
from asyncstream.testing import Nginx, NginxUnavailable, generate_imagefolder
from asyncstream.testing._nginxinstall import install

SAMPLES, SHARD_SAMPLES = 96, 8  # epoch 0: 24 a rank, 12 a worker
BATCH, WORKERS = 4, 2
SAVE_AFTER = [2, 3, 2, 2]  # batches of epoch 1 per old rank: 36 read, 60 left, 20 a new rank
NEW_RANKS = 3
MARK = "/mark-epoch1"  # asked by rank 0 between the epochs: the line in nginx's log
CHILD = Path(__file__).parent / "_nodes_child.py"
PORT = 29500  # the rendezvous, on node 0's link address: a namespace of its own, free
TIMEOUT = 150.0

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")


@pytest.fixture
def nodes() -> Iterator[Nodes]:
    try:
        made = Nodes(2).open()
    except NetnsUnavailable as exc:
        pytest.skip(f"no network namespaces here: {exc}")
    try:
        yield made
    finally:
        made.close()


@pytest.fixture
def store(nodes: Nodes, tmp_path: Path) -> Iterator[Nginx]:
    """nginx in the store's namespace, on STORE_IP, over the packed shards in ``ds/``."""
    try:
        install()  # here, where Debian's packages can be reached: in the namespace, the cache
    except NginxUnavailable as exc:
        pytest.skip(f"nginx with its Lua module cannot be installed here: {exc}")
    generate_imagefolder(tmp_path / "images", SAMPLES, 4, seed=0, workers=1)
    pack(tmp_path / "images", str(tmp_path / "www" / "ds"), shard_samples=SHARD_SAMPLES)
    server = Nginx(tmp_path / "www", host=STORE_IP)
    thread = thread_in(nodes.store)  # nginx is the namespace's, and listens there
    try:
        thread.submit(server.start).result()
        yield server
    finally:
        server.close()
        thread.shutdown()  # after: nginx stops when the thread that started it ends


def launch(nodes: Nodes, node: int, argv: list[str], **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        nodes.command(node, argv),
        env=environment(**env),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # a group of its own: killed whole on a failure
    )


def finish(procs: list[subprocess.Popen[str]]) -> list[tuple[int, str]]:
    """Each process's exit code and output; any still running at TIMEOUT killed."""
    deadline = time.monotonic() + TIMEOUT
    done = []
    try:
        for proc in procs:
            out, _ = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
            done.append((proc.returncode, out))
    finally:
        for proc in procs:
            if proc.poll() is None:
                subprocess.run(["kill", "-KILL", f"-{proc.pid}"], check=False)  # its group
                proc.wait()
    return done


def run_phase(
    nodes: Nodes, out: Path, spec: dict[str, Any], runs: list[tuple[int, dict[str, Any], str]]
) -> list[tuple[int, str]]:
    """``runs`` (node, torchrun's options for :func:`command`, GLOO_SOCKET_IFNAME) started
    at once; their exit codes and output."""
    path = out / f"spec-{spec['phase']}.json"
    path.write_text(json.dumps(spec))
    procs = [
        launch(nodes, node, command(CHILD, str(path), str(out), **options), GLOO_SOCKET_IFNAME=nic)
        for node, options, nic in runs
    ]
    return finish(procs)


def left_in(nodes: Nodes) -> dict[str, list[int]]:
    """Processes still in the nodes' namespaces, after a few seconds' grace (an engine
    whose reader exited stops at its pipe's end, on its own)."""
    deadline = time.monotonic() + 15
    while True:
        left = {name: nodes.pids(name) for name in nodes.nodes}
        if not any(left.values()) or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


def tar_connections(requests: list[Any], client: str) -> int:
    """Connections from ``client`` that carried a ranged GET of a shard (readers' engines;
    the open's HEADs and manifest reads come on connections of their own)."""
    return len(
        {
            r.connection
            for r in requests
            if r.client == client and r.method == "GET" and r.path.endswith(".tar")
        }
    )


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_two_namespace_nodes_read_exact_epochs_and_resume_onto_one_node_of_three(
    nodes: Nodes, store: Nginx, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    shards = SAMPLES // SHARD_SAMPLES
    stream = {"window": 3, "inflight": 2, "seed": 1}
    base = {"url": f"{store.url}/ds/shard-{{000000..{shards - 1:06d}}}.tar", "stream": stream}
    base |= {"batch": BATCH}
    master = nodes.node_ip(0)
    save = {**base, "phase": "save", "workers": WORKERS, "batches": SAVE_AFTER}
    save["mark"] = store.url + MARK
    # -- two nodes at once: node 0 in the first namespace (the rendezvous), node 1 in the second
    two = [
        (i, {"nproc": 2, "nnodes": 2, "node_rank": i, "master": master, "port": PORT}, "node")
        for i in range(2)
    ]
    began = time.monotonic()
    ran = run_phase(nodes, out, save, two)
    seconds = [time.monotonic() - began]
    for node, (code, output) in enumerate(ran):
        assert code == 0, f"node {node}:\n{output[-4000:]}"
    saved = store.requests()
    old = [json.loads((out / f"save{r}.json").read_text()) for r in range(4)]
    # -- one node of three ranks (one worker each) resumes epoch 1 from the 4 states
    one = [(0, {"nproc": NEW_RANKS}, "lo")]
    resume = {**base, "phase": "resume", "workers": 1, "old_world": 4}
    ran += run_phase(nodes, out, resume, one)
    seconds.append(time.monotonic() - began - seconds[0])
    assert ran[-1][0] == 0, ran[-1][1][-4000:]
    new = [json.loads((out / f"resume{r}.json").read_text()) for r in range(NEW_RANKS)]
    everything = {f"{i:06d}" for i in range(SAMPLES)}

    # The nodes are the namespaces: ranks 0 and 1 on node 0 (the first), 2 and 3 on node 1.
    spaces = [f"net:[{inode(name)}]" for name in nodes.nodes]
    assert [(o["node"], o["netns"]) for o in old] == [(r // 2, spaces[r // 2]) for r in range(4)]
    assert {o["netns"] for o in new} == {spaces[0]}

    # Epoch 0: every sample exactly once across the nodes, half on each.
    per_node = [[k for o in old if o["node"] == n for k in o["epoch0"]] for n in range(2)]
    assert sorted(per_node[0] + per_node[1]) == sorted(everything)
    assert [len(p) for p in per_node] == [SAMPLES // 2] * 2
    # Epoch 1: the 2 nodes' reads before the save and the 1 node's after, exactly once.
    before = [k for o in old for k in o["epoch1"]]
    after = [k for o in new for k in o["epoch1"]]
    assert len(before) == BATCH * sum(SAVE_AFTER)
    assert sorted(before + after) == sorted(everything)
    assert new[0]["samples"] == [(SAMPLES - len(before)) // NEW_RANKS] * NEW_RANKS

    # Rings: each node's own, counted from the descriptors of its processes.
    rings = [old[0]["rings"], old[2]["rings"], new[0]["rings"]]
    counts = [len(r) for r in rings]
    assert counts == [2 * WORKERS, 2 * WORKERS, NEW_RANKS]  # ranks x readers, per node
    assert not set(rings[0]) & set(rings[1])
    for found, report in zip(rings, (old[0], old[2], new[0]), strict=True):
        assert sum(found.values()) >= report["node_ring_bytes"]  # the node's, as it said
    # Connections of epoch 0, per node: at the store (by the node's address) and as the
    # node's readers' engines counted them, the same; the open's are node 0's, not 1's.
    mark = next(i for i, r in enumerate(saved) if r.path == MARK)
    served = [tar_connections(saved[:mark], nodes.client_ip(n)) for n in range(2)]
    engines = [
        sum(v for o in old if o["node"] == n for v in o["readers0"].values()) for n in range(2)
    ]
    assert all(n > 0 for n in served)
    assert served == engines
    assert {r.client for r in saved} == {nodes.client_ip(0), nodes.client_ip(1)}
    opens = [r for r in saved if r.method == "HEAD" or r.path.endswith(".json")]
    assert opens
    assert {r.client for r in opens} == {nodes.client_ip(0)}  # opened once, on node 0
    resumed = tar_connections(store.requests()[len(saved) :], nodes.client_ip(0))

    # Every process exited 0: the torchruns (so every rank), every worker; none left.
    assert [code for code, _ in ran] == [0, 0, 0]
    codes = [c for o in old + new for c in o["worker_exit_codes"]]
    assert codes == [0] * (4 * WORKERS * 2 + NEW_RANKS)  # 2 epochs on 4 ranks, 1 on 3
    assert left_in(nodes) == {name: [] for name in nodes.nodes}

    print(
        f"\nnode 0 ({nodes.nodes[0]}): epoch 0 {len(per_node[0])} samples, rings "
        f"{counts[0]}, connections {served[0]} (store) {engines[0]} (engines)"
        f"\nnode 1 ({nodes.nodes[1]}): epoch 0 {len(per_node[1])} samples, rings "
        f"{counts[1]}, connections {served[1]} (store) {engines[1]} (engines)"
        f"\nepoch 1: {len(before)} before the save on 2 nodes, {len(after)} after on 1 node"
        f" x {NEW_RANKS} ({new[0]['samples']}), rings {counts[2]}, connections {resumed}"
        f"\nexit codes: torchrun {[c for c, _ in ran]}, workers {len(codes)} x 0"
        f"\nseconds: 2 nodes {seconds[0]:.1f}, 1 node {seconds[1]:.1f}"
    )


def test_a_second_node_namespace_set_does_not_meet_the_first() -> None:
    """Names are the run's own; closing twice is safe."""
    try:
        with Nodes(2) as first, Nodes(1) as second:
            assert not set(first.names) & set(second.names)
            assert inode(first.nodes[0]) != inode(second.nodes[0])
            first.close()
            first.close()
    except NetnsUnavailable as exc:
        pytest.skip(f"no network namespaces here: {exc}")
    with pytest.raises(ValueError, match="two nodes"):
        Nodes(3)
