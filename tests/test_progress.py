"""Progress where work is long: ``pack``, ``index`` and a counting open.

The command runs in a child process with stderr on a pseudo-terminal (``pty``), as a
user's shell gives it, or on a pipe, as a script's; stdout is a pipe. On a terminal the
bars show and the one-line summary follows on stdout; on a pipe, or with ``--quiet`` or
``--no-progress``, no bar shows and the summary is printed all the same. From Python
nothing is shown unless ``progress=True`` asks for it.
"""

from __future__ import annotations

import errno
import fcntl
import os
import pty
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pytest

from asyncstream import CountProgress, ShardStream, index_dataset, pack
from asyncstream.testing import generate_imagefolder
from tests._foreign import ForeignShards, write_foreign_shards

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="pseudo-terminals are POSIX")

BAR = "%|"  # tqdm's percentage before the bar itself: "packing: 100%|####| 40/40"
CLI = "import sys; from asyncstream.cli._cli import main; sys.exit(main())"


def run(args: list[str], *, tty: bool) -> tuple[int, str, str]:
    """Run the command; its exit status, stdout and stderr (read from the terminal)."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    env.pop("TQDM_DISABLE", None)
    if not tty:
        done = subprocess.run(
            [sys.executable, "-c", CLI, *args],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
            check=False,
        )
        return done.returncode, done.stdout, done.stderr
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))
    child = subprocess.Popen(
        [sys.executable, "-c", CLI, *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=follower,
        env=env,
    )
    os.close(follower)
    chunks: list[bytes] = []
    try:
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError as exc:  # EIO: every writer to the terminal has closed it
                if exc.errno != errno.EIO:
                    raise
                break
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(leader)
    assert child.stdout is not None
    out = child.stdout.read().decode()
    child.stdout.close()
    status = child.wait(timeout=120)
    return status, out, b"".join(chunks).decode(errors="replace")


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("progress") / "images"
    generate_imagefolder(folder, 24, 2, seed=1, workers=1)
    return folder


@pytest.fixture
def shards(tmp_path: Path) -> ForeignShards:
    """Shards no index covers and no cache knows (a fresh folder)."""
    return write_foreign_shards(tmp_path / "shards", 3, seed=4)


# -- the command ------------------------------------------------------------------------


def test_pack_on_a_terminal_shows_its_bars_then_a_summary(images: Path, tmp_path: Path) -> None:
    status, out, err = run(
        ["pack", str(images), str(tmp_path / "out"), "--shard-samples", "10"], tty=True
    )
    assert status == 0, err
    assert "checking: 100%|" in err
    assert "packing: 100%|" in err
    assert "24/24" in err
    assert len(out.splitlines()) == 1
    assert out.startswith("packed 24 samples of 2 classes into 3 shards, ")


@pytest.mark.parametrize(
    ("flags", "tty"),
    [([], False), (["-q"], True), (["--quiet"], True)],
    ids=["pipe", "-q", "--quiet"],
)
def test_pack_shows_no_bar_off_a_terminal_or_when_quiet(
    images: Path, tmp_path: Path, flags: list[str], tty: bool
) -> None:
    status, out, err = run(
        [*flags, "pack", str(images), str(tmp_path / "out"), "--shard-samples", "10"], tty=tty
    )
    assert status == 0, err
    assert BAR not in err
    assert "packing" not in err
    assert out.startswith("packed 24 samples of 2 classes into 3 shards, ")


def test_index_on_a_terminal_shows_its_bar_then_a_summary(shards: ForeignShards) -> None:
    status, out, err = run(["index", str(shards.folder)], tty=True)
    assert status == 0, err
    assert "indexing: 100%|" in err
    assert "3/3 shards" in err
    assert f"{sum(shards.counts)} samples" in err
    (line,) = out.splitlines()
    assert line.startswith(f"indexed 3 shards, {sum(shards.counts)} samples: 3 read (")


@pytest.mark.parametrize(
    ("before", "after", "tty"),
    [([], [], False), (["--quiet"], [], True), ([], ["--no-progress"], True)],
    ids=["pipe", "--quiet", "--no-progress"],
)
def test_index_shows_no_bar_off_a_terminal_or_when_quiet(
    shards: ForeignShards, before: list[str], after: list[str], tty: bool
) -> None:
    status, out, err = run([*before, "index", str(shards.folder), *after], tty=tty)
    assert status == 0, err
    assert BAR not in err
    assert "indexing" not in err
    assert out.startswith(f"indexed 3 shards, {sum(shards.counts)} samples: ")


def test_a_counting_listing_shows_its_bar_on_a_terminal(shards: ForeignShards) -> None:
    status, out, err = run(["ls", str(shards.folder), "--samples"], tty=True)
    assert status == 0, err
    assert "counting: 100%|" in err
    assert out.splitlines()[-1].startswith("3 shards, ")
    status, out, err = run(["-q", "ls", str(shards.folder), "--samples"], tty=True)
    assert status == 0, err
    assert BAR not in err
    assert out.splitlines()[-1].startswith("3 shards, ")


def test_help_states_when_progress_shows() -> None:
    status, out, _ = run(["--help"], tty=False)
    assert status == 0
    assert "only when it is a terminal" in " ".join(out.split())
    status, out, _ = run(["pack", "--help"], tty=False)
    assert "shown when stderr is a terminal, without -q" in " ".join(out.split())


# -- the library: nothing unless asked ----------------------------------------------------


def test_a_counting_open_shows_nothing_unless_asked(
    shards: ForeignShards, capfd: pytest.CaptureFixture[str]
) -> None:
    with ShardStream(str(shards.folder)) as stream:
        assert len(stream) == sum(shards.counts)
    err = capfd.readouterr().err
    assert BAR not in err
    assert "counted" not in err


def test_a_counting_open_with_progress_shows_a_bar_and_a_summary(
    shards: ForeignShards, capfd: pytest.CaptureFixture[str]
) -> None:
    with ShardStream(str(shards.folder), progress=True) as stream:
        assert len(stream) == sum(shards.counts)
    err = capfd.readouterr().err
    assert "counting: 100%|" in err
    assert f"asyncstream: counted 3 shards: {sum(shards.counts)} samples, " in err
    assert "0 retries" in err


def test_a_counting_open_calls_a_progress_callback(
    shards: ForeignShards, capfd: pytest.CaptureFixture[str]
) -> None:
    seen: list[CountProgress] = []
    with ShardStream(str(shards.folder), progress=seen.append):
        pass
    assert seen
    last = seen[-1]
    assert (last.shards, last.shards_total, last.samples) == (3, 3, sum(shards.counts))
    assert last.bytes == last.bytes_total == sum(p.stat().st_size for p in shards.folder.iterdir())
    assert [p.bytes for p in seen] == sorted(p.bytes for p in seen)
    assert BAR not in capfd.readouterr().err


def test_a_bad_progress_is_refused(shards: ForeignShards, tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="progress must be"):
        ShardStream(str(shards.folder), progress="yes")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="progress must be"):
        index_dataset(str(shards.folder), progress=3)  # type: ignore[arg-type]


def test_index_dataset_with_progress_shows_a_bar_and_a_summary(
    shards: ForeignShards, capfd: pytest.CaptureFixture[str]
) -> None:
    result = index_dataset(str(shards.folder), progress=True)
    assert result.samples == sum(shards.counts)
    err = capfd.readouterr().err
    assert "indexing: 100%|" in err
    assert f"asyncstream: counted 3 shards: {sum(shards.counts)} samples, " in err


def test_pack_shows_nothing_unless_asked(
    images: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    pack(images, str(tmp_path / "quiet"), shard_bytes=None, shard_samples=10, workers=2)
    assert capfd.readouterr().err == ""
    result = pack(
        images, str(tmp_path / "shown"), shard_bytes=None, shard_samples=10, progress=True
    )
    assert result.samples == 24
    err = capfd.readouterr().err
    assert "checking: 100%|" in err
    assert "packing: 100%|" in err
    assert "asyncstream: packed 24 samples into 3 shards (" in err
    assert err.rstrip().endswith(f"at {tmp_path / 'shown'}")
