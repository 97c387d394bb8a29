#!/usr/bin/env bash
# GSM8K test set (1319 prompts) on the demo checkpoint: no spec vs mtp1 vs mtp8, greedy,
# 256 output tokens at most, 64 batch slots. The spec runs also decode without speculation
# (lossless check) and report that pass's throughput as "Plain decoding throughput".
set -euo pipefail
cd "$(dirname "$0")/../.."
common="data=gsm8k eval.num_prompts=null eval.max_tokens=256 eval.concurrency=64 logger=none"
python train_or_eval.py $common hydra.run.dir=outputs/gsm8k_demo/nospec
python train_or_eval.py +spec=mtp1 $common hydra.run.dir=outputs/gsm8k_demo/mtp1
python train_or_eval.py +spec=mtp8 $common hydra.run.dir=outputs/gsm8k_demo/mtp8
for r in nospec mtp1 mtp8; do cp outputs/gsm8k_demo/$r/metrics.json experiments/gsm8k_demo/$r.metrics.json; done
python tools/compare_runs.py "no spec=outputs/gsm8k_demo/nospec" mtp1=outputs/gsm8k_demo/mtp1 \
  mtp8=outputs/gsm8k_demo/mtp8 --plot experiments/gsm8k_demo/per_position_acceptance.png \
  > experiments/gsm8k_demo/table.md
