#!/usr/bin/env bash
# The GPU paths in one short run (issue "A real serving engine, and runs that scale past one
# machine", item 4), for a machine with a CUDA GPU and PyTorch + transformers installed:
#   1. the tests of what changes on CUDA (tests/test_gpu.py: device and dtype selection, batched
#      decoding with row pruning, bf16 weights, the lab's training loop under autocast), with the
#      device and target tests beside them;
#   2. the generation benchmark (HFTarget batched vs one prompt at a time vs a raw
#      `model.generate` loop) on cuda, on the lab-sized random Llama;
#   3. one lab setting end to end on cuda: `calibdcd demo` with VeilProbe and the overlap
#      baseline, seed 0 (the demo lab built on the GPU, both its models queried there);
#   4. the same benchmark on that lab's chat model.
# Usage: OUT=dir bash benchmarks/gpu_check.sh   (wheels for missing packages in .whl/ are
# installed first, e.g. pydantic where the machine's Python lacks it). Every step has its own
# time limit and log; a failing step does not stop the others. docs/scaling.md has the results.
set -u
OUT=${OUT:-gpu-check}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/calibdcd-site .whl/*.whl && export PYTHONPATH=/tmp/calibdcd-site
fi
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
export CALIBDCD_CACHE=${CALIBDCD_CACHE:-/tmp/calibdcd-gpu-cache}
DEV=${DEV:-cuda}  # the benchmark's device (DEV=cpu tries the script where no GPU is)
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers',
transformers.__version__, torch.cuda.get_device_name(), 'bf16', torch.cuda.is_bf16_supported())"
  echo "cpus $(nproc); kernel $(uname -r); commit $(git rev-parse --short HEAD 2>/dev/null)"
} >"$OUT/steps.txt" 2>&1

step() {  # step NAME SECONDS COMMAND...: run with a limit, log to $OUT/NAME.log, time it
  local name=$1 limit=$2 t0 rc
  shift 2
  t0=$(date +%s)
  timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
  rc=$?
  echo "$name: rc=$rc, $(($(date +%s) - t0)) s" | tee -a "$OUT/steps.txt"
}

step pytest 150 python3 -m pytest -q -p no:cacheprovider \
  tests/test_gpu.py tests/test_device.py tests/test_targets_hf.py
step bench-random 80 python3 benchmarks/targets.py --quick --device "$DEV" \
  --json "$OUT/bench-random.json"
step demo 280 python3 -m calibdcd demo -d veilprobe -d overlap --seed 0 -o /tmp/gpu-demo \
  --no-progress
chat=$(find "$CALIBDCD_CACHE" -type d -name chat-qwen | head -1)
if [ -n "$chat" ]; then
  step bench-lab 50 python3 benchmarks/targets.py --quick --device "$DEV" --model "$chat" \
    --json "$OUT/bench-lab.json"
fi
# the demo's run directory (result.json per setting, the report) and its lab's record, one file
if [ -d /tmp/gpu-demo ]; then
  lab=$(find "$CALIBDCD_CACHE" -name lab.json | head -1)
  [ -n "$lab" ] && cp "$lab" /tmp/gpu-demo/lab.json
  tar czf "$OUT/demo.tgz" -C /tmp gpu-demo
fi
cat "$OUT/steps.txt"
