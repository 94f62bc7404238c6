#!/usr/bin/env bash
# The GPU paths in one short run (issue "A real serving engine, and runs that scale past one
# machine", item 4), for a machine with a CUDA GPU and PyTorch + transformers installed:
#   1. the tests of what changes on CUDA (tests/test_gpu.py: device and dtype selection, batched
#      decoding with row pruning, bf16 weights, the lab's training loop under autocast), with the
#      device and target tests beside them;
#   2. the generation benchmark (HFTarget batched vs one prompt at a time vs a raw
#      `model.generate` loop) on cuda, on the lab-sized random Llama;
#   3. one lab setting end to end on cuda: configs/demo.yaml with its targets on `device: auto`
#      (the demo itself pins them to the CPU) and the overlap baseline only: the demo lab built
#      on the GPU and both its models queried there;
#   4. the generation benchmark on that lab's chat model;
#   5. VeilProbe's mapping-model training step profiled on cuda (benchmarks/mapping_profile.py:
#      inputs / forward / backward / optimizer and the operators each dispatches): on the first
#      try that model trained slower on the GPU than on 2 CPU cores (docs/scaling.md);
#   6. GiLOT's IPOT distances of a text in float64 batches on the GPU against numpy
#      (benchmarks/ipot_batched.py: the ratio, and the two equal to 1e-12);
#   7. the demo with VeilProbe (its masked LM and mapping model on the GPU), last.
# Usage, from anywhere: OUT=dir bash benchmarks/gpu_check.sh. Wheels for packages the machine
# lacks (e.g. pydantic) in .whl/ are installed first. Each step has its own time limit (600 s
# in all: one device command's limit) and log; a failing step does not stop the others; the
# exit status says whether any failed. docs/scaling.md records the results.
set -u
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-gpu-check}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
TMP=${TMPDIR:-/tmp}  # scratch: the wheels' install, the cache, the runs
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$TMP/calibdcd-site" .whl/*.whl && export PYTHONPATH="$TMP/calibdcd-site"
fi
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
export CALIBDCD_CACHE=${CALIBDCD_CACHE:-$TMP/calibdcd-gpu-cache}
DEV=${DEV:-cuda}  # the benchmark's device (DEV=cpu tries the script where no GPU is)
RUN=$TMP/calibdcd-gpu-runs
rm -rf "$RUN" && mkdir -p "$RUN"
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers',
transformers.__version__, torch.cuda.get_device_name(), 'bf16', torch.cuda.is_bf16_supported())"
  echo "cpus $(nproc); kernel $(uname -r); commit $(git rev-parse --short HEAD 2>/dev/null)"
} >"$OUT/steps.txt" 2>&1

failed=0
step() {  # step NAME SECONDS COMMAND...: run with a limit, log to $RUN/NAME.log, time it
  local name=$1 limit=$2 t0 rc
  shift 2
  t0=$(date +%s)
  timeout -k 10 "$limit" "$@" >"$RUN/$name.log" 2>&1
  rc=$?
  echo "$name: rc=$rc, $(($(date +%s) - t0)) s" | tee -a "$OUT/steps.txt"
  if [ "$rc" -ne 0 ]; then
    failed=1
    tail -c 1500 "$RUN/$name.log" | tr '\r' '\n' | tail -8 >>"$OUT/steps.txt"
  fi
}

demo_config() {  # demo_config DETECTOR FILE: configs/demo.yaml on device auto, one detector
  python3 - "$1" "$2" "$RUN" <<'EOF'
import sys
import yaml
detector, path, runs = sys.argv[1:]
c = yaml.safe_load(open("configs/demo.yaml"))
for t in c["targets"]:
    t["options"].update(device="auto", dtype="auto")
c["detectors"] = [d for d in c["detectors"] if d["name"] == detector]
c["name"], c["output"] = f"gpu-demo-{detector}", f"{runs}/{detector}"
yaml.safe_dump(c, open(path, "w"), sort_keys=False)
EOF
}

step pytest 100 python3 -m pytest -q -p no:cacheprovider \
  tests/test_gpu.py tests/test_device.py tests/test_targets_hf.py
step bench-random 90 python3 benchmarks/targets.py --quick --device "$DEV" \
  --json "$OUT/bench-random.json"
demo_config overlap "$RUN/overlap.yaml" && step demo-overlap 125 \
  python3 -m calibdcd run "$RUN/overlap.yaml" --no-progress
chat=$(find "$CALIBDCD_CACHE/lab" -path '*/.*' -prune -o -type d -name chat-qwen -print \
  2>/dev/null | head -1)
if [ -n "$chat" ] && [ -f "$chat/config.json" ]; then
  step bench-lab 75 python3 benchmarks/targets.py --quick --device "$DEV" --model "$chat" \
    --json "$OUT/bench-lab.json"
fi
step mapping-profile 60 python3 benchmarks/mapping_profile.py --device "$DEV" \
  --json "$OUT/mapping_profile_cpu_$DEV.json"
step ipot-batched 30 python3 benchmarks/ipot_batched.py --device "$DEV" --positions 64 \
  --json "$OUT/ipot_batched_$DEV.json"
demo_config veilprobe "$RUN/veilprobe.yaml" && step demo-veilprobe 120 \
  python3 -m calibdcd run "$RUN/veilprobe.yaml" --no-progress
# the runs (result.json per setting, the report), the steps' logs and the lab's record, one file
# (a machine may send back only a few files)
lab=$(find "$CALIBDCD_CACHE/lab" -path '*/.*' -prune -o -name lab.json -print 2>/dev/null | head -1)
[ -n "$lab" ] && cp "$lab" "$RUN/lab.json"
tar czf "$OUT/runs.tgz" -C "$TMP" calibdcd-gpu-runs
cat "$OUT/steps.txt"
exit "$failed"
