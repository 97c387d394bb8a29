#!/usr/bin/env bash
# Prefix caching with multi-module MTP on the GSM8K test set (1319 prompts): demo checkpoint,
# +spec=mtp8, greedy, 256 output tokens at most, concurrency 64, prefix caching off vs on.
# Two prompt formats: zero-shot ("Question: ...\nAnswer:", prompts share almost nothing) and
# 2-shot (two solved train examples before every question: a 216-token shared prefix).
# Every run also decodes without speculation (lossless check, exit 1 on a mismatch).
set -euo pipefail
cd "$(dirname "$0")/../.."
out=outputs/prefix_caching_gsm8k
exp=experiments/prefix_caching_gsm8k
common="+spec=mtp8 data=gsm8k eval.num_prompts=null eval.max_tokens=256 eval.concurrency=64 logger=none"
for shots in 0 2; do
  for pc in false true; do
    name=${shots}shot_caching_$([ $pc = true ] && echo on || echo off)
    python train_or_eval.py $common data.num_fewshot=$shots engine.enable_prefix_caching=$pc \
      hydra.run.dir=$out/$name
    cp $out/$name/metrics.json $exp/$name.metrics.json
  done
  python tools/compare_runs.py "Prefix caching OFF=$out/${shots}shot_caching_off" \
    "Prefix caching ON=$out/${shots}shot_caching_on" > $exp/table_${shots}shot.md
done
