#!/bin/bash
# The GPU checks of 2026-11-27 (issue 29, item 6), run through the `device` tool on its
# last call, once the earlier calls had left the parts of .gpu/ (DALI 2.4.0 for CUDA 13,
# nvImageCodec, nvJPEG and the pure-Python dependencies the machine's image lacks, as one
# xz-compressed tar, split to fit a call) in /tmp/p and built the native extension in place.
# Each step is bounded so that the figures already written come back whatever follows.
set -u
export PYTHONUNBUFFERED=1
SP=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
cat /tmp/p/part* .gpu/part* | xz -d | tar -xf - -C "$SP"
{
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    python3 -c 'import platform, torch, nvidia.dali as d; print(platform.python_version(), torch.__version__, d.__version__, torch.cuda.is_available())'
    python3 -c 'import asyncstream.shards._tarfast as t, asyncstream.order._shuffle as s, asyncstream.stream._native as n, dali_ops._batch as b; print("native", t.NATIVE, s.NATIVE, b.NATIVE, n.NEXTC is not None)'
    nproc
} >"$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
timeout 150 python3 -m pytest -p no:cacheprovider -q -x -o addopts="" \
    tests/test_dali_gpu.py tests/test_dali_reference.py >"$OUT/gpu-tests.log" 2>&1
tail -5 "$OUT/gpu-tests.log"
common=(--device mixed --repeat 1 --epochs 4 --threads 12 --data /tmp/benchdata --workers 0,2,4 --real-workers 2,4)
timeout 240 python3 -m bench.feed "${common[@]}" --parts real,proxy,workers \
    --json "$OUT/feed-native.json" >"$OUT/feed-native.log" 2>&1
tail -40 "$OUT/feed-native.log"
ASYNCSTREAM_NATIVE=0 timeout 150 python3 -m bench.feed "${common[@]}" --parts real,workers \
    --json "$OUT/feed-python.json" >"$OUT/feed-python.log" 2>&1
tail -30 "$OUT/feed-python.log"
