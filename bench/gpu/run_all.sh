#!/usr/bin/env bash
# The device run (bench/gpu/README.md): wheels, then on a Qwen3-0.6B-shaped random model in bf16
# the stages named in STAGES (default "decode stages", ~6 min: the decode step modes and the
# per-stage breakdown; also: padding, mfu = bench/mfu.py, torchrun = a torchrun SFT run). Every
# stage runs under its own timeout and writes into $OUT as it goes: a failed stage leaves the rest.
# MFU_DEVICE=cpu MFU_SHAPE=tiny MFU_QUICK=1 bash bench/gpu/run_all.sh   # the CPU dry run
# STAGES="padding mfu" MFU_PHASES=grpo,generate bash bench/gpu/run_all.sh  # a subset
# RLHF_LAB_DECODE_STEP=dynamic ... : every rollout without CUDA graphs (the "before" figures)
set -u
OUT="${OUT:-/tmp/mfu-out}"; mkdir -p "$OUT"
DEVICE="${MFU_DEVICE:-cuda}"; SHAPE="${MFU_SHAPE:-qwen3-0.6b}"
QUICK=${MFU_QUICK:+--quick}
STAGES=" ${STAGES:-decode stages} "; PHASES=${MFU_PHASES:+--phases $MFU_PHASES}
want() { [[ "$STAGES" == *" $1 "* ]]; }
LOG="$OUT/run_all.log"
export HF_HUB_OFFLINE=1 WANDB_MODE=disabled TOKENIZERS_PARALLELISM=false
stage() { local name=$1 limit=$2; shift 2; echo "=== $name ($(date -u +%T), limit ${limit}s)" | tee -a "$LOG"
  local t0=$SECONDS; timeout "$limit" "$@" >>"$LOG" 2>&1; local rc=$?
  echo "=== $name rc=$rc $((SECONDS - t0))s" | tee -a "$LOG"; echo "$name rc=$rc $((SECONDS - t0))s" >>"$OUT/summary.txt"; }
{ nvidia-smi || true; python3 -c "import torch, transformers; print(torch.__version__, transformers.__version__)"; } >"$OUT/env.txt" 2>&1
if [[ -d .whl ]] && ls .whl/*.whl >/dev/null 2>&1 && [[ "$DEVICE" == cuda ]]; then
  stage wheels 120 python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
  # sdists (pycosat: a C extension without a cp312 wheel); reasoning-gym imports it
  for s in .whl/sdist/*; do [[ -e "$s" ]] && stage "build $(basename "$s")" 90 \
    python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/site "$s"; done
  export PYTHONPATH="/tmp/site:$PWD"
else
  export PYTHONPATH="$PWD"
fi
PY=python3; [[ "$DEVICE" == cpu ]] && PY="uv run python"
want padding && stage padding 150 $PY bench/gpu/padding_nan.py --device "$DEVICE" --shape "$SHAPE" \
  --out "$OUT/padding_nan.json"
# the decode step modes (dynamic = eager over the filled cache, graphs = CUDA graphs per bucket):
# tokens/s at 32/64/256 rows x 256 new tokens, greedy agreement with each other and `generate`
want decode && stage decode "${DECODE_LIMIT:-180}" $PY bench/decode_steps.py --device "$DEVICE" \
  --shape "$SHAPE" ${QUICK} ${DECODE_ARGS:-} --out "$OUT/decode_steps.json"
# where a step's time goes (bench/stage_breakdown.py): GRPO stages, SFT and DPO mfu/step, from the
# trainers' own metrics
want stages && stage stages "${STAGES_LIMIT:-240}" $PY bench/stage_breakdown.py --device "$DEVICE" \
  --shape "$SHAPE" ${QUICK} --out "$OUT/stage_breakdown.json"
want mfu && stage mfu "${MFU_LIMIT:-330}" $PY bench/mfu.py --device "$DEVICE" --shape "$SHAPE" \
  $QUICK $PHASES ${MFU_ARGS:-} --out "$OUT/mfu.json"
want torchrun || { echo "--- summary"; cat "$OUT/summary.txt"; grep -A30 "^MFU on" "$LOG" | head -40; exit 0; }
# torchrun --nproc-per-node 1: one GPU gives world size 1 (no process group, no FSDP2 sharding);
# this checks that the launcher path and a bf16 CUDA step run, and times the steps.
RUN="$OUT/torchrun_sft"; rm -rf "$RUN"
MODEL="$SHAPE"; DATA=builtin:reasoning-sft
if [[ "$SHAPE" == qwen3-0.6b ]]; then  # no preset build there: the random Qwen3 shape again
  MODEL=/tmp/tr-model; DATA=/tmp/tr-data/sft.jsonl
  stage torchrun-model 90 $PY -c "import sys; sys.path[:0] = ['bench']; from pathlib import Path
from _mfu_setup import build_qwen3, write_synthetic_data
build_qwen3(Path('$MODEL'), 'cuda'); write_synthetic_data(Path('/tmp/tr-data'), 64, 256)"
fi
stage torchrun-sft 120 $PY -m torch.distributed.run --nproc-per-node 1 -m trainers.sft.train \
  --config trainers/sft/configs/sft.yaml --run-dir "$RUN" --set model.name="$MODEL" \
  --set model.device="$DEVICE" --set train.max_steps=4 --set train.batch_size=8 \
  --set data.dataset="$DATA" --set data.max_samples=48 --set data.max_length=256 \
  --set model.gradient_checkpointing=false --set data.eval_size=0 \
  --set eval.eval_every=0 --set eval.num_samples=0 --set checkpoint.save_final_model=false \
  --set checkpoint.save_every=null --set logging.log_every=1
[[ -f "$RUN/summary.json" ]] && cp "$RUN/summary.json" "$OUT/torchrun_summary.json"
[[ -f "$RUN/metrics.jsonl" ]] && cp "$RUN/metrics.jsonl" "$OUT/torchrun_metrics.jsonl"
rm -rf "$RUN"
echo "--- summary"; cat "$OUT/summary.txt"; grep -A30 "^MFU on" "$LOG" | head -40
