#!/bin/bash
# Make here, before the first call to the `device` tool, what a GPU machine lacks for the
# GPU checks: DALI for CUDA 13 and the packages its image does not hold, as one
# xz-compressed tar split into parts that each fit one call (a call carries at most
# 64 MiB of working tree; .gpu/ is ignored by git, so each part travels by `carry`).
#
#   bash bench/gpu/kit.sh            # writes .gpu/part-aa, part-ab, ... (58 MiB each)
#
# A part and the working tree (4.4 MB on 2026-11-28) must fit one call's 64 MiB. Then one
# warm call per part but the last (each copies its part to /tmp/p there):
#   run(command="mkdir -p /tmp/p && cp .gpu/part-aa /tmp/p/", carry=[".gpu/part-aa"])
# and the last call carries the last part and runs bench/gpu/run.sh, which unpacks
# /tmp/p/part* and .gpu/part* into python3's site-packages. The machine stays warm 30 s
# after a call: make the calls back to back. On 2026-11-28: 204 MB in 4 parts, the last
# 22 MB, in 2 minutes on 2 cores; checked there by unpacking the parts and running a DALI
# CPU pipeline under Python 3.12 (pyenv's, with numpy, six, packaging and
# typing_extensions, which the GPU image holds). nvImageCodec logs that nvTIFF is missing.
#
# The versions are those of the H200 run of 2026-11-27 (its image: Python 3.12, torch
# 2.11.0+cu130, driver 580): DALI 2.4.0 for CUDA 13, nvImageCodec 0.9 with nvJPEG 13.0
# and nvcomp 5.3 (nvJPEG2000 and nvTIFF are left out: JPEG needs neither), DALI's small
# dependencies, and asyncstream's that the image lacks (KINDS.md lists what it holds).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
KIT=${KIT:-/tmp/asyncstream-gpu-kit}
PYTHON=${PYTHON:-"$ROOT/.venv/bin/python"}
PARTS=(
    nvidia-dali-cuda130==2.4.0
    nvidia-nvimgcodec-cu13==0.9.0.20
    nvidia-nvjpeg==13.0.4.44
    nvidia-libnvcomp-cu13==5.3.0.16
    astunparse==1.6.3 gast==0.7.0 optree==0.20.0 nvtx==0.2.17 makefun==1.16.0 libcst==1.9.0
    botocore==1.43.117 jmespath==1.1.0 torchdata==0.11.0 zstandard==0.25.0
    pytest-asyncio==1.5.0
)
rm -rf "$KIT/site" && mkdir -p "$KIT/whl" "$KIT/site"
"$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$KIT/whl" "${PARTS[@]}"
for spec in "${PARTS[@]}"; do
    name=${spec%%==*}
    wheel=$(ls "$KIT"/whl/"${name//-/_}"-"${spec##*==}"-*.whl)
    unzip -q -o "$wheel" -d "$KIT/site"
done
# DALI ships its Python binding for every Python: only 3.12's is used there.
find "$KIT/site/nvidia/dali" -name 'backend_impl.cpython-*.so' ! -name '*cpython-312-*' -delete
rm -rf "$ROOT/.gpu" && mkdir -p "$ROOT/.gpu"
tar -C "$KIT/site" -cf - . | xz -T0 -6 | split -b 58M - "$ROOT/.gpu/part-"
grep -qx '/.gpu/' "$ROOT/.git/info/exclude" 2>/dev/null || echo /.gpu/ >>"$ROOT/.git/info/exclude"
ls -l "$ROOT/.gpu"
