"""The probe's report in words: the figures stage by stage, the ceilings, the stage that
binds and the settings to try."""

from __future__ import annotations

from typing import Any

__all__ = ["render"]


def _num(value: Any, fmt: str = ",.0f", unit: str = "") -> str:
    if value is None:
        return "-"
    return f"{value:{fmt}}{unit}"


def _mib(n: int | None) -> str:
    return "-" if n is None else f"{n / (1 << 20):g} MiB"


def render(report: dict[str, Any]) -> str:
    """The report of :func:`~._run.probe` as lines of text."""
    lines = [
        f"probe of {report['url']}: {report['shards']} shards, "
        f"{report['bytes'] / 1e6:,.1f} MB; {report['machine']['cpus']} CPUs; "
        f"{report.get('seconds', 0.0):.1f} s",
        "",
    ]
    c = report["connection"]
    lines.append(
        f"one connection: first byte {_num(c['first_byte_s'] and 1e3 * c['first_byte_s'], '.1f')}"
        f" ms (p95 {_num(c['first_byte_p95_s'] and 1e3 * c['first_byte_p95_s'], '.1f')} ms), "
        f"{_num(c['mb_per_s'], ',.1f')} MB/s after it, GETs of {c['get_bytes'] / (1 << 20):.2f} MiB"
    )
    lines += ["", "  K    MB/s   reader CPU s/GB   us/GET   GETs"]
    for row in report["inflight"]:
        lines.append(
            f"{row['inflight']:>3} {row['mb_per_s']:>7,.1f} "
            f"{_num(row['reader_cpu_s_per_gb'], '>17.2f')} "
            f"{_num(row['reader_cpu_us_per_get'], '>8,.0f')} {row['gets']:>6}"
        )
    s = report["stream"]
    if "not_measured" in s:
        lines += ["", f"stream: not measured: {s['not_measured']}"]
    else:
        lines += [
            "",
            f"stream, no decode (inflight {s['settings']['inflight']}, {s['read']}): "
            f"{_num(s['samples_per_s'])} samples/s, {_num(s['wire_mb_per_s'], ',.1f')} MB/s "
            f"of shards, first sample after {_num(s['first_sample_s'], '.2f')} s, "
            f"{_num(s['sample_wire_bytes'])} B a sample in its shard",
        ]
    d = report["decode"]
    if "not_measured" in d:
        lines.append(f"feed and decoder: not measured: {d['not_measured']}")
    else:
        for name in ("feed", "decoder"):
            part = d.get(name) or {}
            if "not_measured" in part:
                lines.append(f"{name}: not measured: {part['not_measured']}")
            else:
                lines.append(f"{name}: {_num(part.get('images_per_s'))} images/s")
    lines += ["", "ceilings (samples/s):"]
    for name, stage in sorted(
        report["stages"].items(), key=lambda kv: kv[1].get("ceiling_samples_per_s") or 0.0
    ):
        mark = "  <- binds" if name == report["binding"] else ""
        note = f"  ({stage['note']})" if stage.get("note") else ""
        lines.append(
            f"  {name:<8} {_num(stage.get('ceiling_samples_per_s'), '>12,.0f')}{mark}{note}"
        )
    lines.append("")
    lines.append(f"binding: {report['binding'] or 'nothing measured'}")
    g = report["suggested"]
    lines.append("suggested:")
    for key in ("inflight", "chunk_bytes", "workers", "dali_threads"):
        value = g[key]
        shown = _mib(value) if key == "chunk_bytes" and value is not None else _num(value, "")
        why = g["why"].get(key, "not measured")
        lines.append(f"  {key:<13} {shown:<10} {why}")
    return "\n".join(lines)
