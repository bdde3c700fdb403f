"""The asyncstream command: generate, pack, ls and demo, run in-process."""

from __future__ import annotations

import json
import math
import tarfile
from pathlib import Path
from typing import Any

import pytest
from _foreign import foreign_shards, upload, write

from asyncstream import LocalS3, StaleShardWarning
from asyncstream.cli._cli import _parser, human, main, parse_size
from asyncstream.cli._format import megabytes, plural
from asyncstream.testing import FaultProxy


def test_parse_size_units() -> None:
    assert parse_size("4096") == 4096
    assert parse_size("256MiB") == 256 << 20
    assert parse_size("64M") == 64 << 20
    assert parse_size("1.5g") == 3 << 29
    assert human(2048) == "2.0 KiB"
    with pytest.raises(Exception, match="not a size"):
        parse_size("lots")


def test_counts_and_sizes_read_as_words() -> None:
    assert plural(1, "shard") == "1 shard"
    assert plural(14, "shard") == "14 shards"
    assert plural(1000, "sample") == "1,000 samples"
    assert plural(1, "class", "classes") == "1 class"
    assert megabytes(300_000) == "0.3 MB"
    assert megabytes(105_400_000) == "105 MB"


def test_ls_and_index_of_one_shard_say_one_shard(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write(tmp_path / "ds", foreign_shards(["a.tar"], [1]))
    assert main(["ls", str(tmp_path / "ds"), "--samples", "--no-progress"]) == 0
    summary = capsys.readouterr().out.splitlines()[-1]
    assert summary.startswith("1 shard, ")
    assert ", 1 sample; no index; sample counts: 1 shard counted by reading them" in summary
    assert "shards" not in summary
    assert main(["index", str(tmp_path / "ds"), "--no-progress"]) == 0
    line = capsys.readouterr().out
    assert line.startswith("indexed 1 shard, 1 sample: "), line
    assert " (0.0 MB at " in line, line


def test_index_takes_inflight_auto_and_refuses_a_count_below_one(
    s3_server: LocalS3, bucket: str, capsys: pytest.CaptureFixture[str]
) -> None:
    client = s3_server.client()
    upload(client, bucket, "ds/", foreign_shards(["a.tar", "b.tar"], [3, 4]))
    url, endpoint = f"s3://{bucket}/ds/", ["--endpoint-url", s3_server.endpoint_url]
    assert main(["index", url, *endpoint, "--inflight", "auto", "--no-progress"]) == 0
    assert capsys.readouterr().out.startswith("indexed 2 shards, 7 samples: ")
    manifest = client.get_object(Bucket=bucket, Key="ds/asyncstream.json")["Body"].read()
    assert json.loads(manifest)["samples"] == 7
    assert _parser().parse_args(["index", "x", "--inflight", "AUTO"]).inflight == "auto"
    assert _parser().parse_args(["index", "x", "--inflight", "16"]).inflight == 16
    for bad in ("0", "-2", "many"):
        with pytest.raises(SystemExit):
            _parser().parse_args(["index", "x", "--inflight", bad])
        assert "not a count of GETs" in capsys.readouterr().err


def test_pack_600_images_into_20_shards_then_ls(
    tmp_path: Path, s3_server: LocalS3, bucket: str, capsys: pytest.CaptureFixture[str]
) -> None:
    images = tmp_path / "images"
    assert main(["generate", str(images), "--images", "600", "--classes", "10"]) == 0
    dest = f"s3://{bucket}/train/"
    endpoint = ["--endpoint-url", s3_server.endpoint_url]
    assert (
        main(["pack", str(images), dest, "--shard-samples", "30", "--no-progress", *endpoint]) == 0
    )
    capsys.readouterr()
    assert main(["ls", dest, "--samples", "--json", *endpoint]) == 0
    listing = json.loads(capsys.readouterr().out)
    shards = listing["shards"]
    assert len(shards) == 20
    assert [s["samples"] for s in shards] == [30] * 20
    client = s3_server.client()
    for shard in shards:
        key = shard["url"].removeprefix(f"s3://{bucket}/")
        assert shard["size"] == client.head_object(Bucket=bucket, Key=key)["ContentLength"]
    assert listing["total_size"] == sum(s["size"] for s in shards)
    source_bytes = sum(p.stat().st_size for p in images.rglob("*.jpg"))
    assert source_bytes < listing["total_size"] < source_bytes * 1.1

    assert main(["ls", dest, "--samples", *endpoint]) == 0
    text = capsys.readouterr().out
    assert "20 shards" in text
    assert "600 samples" in text


def test_pack_by_bytes_on_the_command_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    images = tmp_path / "images"
    assert main(["generate", str(images), "--images", "40", "--classes", "4"]) == 0
    out = tmp_path / "shards"
    assert main(["pack", str(images), str(out), "--shard-bytes", "1MiB", "--no-progress"]) == 0
    sizes = [p.stat().st_size for p in sorted(out.glob("*.tar"))]
    assert len(sizes) >= math.ceil(sum(sizes) / (1 << 20))
    assert all(size <= (1 << 20) for size in sizes)
    assert main(["ls", str(out), "--samples"]) == 0
    assert "40 samples" in capsys.readouterr().out


def test_errors_are_one_line_naming_the_culprit(
    tmp_path: Path, s3_server: LocalS3, capsys: pytest.CaptureFixture[str]
) -> None:
    endpoint = ["--endpoint-url", s3_server.endpoint_url]
    assert main(["ls", "s3://no-such-bucket-cli/x/", *endpoint]) == 1
    err = capsys.readouterr().err
    assert err.startswith("asyncstream: error: ")
    assert "s3://no-such-bucket-cli/x/" in err
    assert main(["ls", "s3://b/x-{1..0}.tar", *endpoint]) == 1
    assert "backwards" in capsys.readouterr().err
    assert main(["pack", str(tmp_path / "nothing"), str(tmp_path / "out")]) == 1
    assert "nothing" in capsys.readouterr().err


def test_corrupt_shard_is_named_by_ls(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.tar"
    bad.write_bytes(b"this is not a tar archive at all" * 40)
    assert main(["ls", str(bad), "--samples"]) == 1
    assert bad.as_uri() in capsys.readouterr().err


def test_ls_says_which_index_gave_the_counts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shards = foreign_shards(["a.tar", "b.tar", "c.tar"], [4, 5, 6])
    write(tmp_path / "ds", shards)
    assert main(["ls", str(tmp_path / "ds")]) == 0
    text = capsys.readouterr().out
    assert "3 shards" in text
    assert "samples unknown for 3 shards (--samples counts them); no index" in text
    assert main(["ls", str(tmp_path / "ds"), "--samples"]) == 0
    assert "15 samples; no index; sample counts: 3 shards counted by reading them" in (
        capsys.readouterr().out
    )
    assert main(["ls", str(tmp_path / "ds")]) == 0  # counted once: now in the cache
    assert "15 samples; no index; sample counts: 3 shards from the local index cache" in (
        capsys.readouterr().out
    )
    sizes = tmp_path / "ds" / "sizes.json"
    sizes.write_text(json.dumps({"a.tar": 4, "b.tar": 5}))
    with pytest.warns(StaleShardWarning, match="c.tar"):
        assert main(["ls", str(tmp_path / "ds"), "--json"]) == 0
    listing = json.loads(capsys.readouterr().out)
    assert [r["samples"] for r in listing["shards"]] == [4, 5]
    assert listing["samples"] == 9
    assert listing["index"]["kind"] == "sizes.json"
    assert listing["index"]["url"] == sizes.as_uri()
    assert listing["index"]["stale"] == 1


def test_pack_refuses_a_destination_with_shards_unless_overwrite(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    images = tmp_path / "images"
    assert main(["generate", str(images), "--images", "12", "--classes", "2"]) == 0
    out = tmp_path / "shards"
    args = ["pack", str(images), str(out), "--no-progress"]
    assert main([*args, "--shard-samples", "2"]) == 0
    assert len(list(out.glob("*.tar"))) == 6
    capsys.readouterr()
    assert main([*args, "--shard-samples", "4"]) == 1
    err = capsys.readouterr().err
    assert "already holds a dataset" in err
    assert "--overwrite" in err
    assert main([*args, "--shard-samples", "4", "--overwrite"]) == 0
    assert len(list(out.glob("*.tar"))) == 3


def _images_with_bad_ones(tmp_path: Path) -> tuple[Path, str, str]:
    """Generated JPEGs plus a truncated JPEG and a text file named .jpg in the first class."""
    images = tmp_path / "images"
    assert main(["generate", str(images), "--images", "6", "--classes", "2"]) == 0
    first = sorted(p for p in images.iterdir() if p.is_dir())[0]
    good = next(first.glob("*.jpg")).read_bytes()
    (first / "cut.jpg").write_bytes(good[: len(good) // 3])
    (first / "readme.jpg").write_text("not a picture")
    return images, f"{first.name}/cut.jpg", f"{first.name}/readme.jpg"


def test_pack_skips_bad_images_and_lists_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    images, cut, text = _images_with_bad_ones(tmp_path)
    capsys.readouterr()
    out = tmp_path / "shards"
    assert main(["pack", str(images), str(out), "--no-progress"]) == 0  # --on-error skip
    captured = capsys.readouterr()
    assert "skipped 2 bad images" in captured.err
    assert f"  {cut}: does not decode" in captured.err
    assert f"  {text}: not an image" in captured.err
    assert "packed 6 samples" in captured.out
    assert "skipped 2 bad images" in captured.out
    assert main(["ls", str(out)]) == 0
    assert "6 samples" in capsys.readouterr().out


def test_pack_on_error_fail_refuses_naming_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    images, cut, text = _images_with_bad_ones(tmp_path)
    capsys.readouterr()
    out = tmp_path / "shards"
    assert main(["pack", str(images), str(out), "--no-progress", "--on-error", "fail"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("asyncstream: error: pack refused: 2 of 8 images")
    assert f"{cut}: does not decode" in err
    assert f"{text}: not an image" in err
    assert not list(out.glob("*"))  # no shard, no manifest, no temporary folder


def test_pack_to_jpeg_on_the_command_line(tmp_path: Path) -> None:
    from PIL import Image

    images = tmp_path / "images"
    (images / "red").mkdir(parents=True)
    (images / "blue").mkdir()
    Image.new("RGB", (32, 32), (200, 10, 10)).save(images / "red" / "a.png")
    Image.new("RGB", (32, 32), (10, 10, 200)).save(images / "blue" / "b.webp")
    out = tmp_path / "shards"
    args = ["pack", str(images), str(out), "--no-progress", "--to-jpeg", "--jpeg-quality", "80"]
    assert main(args) == 0
    with tarfile.open(out / "shard-000000.tar") as tar:
        names = tar.getnames()
        metas = [
            json.loads(tar.extractfile(n).read())  # type: ignore[union-attr]
            for n in names
            if n.endswith(".json")
        ]
    assert names == [f"00000{i}.{ext}" for i in range(2) for ext in ("jpg", "cls", "json")]
    assert [(m["source"], m["converted_from"]) for m in metas] == [
        ("blue/b.webp", "WEBP"),
        ("red/a.png", "PNG"),
    ]
    assert main(["pack", str(images), str(tmp_path / "x"), "--jpeg-quality", "0"]) == 1


def test_pack_help_states_every_default(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["pack", "--help"])
    assert exited.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    for fragment in ("--on-error {skip,fail}", "(default skip)", "--to-jpeg", "(default 95)"):
        assert fragment in text
    subparsers = next(a for a in _parser()._actions if a.choices and "pack" in a.choices)
    pack_parser = subparsers.choices["pack"]  # type: ignore[index]
    shared = {"help", "endpoint_url", "profile", "ca_bundle", "no_verify_ssl"}  # the S3 flags
    for action in pack_parser._actions:
        if action.option_strings and action.dest not in shared:
            assert "default" in (action.help or ""), action.option_strings


def test_version_loads_neither_torch_nor_botocore_nor_plugins() -> None:
    import subprocess
    import sys

    code = (
        "import sys; from asyncstream.cli._cli import main; main(['--version']); "
        "heavy = [m for m in ('torch', 'botocore', 'dali_ops', 'moto', 'numpy') "
        "if m in sys.modules]; assert not heavy, heavy"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("asyncstream ")


def test_serve_refuses_an_invalid_bucket_name_as_pack_does(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["serve", "--bucket", "b2"]) == 1
    err = capsys.readouterr().err
    assert err.strip() == (
        "asyncstream: error: --bucket 'b2' is not a valid bucket name "
        "(3 to 63 lowercase letters, digits, '.' and '-')"
    )


def test_ls_says_each_retry_and_quiet_keeps_only_warnings(
    proxy: FaultProxy, bucket: str, s3_client: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """A listing answered 503 twice: `ls` says each retry on stderr (its cause and the
    wait), not silence; with --quiet, nothing but the result."""
    s3_client.put_object(Bucket=bucket, Key="a/shard.tar", Body=b"x" * 100)
    url, endpoint = f"s3://{bucket}/a/", ["--endpoint-url", proxy.endpoint_url]
    proxy.inject("status", count=2, status=503, method="GET", match="list-type")
    assert main(["ls", url, *endpoint, "--no-progress"]) == 0
    said = [line for line in capsys.readouterr().err.splitlines() if "retrying in" in line]
    assert len(said) == 2
    assert all(line.startswith("asyncstream: ") and "slowdown" in line for line in said)
    proxy.inject("status", count=2, status=503, method="GET", match="list-type")
    assert main(["--quiet", "ls", url, *endpoint, "--no-progress"]) == 0
    assert "retrying in" not in capsys.readouterr().err
