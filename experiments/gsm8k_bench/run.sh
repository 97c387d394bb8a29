#!/usr/bin/env bash
# The reference's GSM8K benchmark (1319 test prompts, concurrency 64, temperature 0, at most 256
# output tokens) on the demo checkpoint: MTP1 vs MTP8, a k sweep for MTP8 (1, 2, 4, 8), plain
# decoding, the position-0 bucket tables, the cost model's recommended k vs the measured best k.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=experiments/gsm8k_bench
RUNS=$OUT/runs
COMMON="mode=bench data=gsm8k bench.num_prompts=null bench.max_tokens=256 bench.concurrency=64 logger=none"
rm -rf "$RUNS"
python train_or_eval.py $COMMON hydra.run.dir=$RUNS/plain
python train_or_eval.py $COMMON +spec=mtp1 hydra.run.dir=$RUNS/mtp1
python train_or_eval.py -m $COMMON +spec=mtp8 spec.num_speculative_tokens=1,2,4,8 hydra.sweep.dir=$RUNS/mtp8_k
python tools/sweep_table.py $RUNS/mtp8_k --out $OUT/sweep.md
python tools/dashboard.py $RUNS/mtp1 $RUNS/mtp8_k/3 --names "MTP 1" "MTP 8" --out $OUT/dashboard
python tools/cost_model.py --acceptance $RUNS/mtp8_k/3 --spec mtp8 --ks 0 1 2 4 8 --batch-sizes 1 16 64 \
  --measured $RUNS/plain $RUNS/mtp8_k/0 $RUNS/mtp8_k/1 $RUNS/mtp8_k/2 $RUNS/mtp8_k/3 --out $OUT
find "$RUNS" -name outputs.jsonl -delete   # per-request rows stay out of git (about 1 MB per run)
