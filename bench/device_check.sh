#!/usr/bin/env bash
# The prepared GPU check: one script, under 8 minutes on one GPU, nothing downloaded. Prints one JSON line per
# figure on stdout (progress on stderr):
#   1. verify_cost: c(P)/c(1) for P in 1..21, both layouts, on the embedded target, on an SDAR-8B-shaped
#      model with random bf16 weights (12 of its 36 layers: the full depth scales every P alike) and on a
#      LLaDA2.0-mini-shaped one (6 of its 20 layers: 256 experts each);
#   2. verify_exactness: pieces of a P-piece verify against one-piece forwards, P = 2, 9, 21, both layouts;
#   3. auto_cost: what budget=auto weighs on the device (bf16, exact layout): c(P, L), the drafter's seconds per
#      tree and the tree size the rule picks at the shipped drafter's mean reach;
#   4. benchmark: README command 1 (four tasks at --limit 10, up to 256 new tokens, SPOT@8, SPOT@auto and Spiffy@3 against draft-free)
#      on the device in bf16, exact layout, one line per task and method with its forward and throughput ratios;
#   5. batching: tokens/s and forwards per request at batch 1, 2, 4, 8 (bench/batching.py), draft-free, SPOT@8 and
#      Spiffy@3, bf16 exact layout, with the requests whose tokens moved against batch 1 (0 expected);
#   6. placement_overhead: the embedded target spread by a device map (over two GPUs where two are visible, else an
#      explicit one-GPU map; the dry run: CPU and disk offload) beside the whole one: seconds per decode, tokens and
#      forwards identical, the MiB of weights on each GPU.
# --dry-run: the same steps on the CPU at toy sizes, in float32, the benchmark on one task: CI runs it, so that the
# script stays runnable between GPU sessions (a CPU without bf16 instructions spends ~10x float32's time on a bf16
# linear; the suite tests bf16 decoding itself, tests/test_exactness.py).
# Usage: bash bench/device_check.sh [--dry-run]   (from the repository root, with the project installed)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
LM_EVAL=${LM_EVAL:-lm_eval}
if [ "${1:-}" = "--dry-run" ]; then
  DEVICE=cpu DTYPE=float32 PIECES=1+2+3 SDAR="--layers 1 --width-divisor 32" LLADA2="--layers 2 --width-divisor 32" CONTEXT=64 REPEATS=1
  EXACTNESS="--prompts 1 --gen 32 --pieces 2 --repeats 1" TASKS=spot_gsm8k LIMIT=1 MAX_GEN=16 BATCHING="--prompts 2 --gen 8 --sizes 1+2 --repeats 1"
  PLACEMENT="--prompts 1 --repeats 1 --gen-length 16 --budget 2"
else
  DEVICE=cuda DTYPE=bfloat16 PIECES=1+2+3+4+5+7+9+11+13+15+17+19+21 SDAR="--layers 12" LLADA2="--layers 6" CONTEXT=512 REPEATS=9
  EXACTNESS="--prompts 8 --gen 128 --pieces 2+9+21" TASKS=spot_all LIMIT=10 MAX_GEN=256 BATCHING="--prompts 8 --gen 128 --sizes 1+2+4+8 --repeats 1"
  PLACEMENT="--prompts 6 --repeats 3 --gen-length 128"
fi
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 PYTHONUNBUFFERED=1
# The bench steps run one after another in one Python process (bench/steps.py). A step that fails is reported
# (one {"failed": ...} line on stdout) and the others still run; the script then exits 1.
status=0
$PY bench/steps.py \
  "verify cost, embedded target" "verify_cost.py --model embedded --device $DEVICE --dtype $DTYPE --pieces $PIECES --context $CONTEXT --repeats $REPEATS" \
  "verify cost, SDAR-8B-shaped" "verify_cost.py --model sdar-8b $SDAR --device $DEVICE --dtype $DTYPE --pieces $PIECES --context $CONTEXT --repeats $REPEATS" \
  "verify cost, LLaDA2.0-mini-shaped" "verify_cost.py --model llada2-mini $LLADA2 --device $DEVICE --dtype $DTYPE --pieces $PIECES --context $CONTEXT --repeats $REPEATS" \
  "exactness of the two layouts" "verify_exactness.py --device $DEVICE --dtype $DTYPE $EXACTNESS" \
  "budget=auto's inputs" "auto_cost.py --device $DEVICE --dtype $DTYPE --exact --remeasure" \
  "batched decoding" "batching.py --device $DEVICE --dtype $DTYPE --exact $BATCHING" \
  "a target spread by a device map" "placement_overhead.py --device $DEVICE --dtype $DTYPE $PLACEMENT" || status=1
echo "device_check: the four-task benchmark" >&2
RUN=$(mktemp -d)
trap 'rm -rf "$RUN"' EXIT
if (cd "$RUN" && "$LM_EVAL" --model spot --model_args "device=$DEVICE,dtype=$DTYPE,exact=true,methods=spot@8+spot@auto+spiffy@3,output_dir=$RUN/run" \
  --tasks $TASKS --include_path "$OLDPWD/tasks" --apply_chat_template --confirm_run_unsafe_code --limit $LIMIT --gen_kwargs max_gen_toks=$MAX_GEN >&2); then
  $PY - "$RUN/run/summary.csv" "$DEVICE" "$DTYPE" <<'PY'
import csv, json, sys
for row in csv.DictReader(open(sys.argv[1])):
    print(json.dumps({"bench": "benchmark", "device": sys.argv[2], "dtype": sys.argv[3], "exact": True, "task": row["task"],
                      "label": row["label"], "requests": int(row["requests"]), "forward_ratio": float(row["forward_ratio"]),
                      "throughput_ratio": float(row["throughput_ratio"]), "lossless": float(row["lossless"]),
                      "mean_tree_size": float(row["mean_tree_size"])}))
PY
else
  echo '{"bench": "steps", "failed": "the four-task benchmark"}'
  status=1
fi
exit $status
