"""The harness side: which peers run in which interpreter, and one peer run in a child
process of its own (conversion, then reading), bounded in time.

Nothing here imports a peer's library: the harness runs in the main environment, where
MosaicML streaming and litdata are not installed (see ``bench/peers/README.md``).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ._common import PEERS, PROBE_TAG, split_s3_url

if TYPE_CHECKING:
    from asyncstream import S3Credentials, ShuffleQuality

__all__ = [
    "PEERS_VENV",
    "PeerSettings",
    "available",
    "default_target",
    "interpreters",
    "locate",
    "run_mix",
    "run_peer",
    "shuffle_quality_of",
]

REPO = Path(__file__).resolve().parents[2]
PEERS_VENV = REPO / ".venv-peers"
"""The isolated environment that ``python -m bench.peers.setup`` builds."""

_PROBE_TIMEOUT = 180.0
_LOG_TAIL = 1500
# MosaicML streaming names its shared-memory segments with a six-digit prefix.
_MOSAIC_SHM = re.compile(r"^\d{6}_")


@dataclass(frozen=True, kw_only=True)
class PeerSettings:
    """How a peer reads, beyond its library's defaults.

    Args:
        seed: the shuffle seed.
        workers: DataLoader worker processes; 0 reads in the peer's process (the naive
            baseline accepts only 0).
        batch_size: the per-device batch size, given to peers whose shuffle or partition
            depends on it (MosaicML streaming).
        shuffle_buffer: webdataset's sample shuffle buffer, in samples.
    """

    seed: int = 0
    workers: int = 0
    batch_size: int = 64
    shuffle_buffer: int = 1000

    def __post_init__(self) -> None:
        for name in ("seed", "workers", "batch_size", "shuffle_buffer"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"{name} must be an int, got {type(value).__name__}")
        if self.seed < 0 or self.workers < 0:
            raise ValueError("seed and workers must be >= 0")
        if self.batch_size < 1 or self.shuffle_buffer < 1:
            raise ValueError("batch_size and shuffle_buffer must be >= 1")


def interpreters() -> list[str]:
    """The interpreters a peer is looked for in, in order: this one, then ``.venv-peers``'s
    when it has been built."""
    found = [sys.executable]
    peers = PEERS_VENV / "bin" / "python"
    if peers.exists():
        found.append(str(peers))
    return found


def _base_env() -> dict[str, str]:
    env = dict(os.environ)
    # ``python -m bench.peers.run`` must find this checkout whatever the interpreter.
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    return env


@functools.cache
def _probe(python: str) -> Mapping[str, Mapping[str, Any]]:
    """What ``python -m bench.peers.run --probe`` says, cached per interpreter."""
    try:
        proc = subprocess.run(
            [python, "-m", "bench.peers.run", "--probe"],
            cwd=REPO,
            env=_base_env(),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=_PROBE_TIMEOUT,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {name: {"ok": False, "error": f"probe failed: {exc}"} for name in PEERS}
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(PROBE_TAG):
            report: dict[str, dict[str, Any]] = json.loads(line[len(PROBE_TAG) :])
            return report
    tail = " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-3:])
    return {
        name: {"ok": False, "error": f"probe exited with {proc.returncode}: {tail}"}
        for name in PEERS
    }


def locate(name: str, pythons: Sequence[str] | None = None) -> tuple[str | None, str]:
    """The first interpreter in which peer ``name`` imports.

    Args:
        name: a peer (see :data:`PEERS`).
        pythons: interpreters to try, in order; :func:`interpreters` by default.

    Returns:
        ``(python, "")``, or ``(None, why)`` when none has it.
    """
    if name not in PEERS:
        raise ValueError(f"unknown peer {name!r}; the peers are {', '.join(PEERS)}")
    candidates = list(pythons) if pythons is not None else interpreters()
    reasons = []
    for python in candidates:
        report = _probe(python).get(name, {"ok": False, "error": "not probed"})
        if report["ok"]:
            return python, ""
        reasons.append(f"{report['error']} (in {python})")
    if pythons is None and len(candidates) == 1:
        reasons.append(f"{PEERS_VENV} is not built: run `python -m bench.peers.setup`")
    return None, "; ".join(reasons)


def available(pythons: Sequence[str] | None = None) -> dict[str, str | None]:
    """Every peer, mapped to ``None`` when it can run here, else to the reason it cannot.

    Args:
        pythons: interpreters to look in, in order; :func:`interpreters` by default.
    """
    candidates = list(pythons) if pythons is not None else interpreters()
    with ThreadPoolExecutor(len(candidates)) as pool:  # the probes take seconds each
        list(pool.map(_probe, candidates))
    return {name: locate(name, pythons)[1] or None for name in PEERS}


def default_target(shards: Sequence[str], name: str) -> str:
    """Where a converting peer writes its format: ``s3://BUCKET/_peers/NAME/DIR/``, with the
    bucket and folder of the first shard."""
    bucket, key = split_s3_url(shards[0])
    folder = key.rpartition("/")[0]
    return f"s3://{bucket}/_peers/{name}/" + (f"{folder}/" if folder else "")


def _resolve(
    url: str | Sequence[str],
    endpoint_url: str | None,
    credentials: S3Credentials | None,
    region: str,
) -> list[str]:
    from asyncstream import S3Options, resolve_shards

    options = S3Options(endpoint_url=endpoint_url, region_name=region, credentials=credentials)
    shards = [shard.url for shard in resolve_shards(url, options.resolve())]
    local = [shard for shard in shards if not shard.startswith("s3://")]
    if local:
        raise ValueError(f"the peers read from S3 only, got local shards such as {local[0]!r}")
    return shards


def _child_env(
    endpoint_url: str | None, credentials: S3Credentials | None, region: str, tmpdir: Path
) -> dict[str, str]:
    env = _base_env()
    if endpoint_url:
        # boto3 reads AWS_ENDPOINT_URL(_S3); MosaicML streaming reads S3_ENDPOINT_URL.
        for var in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "S3_ENDPOINT_URL"):
            env[var] = endpoint_url
    if credentials is not None:
        env["AWS_ACCESS_KEY_ID"] = credentials.access_key_id
        env["AWS_SECRET_ACCESS_KEY"] = credentials.secret_access_key
        if credentials.session_token:
            env["AWS_SESSION_TOKEN"] = credentials.session_token
        else:
            env.pop("AWS_SESSION_TOKEN", None)
    env["AWS_DEFAULT_REGION"] = env["AWS_REGION"] = region
    # Every library's tempfile.gettempdir() default (locks, caches) lands in the scratch.
    env["TMPDIR"] = str(tmpdir)
    return env


def _shm_names() -> set[str]:
    try:
        return set(os.listdir("/dev/shm"))
    except OSError:
        return set()


def _exit_reason(code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"signal {signal.Signals(-code).name}"
    return f"status {code}"


def _tail(path: Path) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return text[-_LOG_TAIL:].strip()


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """Kill what is left of the child's session (its curl, its DataLoader workers)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _run_phase(
    python: str,
    spec: dict[str, Any],
    phase: str,
    workdir: Path,
    env_args: tuple[str | None, S3Credentials | None, str],
    timeout: float,
) -> tuple[dict[str, Any] | None, str | None]:
    stem = f"{spec['peer']}-{phase}"
    scratch = workdir / stem
    shutil.rmtree(scratch, ignore_errors=True)
    (scratch / "tmp").mkdir(parents=True)
    spec_path = workdir / f"{stem}.spec.json"
    out_path = workdir / f"{stem}.json"
    log_path = workdir / f"{stem}.log"
    out_path.unlink(missing_ok=True)
    spec_path.write_text(json.dumps({**spec, "phase": phase, "scratch": str(scratch)}))
    shm_before = _shm_names()
    error: str | None = None
    try:
        with log_path.open("wb") as log:
            proc = subprocess.Popen(
                [python, "-m", "bench.peers.run", "--spec", str(spec_path), "--out", str(out_path)],
                cwd=REPO,
                env=_child_env(*env_args, scratch / "tmp"),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            try:
                proc.wait(timeout=max(timeout, 0.001))
            except subprocess.TimeoutExpired:
                error = f"timed out after {timeout:.1f} s"
            finally:
                _kill_group(proc)  # also on success: nothing of the child outlives it
        if error is None and proc.returncode != 0:
            error = f"exited with {_exit_reason(proc.returncode)}: {_tail(log_path)}"
        if error is not None and spec["peer"] == "mosaic":
            # Killed before its own clean-up, MosaicML streaming leaves segments behind.
            for name in _shm_names() - shm_before:
                if _MOSAIC_SHM.match(name):
                    with contextlib.suppress(OSError):
                        os.unlink(f"/dev/shm/{name}")
        if error is not None:
            return None, error
        result: dict[str, Any] = json.loads(out_path.read_text())
        return result, None
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def run_peer(
    name: str,
    *,
    url: str | Sequence[str],
    workdir: str | os.PathLike[str],
    endpoint_url: str | None = None,
    credentials: S3Credentials | None = None,
    region: str = "us-east-1",
    settings: PeerSettings | None = None,
    target: str | None = None,
    convert: bool = True,
    timeout: float = 1800.0,
    python: str | None = None,
) -> dict[str, Any]:
    """Run one peer over the tar shards at ``url``: its conversion if it has one, then one
    epoch read, each in a child process of its own.

    A peer that fails, crashes or runs out of time does not raise: the result says so.

    Args:
        name: a peer (see :data:`PEERS`).
        url: the tar shards, as ``ShardStream`` takes them (``s3://bucket/prefix/``, a brace
            pattern or a list); resolved here, once, so every peer reads the same shards.
        workdir: a folder for the runs' specs, results and logs (kept) and scratch folders
            (caches, removed after each phase).
        endpoint_url: the S3 endpoint (moto, a proxy in front of it, ...); ``None`` for
            the standard AWS configuration.
        credentials: explicit credentials; ``None`` for the standard chain.
        region: the region.
        settings: seed, workers, batch size, shuffle buffer.
        target: where a converting peer writes its format (:func:`default_target` if
            ``None``); its old contents are deleted first.
        convert: ``False`` reads a conversion already at ``target``.
        timeout: seconds for the conversion and the read together (the children's time;
            finding the interpreter and listing the shards come before).
        python: the interpreter; by default the first of :func:`interpreters` that has it.

    Returns:
        ``{"peer", "ok", "error", "python", "settings", "shards", "target", "convert",
        "read"}``: ``convert`` and ``read`` hold the child's measurements (see
        ``bench/peers/run.py``), ``convert`` is ``None`` for peers that read the tars.

    Raises:
        ValueError: an unknown peer, a bad argument, shards that are not on S3.
        asyncstream.AsyncStreamError: the shards could not be listed.
    """
    if name not in PEERS:
        raise ValueError(f"unknown peer {name!r}; the peers are {', '.join(PEERS)}")
    if timeout <= 0:
        raise ValueError(f"timeout must be > 0, got {timeout}")
    settings = settings if settings is not None else PeerSettings()
    folder = Path(workdir)
    folder.mkdir(parents=True, exist_ok=True)
    shards = _resolve(url, endpoint_url, credentials, region)
    converts = PEERS[name].converts
    result: dict[str, Any] = {
        "peer": name,
        "ok": False,
        "error": None,
        "python": python,
        "settings": asdict(settings),
        "shards": len(shards),
        "target": (target or default_target(shards, name)) if converts else None,
        "convert": None,
        "read": None,
    }
    if python is None:
        python, why = locate(name)
        if python is None:
            result["error"] = f"not available: {why}"
            return result
        result["python"] = python
    spec = {
        "peer": name,
        "shards": shards,
        "target": result["target"] or "",
        "endpoint_url": endpoint_url,
        "region": region,
        **asdict(settings),
    }
    deadline = time.monotonic() + timeout  # for the children: not the probe, not the listing
    for phase in (["convert"] if converts and convert else []) + ["read"]:
        left = deadline - time.monotonic()
        if left <= 0:
            result["error"] = f"{phase}: no time left of the {timeout:g} s given"
            return result
        measured, error = _run_phase(
            python, spec, phase, folder, (endpoint_url, credentials, region), left
        )
        result[phase] = measured
        if error is not None:
            result["error"] = f"{phase}: {error}"
            return result
    result["ok"] = True
    return result


def run_mix(
    name: str,
    *,
    sources: Sequence[tuple[str, str | Sequence[str], float]],
    samples: int,
    workdir: str | os.PathLike[str],
    endpoint_url: str | None = None,
    credentials: S3Credentials | None = None,
    region: str = "us-east-1",
    settings: PeerSettings | None = None,
    timeout: float = 1800.0,
) -> dict[str, Any]:
    """Run one peer's mixing of several datasets (its conversion of each first, if it
    converts), reading ``samples`` samples, in a child process of its own.

    Args:
        name: a peer with a ``mix_samples`` (webdataset, litdata).
        sources: ``(name, url, weight)`` of each dataset, ``url`` as :func:`run_peer`
            takes it.
        samples: how many samples to read (fewer when a source runs out first).
        workdir, endpoint_url, credentials, region, settings, timeout: as :func:`run_peer`.

    Returns:
        ``{"peer", "ok", "error", "python", "mix"}``: ``mix`` holds the child's
        measurements (``bench/peers/run.py``), ``sources`` among them.
    """
    if name not in PEERS:
        raise ValueError(f"unknown peer {name!r}; the peers are {', '.join(PEERS)}")
    settings = settings if settings is not None else PeerSettings()
    folder = Path(workdir)
    folder.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"peer": name, "ok": False, "error": None, "python": None, "mix": None}
    python, why = locate(name)
    if python is None:
        result["error"] = f"not available: {why}"
        return result
    result["python"] = python
    resolved = []
    for source, url, weight in sources:
        shards = _resolve(url, endpoint_url, credentials, region)
        target = default_target(shards, f"{name}-mix")
        resolved.append({"name": source, "shards": shards, "weight": weight, "target": target})
    spec = {
        "peer": name,
        "shards": resolved[0]["shards"],
        "target": "",
        "endpoint_url": endpoint_url,
        "region": region,
        **asdict(settings),
        "mix": {"sources": resolved, "samples": samples, "convert": True},
    }
    measured, error = _run_phase(
        python, spec, "mix", folder, (endpoint_url, credentials, region), timeout
    )
    result["mix"], result["error"], result["ok"] = measured, error, error is None
    return result


def shuffle_quality_of(
    result: Mapping[str, Any],
    *,
    batch_size: int = 64,
    index_of: Mapping[str, int] | None = None,
) -> ShuffleQuality:
    """:func:`asyncstream.shuffle_quality` of a peer's emitted order.

    Args:
        result: what :func:`run_peer` returned (its ``read`` part is used).
        batch_size: for distinct classes per batch.
        index_of: each key's position in the unshuffled dataset; by default the key read
            as an integer, which is that position for datasets written by
            ``asyncstream pack`` (``000017`` is the 18th sample, in shard order).
    """
    from asyncstream import shuffle_quality

    read = result["read"]
    if read is None:
        raise ValueError(f"peer {result['peer']!r} has no read result: {result['error']}")
    keys: list[str] = read["keys"]
    order = [index_of[key] for key in keys] if index_of is not None else [int(k) for k in keys]
    return shuffle_quality(order, read["labels"], batch_size=batch_size)
