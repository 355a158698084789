#!/usr/bin/env bash
# GPU checks of issue 13, for a machine with a CUDA GPU (at most ~8 minutes):
#   1. the tests marked `cuda` (pinned staging, device->host copies, loads into CUDA tensors,
#      an NCCL default group with one rank per GPU, up to two);
#   2. the staging throughput against cudaMemcpy of the same bytes (bench/gpu_staging.py);
#   3. a real GPU training step while an async save is in flight, against DCP's async_save
#      (bench/gpu_step.py).
# Results go to OUT.* (default bench/results/gpu-check-<date>): OUT.txt (what ran, the logs),
# OUT.junit.xml, OUT.json and OUT.md (staging table), OUT.step.json and OUT.step.md (step table).
#
#   bench/gpu_check.sh [OUT]
#   PYTHON=/path/to/python bench/gpu_check.sh     # an interpreter with a CUDA build of torch
#
# ./dev's virtualenv pins the CPU build of torch, so this script runs the checkout's sources
# (PYTHONPATH=src) with PYTHON (default: python3), which needs a CUDA torch and the project's
# dependencies (`pip install numpy ml_dtypes zstandard crc32c jsonschema google-re2 pytest
# pytest-timeout hypothesis` next to torch). Exit status: the tests' (0 = all passed), 3 when
# torch sees no GPU.
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$here"
py="${PYTHON:-python3}"
out="${1:-bench/results/gpu-check-$(date +%Y-%m-%d)}"
mkdir -p "$(dirname "$out")"
export PYTHONPATH="$here/src:$here${PYTHONPATH:+:$PYTHONPATH}"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-4}"
log="$out.txt"
{
  echo "# gpu_check $(date -Iseconds) on $(hostname)"
  echo "git: ${PCK_BENCH_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo '?')}"
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
} > "$log"
if ! "$py" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 3)' >> "$log" 2>&1; then
  echo "gpu_check: $py has no CUDA torch or sees no GPU (see $log); nothing was checked" | tee -a "$log"
  exit 3
fi
"$py" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "devices", torch.cuda.device_count())' >> "$log"
echo "## tests marked cuda" >> "$log"
timeout 150 "$py" -m pytest -q -p no:cacheprovider -m cuda tests/torch/test_cuda.py \
  --junitxml "$out.junit.xml" 2>&1 | tee -a "$log"
status=${PIPESTATUS[0]}
echo "## staging throughput" >> "$log"
timeout 100 "$py" -m bench.gpu_staging --out "$out" 2>&1 | tee -a "$log"
echo "## training step while a save is in flight" >> "$log"
timeout 200 "$py" -m bench.gpu_step --out "$out.step" 2>&1 | grep -v " - root - INFO - " | tee -a "$log"
echo "gpu_check: tests exit $status; results in $out.{txt,junit.xml,json,md}" | tee -a "$log"
exit "$status"
