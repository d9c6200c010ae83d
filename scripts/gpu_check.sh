#!/usr/bin/env bash
# The GPU check (issue "The GPU route"): the embedded Triton 2.51 on a real GPU, in under 5 minutes.
#
# On a machine with internet first (here): pack the ~42 MiB of files the GPU machine lacks into
# the git-ignored build/gpu_bundle/:
#     .venv/bin/python scripts/pack_gpu_bundle.py
# Then, on the lent GPU machine (device tool), from the repository root:
#     run(command="bash scripts/gpu_check.sh", carry=["build/gpu_bundle"], timeout_s=420)
# It needs only python3 (3.12, with CUDA torch) there; the report lands in $OUT:
#     gpu_check_report.md, gpu_check.json, tritonserver.log
# Without a GPU, `bash scripts/gpu_check.sh --cpu-smoke` runs the same path on KIND_CPU.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-build/gpu_check_out}
BUNDLE=${GPU_BUNDLE:-build/gpu_bundle}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
if ! ls "$BUNDLE"/triton-bundle.tar* >/dev/null 2>&1; then
  echo "gpu_check: $BUNDLE/triton-bundle.tar.xz is missing; run scripts/pack_gpu_bundle.py where" \
       "the nvidia-pytriton wheel is installed, and carry $BUNDLE" | tee "$OUT/gpu_check_report.md" >&2
  exit 2
fi
{
  echo "== $(date -u +%FT%TZ) $(uname -m) $(nproc) cores"
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  "$PY" -c 'import sys; print("python", sys.version.split()[0], sys.executable)'
} 2>&1 | tee "$OUT/machine.txt"
# 290 s for the whole check; the Python side bounds every phase as well.
PYTHONUNBUFFERED=1 timeout -k 15 290 "$PY" scripts/gpu_check.py --bundle "$BUNDLE" --out "$OUT" "$@"
rc=$?
[ $rc -eq 124 ] && echo "gpu_check: stopped at its 290 s limit" | tee -a "$OUT/gpu_check_report.md"
cat "$OUT/gpu_check_report.md"
exit $rc
