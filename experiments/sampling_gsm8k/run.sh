#!/usr/bin/env bash
# Temperature 1 on the demo checkpoint: MTP1 vs MTP8 with standard (token-level) verification vs
# MTP8 with block verification, the reference's last table. GSM8K test, first 256 prompts (the
# reference's temperature-1 table also has 256 prompts), 256 output tokens at most, concurrency 16,
# per-request seeds eval.seed + index. Drafts are sampled from the draft distribution
# (spec.draft_sample_method=probabilistic); one extra MTP8 run with greedy (argmax) drafts.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=outputs/sampling_gsm8k
exp=experiments/sampling_gsm8k
common="data=gsm8k eval.num_prompts=256 eval.max_tokens=256 eval.concurrency=16 eval.temperature=1.0 logger=none"
python train_or_eval.py +spec=mtp1 spec.draft_sample_method=probabilistic $common hydra.run.dir=$out/mtp1
python train_or_eval.py +spec=mtp8 spec.draft_sample_method=probabilistic $common hydra.run.dir=$out/mtp8_standard
python train_or_eval.py +spec=mtp8_block spec.draft_sample_method=probabilistic $common hydra.run.dir=$out/mtp8_block
python train_or_eval.py +spec=mtp8 $common hydra.run.dir=$out/mtp8_standard_greedy_drafts
for r in mtp1 mtp8_standard mtp8_block mtp8_standard_greedy_drafts; do cp $out/$r/metrics.json $exp/$r.metrics.json; done
python tools/compare_runs.py "MTP 1=$out/mtp1" "MTP 8 (standard)=$out/mtp8_standard" \
  "MTP 8 (block)=$out/mtp8_block" "MTP 8 (standard, greedy drafts)=$out/mtp8_standard_greedy_drafts" \
  > $exp/table.md
