#!/usr/bin/env bash
# The checks that need a CUDA host, in one run: the CUDA tests, a whole ResNet-18 worker step on
# CUDA (pinned and pageable host buffers) against the same step on CPU, the host<->GPU crossing
# alone, and the throughput benchmark (16-worker section included) on that host's cores.
#
#     scripts/gpu_checks.sh OUT_DIR [PYTHON]
#
# Writes OUT_DIR/{pytest_cuda.log,gpu_step.json,gpu_step.log,gpu_step_int8.{json,log},cuda_transfer.json,cuda_transfer.log,
# throughput.json,throughput.log,host.txt}; each step runs even if one before it failed.
set -u
out=${1:?usage: scripts/gpu_checks.sh OUT_DIR [PYTHON]}
python=${2:-python3}
work=$(mktemp -d)
mkdir -p "$out"
export PYTHONUNBUFFERED=1
{
  date -u +%FT%TZ
  nproc
  nvidia-smi -L
  "$python" -c "import torch, grpc, google.protobuf as p; print('torch', torch.__version__, 'grpc', grpc.__version__, 'protobuf', p.__version__, torch.cuda.get_device_name())"
} >"$out/host.txt" 2>&1
timeout 150 "$python" -m pytest -q -p no:cacheprovider tests/integration/test_cuda_integ.py >"$out/pytest_cuda.log" 2>&1
echo "pytest rc=$?" >>"$out/host.txt"
timeout 150 "$python" -m benchmarks.gpu_step --out "$work/gpu_step.json" >"$out/gpu_step.log" 2>&1
echo "gpu_step rc=$?" >>"$out/host.txt"
timeout 100 "$python" -m benchmarks.gpu_step --wire int8/bf16 --variants cuda,cpu --cpu-steps 3 \
  --out "$work/gpu_step_int8.json" >"$out/gpu_step_int8.log" 2>&1
echo "gpu_step int8/bf16 rc=$?" >>"$out/host.txt"
timeout 60 "$python" -m benchmarks.cuda_transfer --out "$work/cuda_transfer.json" >"$out/cuda_transfer.log" 2>&1
echo "cuda_transfer rc=$?" >>"$out/host.txt"
timeout 330 "$python" -m benchmarks.throughput --quick --out "$work/throughput.json" >"$out/throughput.log" 2>&1
echo "throughput rc=$?" >>"$out/host.txt"
cp "$work"/*.json "$out"/ 2>/dev/null
cat "$out/host.txt"
