"""StallMeter: the share of time a loop waits for data, alone and inside a ShardStream."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from asyncstream import ShardStream, StallMeter, pack
from asyncstream.testing import generate_imagefolder


@pytest.mark.parametrize(("data_s", "work_s"), [(0.01, 0.03), (0.03, 0.01)])
def test_stall_meter_measures_the_share_a_loop_waits(data_s: float, work_s: float) -> None:
    meter = StallMeter(window=10)
    for _ in range(20):
        started = meter.begin()
        time.sleep(data_s)  # the data path
        meter.end(started)
        time.sleep(work_s)  # the loop's own step
    report = meter.report()
    expected = data_s / (data_s + work_s)
    assert report["epoch"]["calls"] == 20
    assert report["epoch"]["waited_share"] == pytest.approx(expected, abs=0.1)
    assert report["recent"]["calls"] == 10
    assert report["recent"]["waited_share"] == pytest.approx(expected, abs=0.1)
    # 19 gaps between 20 calls are the loop's work; the first call has none before it.
    assert report["epoch"]["worked_s"] / (19 * work_s) == pytest.approx(1.0, abs=0.3)


def test_meter_refuses_a_bad_window() -> None:
    with pytest.raises(ValueError, match="window"):
        StallMeter(window=0)


def test_shard_stream_meters_its_loop(tmp_path: Path) -> None:
    generate_imagefolder(tmp_path / "images", 24, 2, seed=0, workers=1)
    pack(
        tmp_path / "images", str(tmp_path / "shards"), shard_samples=12, shard_bytes=None, workers=1
    )
    with ShardStream(str(tmp_path / "shards"), window=2, inflight=2, seed=0) as stream:
        for epoch in range(2):
            stream.set_epoch(epoch)
            for _ in stream:
                time.sleep(0.01)  # the loop's step, far longer than a local sample takes
            stall = stream.stats()["stall"]["epoch"]
            assert stall["calls"] == 25  # 24 samples, and the call that ends the epoch
            assert stall["worked_s"] / (24 * 0.01) == pytest.approx(1.0, abs=0.3)
            if epoch:  # (the first epoch waits for the engine to start: that counts)
                assert stall["waited_share"] < 0.5


def test_timed_counts_as_begin_and_end(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = iter(float(t) for t in range(1000))
    ticks: list[float] = []

    def tick() -> float:
        ticks.append(next(clock))
        return ticks[-1]

    monkeypatch.setattr(time, "perf_counter", tick)
    paired, timed = StallMeter(window=3), StallMeter(window=3)
    for call in range(6):
        started = paired.begin()
        paired.end(started)
        if call == 3:
            paired.pause()
            timed.pause()
        if call == 5:  # a call that raises (the end of an epoch) is counted too
            with pytest.raises(StopIteration):
                timed.timed(iter(()).__next__)
        else:
            assert timed.timed(lambda: "item") == "item"
    # Each meter read the clock at the same points of its own calls: same figures.
    assert timed.report() == paired.report()
    assert timed.report()["epoch"]["calls"] == 6
