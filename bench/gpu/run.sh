#!/bin/bash
# The GPU checks of issue 29 item 6, run through the `device` tool on its last call, once
# the earlier calls have left the parts of .gpu/ that `bash bench/gpu/kit.sh` made here in
# /tmp/p there (kit.sh says how). First run on 2026-11-27 (H200; bench/RESULTS.md, "On an
# H200, 2026-11-27"); since then the realistic run measures DALI's ceiling on both sides
# of each loader (--flank: the ceiling moved 7% within that run), in 3 rounds. (The
# Python reference against the native core was measured then: ASYNCSTREAM_NATIVE=0.)
#
#   run(command="bash bench/gpu/run.sh", carry=[".gpu/part-ac"], timeout_s=590)
#
# Each step is bounded, so that the figures already written under $OUT come back whatever
# follows: about 20 s to unpack and build, at most 120 s of GPU tests, 300 s for the
# realistic run (20,000 JPEGs generated first, then 3 rounds of 0, 2 and 4 workers) and
# 100 s for the feed proxy and the workers part.
set -u
export PYTHONUNBUFFERED=1
SP=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
cat /tmp/p/part* .gpu/part* 2>/dev/null | xz -d | tar -xf - -C "$SP"
python3 setup.py --quiet build_ext --inplace >"$OUT/build.log" 2>&1 || tail -20 "$OUT/build.log"
{
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    python3 -c 'import platform, torch, nvidia.dali as d; print(platform.python_version(), torch.__version__, d.__version__, torch.cuda.is_available())'
    python3 -c 'import asyncstream.shards._tarfast as t, asyncstream.order._shuffle as s, asyncstream.stream._native as n, dali_ops._batch as b; print("native", t.NATIVE, s.NATIVE, b.NATIVE, n.NEXTC is not None)'
    nproc
    git log --oneline -1 2>/dev/null
} >"$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
timeout 120 python3 -m pytest -p no:cacheprovider -q -x -o addopts="" \
    tests/test_dali_gpu.py tests/test_dali_reference.py >"$OUT/gpu-tests.log" 2>&1
tail -5 "$OUT/gpu-tests.log"
common=(--device mixed --threads 12 --data /tmp/benchdata)
timeout 300 python3 -m bench.feed "${common[@]}" --parts real --repeat 3 --epochs 4 --flank \
    --real-workers 2,4 --json "$OUT/real.json" >"$OUT/real.log" 2>&1
grep -E "^real|ratio" "$OUT/real.log" | tail -20
timeout 100 python3 -m bench.feed "${common[@]}" --parts proxy,workers --repeat 1 \
    --workers 0,2,4 --json "$OUT/proxy.json" >"$OUT/proxy.log" 2>&1
tail -25 "$OUT/proxy.log"
