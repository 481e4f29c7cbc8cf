#!/usr/bin/env bash
# The checks that need a CUDA host, in one run: the CUDA tests (gpt2-small's GPU step over four
# shards among them), a whole ResNet-18 worker step on CUDA (pinned and pageable host buffers)
# against the same step on CPU, the same step with 8-bit
# pushes and bf16 pulls encoded on the GPU and on the host, the host<->GPU crossing alone, and the
# throughput benchmark (16-worker section included) on that host's cores; flags measures whether the
# flags that take work off a step's path pay on its cores (benchmarks.step_flags).
#
#     scripts/gpu_checks.sh OUT_DIR [CHECK ...]      (PYTHON=python3 by default)
#
# CHECK is any of tests, step, step-int8, threads, transfer, throughput, flags (default: all but flags,
# in that order);
# threads times the CUDA step with torch's default intra-op threads and with one, one after the other.
# Writes OUT_DIR/host.txt and, per check, its log and JSON (pytest_cuda.log, gpu_step.{json,log},
# gpu_step_int8.{json,log}, gpu_step_threads_{default,1}.{json,log}, cuda_transfer.{json,log}, throughput.{json,log},
# step_flags.{json,log}); each check runs even
# if one before it failed, and host.txt records every exit status. With ARCHIVE=PATH it also packs
# OUT_DIR into that one .tar.gz (for a runner that brings back only a few files).
set -u
out=${1:?usage: scripts/gpu_checks.sh OUT_DIR [tests|step|step-int8|threads|transfer|throughput|flags ...]}
shift
checks=${*:-tests step step-int8 threads transfer throughput}
python=${PYTHON:-python3}
work=$(mktemp -d)
mkdir -p "$out"
export PYTHONUNBUFFERED=1
{
  date -u +%FT%TZ
  nproc
  nvidia-smi -L
  "$python" -c "import torch, grpc, google.protobuf as p; print('torch', torch.__version__, 'grpc', grpc.__version__, 'protobuf', p.__version__, torch.cuda.get_device_name())"
} >"$out/host.txt" 2>&1
for check in $checks; do
  case $check in
    tests)
      timeout 360 "$python" -m pytest -q -p no:cacheprovider tests/integration/test_cuda_integ.py \
        tests/pstasks/test_gpt2_small_integ.py >"$out/pytest_cuda.log" 2>&1 ;;
    step) timeout 150 "$python" -m benchmarks.gpu_step --out "$work/gpu_step.json" >"$out/gpu_step.log" 2>&1 ;;
    step-int8)
      timeout 150 "$python" -m benchmarks.gpu_step --wire int8/bf16 --variants cuda,cuda-host-encode \
        --out "$work/gpu_step_int8.json" >"$out/gpu_step_int8.log" 2>&1 ;;
    threads)
      timeout 90 "$python" -m benchmarks.gpu_step --variants cuda --steps 15 \
        --out "$work/gpu_step_threads_default.json" >"$out/gpu_step_threads_default.log" 2>&1 &&
        timeout 90 "$python" -m benchmarks.gpu_step --variants cuda --steps 15 --torch-threads 1 \
          --out "$work/gpu_step_threads_1.json" >"$out/gpu_step_threads_1.log" 2>&1 ;;
    transfer) timeout 60 "$python" -m benchmarks.cuda_transfer --out "$work/cuda_transfer.json" >"$out/cuda_transfer.log" 2>&1 ;;
    throughput) timeout 330 "$python" -m benchmarks.throughput --quick --out "$work/throughput.json" >"$out/throughput.log" 2>&1 ;;
    flags) timeout 300 "$python" -m benchmarks.step_flags --out "$work/step_flags.json" >"$out/step_flags.log" 2>&1 ;;
    *) echo "unknown check $check (tests, step, step-int8, threads, transfer, throughput, flags)" >&2; exit 2 ;;
  esac
  echo "$check rc=$? $(date -u +%T)" >>"$out/host.txt"
done
cp "$work"/*.json "$out"/ 2>/dev/null
if [ -n "${ARCHIVE:-}" ]; then
  tar -czf "$ARCHIVE" -C "$out" . && echo "packed $out into $ARCHIVE" >>"$out/host.txt"
fi
cat "$out/host.txt"
