#!/usr/bin/env bash
# Issue 56's checks on a GPU machine, in one go (under 10 minutes on one H200), each part under its own timeout,
# everything written to $OUT (default ./device-out). Run from the checkout's root, with .whl/ carried beside it
# (../shared/gpu/make-wheels.sh, run AFTER the commits to test: the wheel is trainpipe built from the checkout):
#   bash bench/gpu/device_check.sh
# Parts: the bench's GPU family (narrow, tiny, wide; no checkpoint comparison); a torch.profiler window on the
# narrow shape, bare loop beside train_model; the 1B end phase against one safetensors write of its weights; then
# the CUDA tier with pytest alone, given what is left of BUDGET. A part that fails or times out is noted and the
# next one runs.
set -uo pipefail
OUT=${OUT:-$PWD/device-out}
BUDGET=${BUDGET:-575}  # seconds for the whole script (the device tool's limit is 600 a command)
mkdir -p "$OUT"
t0=$(date +%s)
note() { echo "[$(($(date +%s) - t0)) s] $*" | tee -a "$OUT/summary.txt"; }
part() {  # part NAME SECONDS COMMAND...: run under a timeout, its output in $OUT/NAME.log, its status noted
  local name=$1 limit=$2
  shift 2
  local start=$(date +%s)
  timeout -k 10 "$limit" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  note "$name: exit $rc in $(($(date +%s) - start)) s (limit $limit s)$([ $rc = 124 ] && echo ': TIMED OUT')"
}

note "device: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | head -1)"
python3 -m pip install -q --no-index --no-deps --no-compile --target .site .whl/*.whl >"$OUT/install.log" 2>&1 \
  || note "install failed (see install.log)"
export PYTHONPATH=$PWD/.site
note "$(git rev-parse --short HEAD 2>/dev/null || echo 'no git'): $(python3 -c 'import torch, trainpipe; print("torch", torch.__version__, "trainpipe", trainpipe.__file__)' 2>&1 | tail -1)"
export TRAINPIPE_CACHE_DIR=$PWD/.cache-trainpipe MLFLOW_TRACKING_URI= TRAINPIPE_IMAGE=

# 1. the bench's GPU family: whole-run samples/s against the bare loop, narrow, tiny and wide, 1 repeat each
part gpu_family 110 env TRAINPIPE_BENCH_GPU_SHAPES=narrow,tiny,wide TRAINPIPE_BENCH_GPU_EPOCHS=4 \
  TRAINPIPE_BENCH_GPU_SECONDS=0 python3 bench/run.py --only gpu --repeats 1

# 2. a profiler window on the narrow shape: train_model's (its telemetry) and a bare loop's, per step
work=$(mktemp -d)
python3 -c "import sys; sys.path.insert(0, '.'); from bench.common import digits; digits(__import__('pathlib').Path('$work/d.csv'), 256)"
part profile_run 50 python3 -m trainpipe.components.train_model --data "$work/d.csv" --output-dir "$work/prof" \
  --tracking-uri "sqlite:///$work/mlflow.db" --device cuda --precision bf16 --batch-size 4096 --epochs 1 \
  --train-config '{"hidden_units": [4096, 4096], "learning_rate": 0.05}' --profile-steps 20 --checkpoint-every-steps 0
part profile_table 35 env PYTHONPATH="$PWD/bench/baselines:$PYTHONPATH" python3 bench/probes/gpu_step_profile.py \
  "$work/d.csv" 4096,4096 4096 20 "$work/prof/telemetry/rank0.json"
cp "$OUT/profile_table.log" "$OUT/profile-narrow.md" 2>/dev/null
cp "$work/prof/telemetry/rank0.json" "$OUT/profile-narrow-telemetry.json" 2>/dev/null
rm -rf "$work"

# 3. the 1B end phase: 64-22528×3-10 (1.017B parameters), b8192 bf16, 4 epochs of digits ×256, against one
#    safetensors save_file (+ fsync) of its weights to the same disk
part end_phase_1b 140 env TRAINPIPE_BENCH_END_HIDDEN=22528,22528,22528 TRAINPIPE_BENCH_END_DEVICE=cuda \
  TRAINPIPE_BENCH_END_PRECISION=bf16 TRAINPIPE_BENCH_END_BATCH=8192 TRAINPIPE_BENCH_END_EPOCHS=4 \
  TRAINPIPE_BENCH_END_MAX_STEPS=0 TRAINPIPE_BENCH_END_COPIES=256 python3 bench/run.py --only end_phase --repeats 1

# 4. the CUDA tier with pytest alone (174 s on 2026-11-28, one test more now), with what is left of the budget
left=$((BUDGET - ($(date +%s) - t0)))
part cuda_tier $((left > 60 ? left : 60)) python3 -m pytest tests/cuda -m cuda -q -p no:cacheprovider

note "done in $(($(date +%s) - t0)) s"
tail -n 25 "$OUT/cuda_tier.log" "$OUT/gpu_family.log" "$OUT/end_phase_1b.log" 2>/dev/null | grep -v '^$' | tail -n 60
