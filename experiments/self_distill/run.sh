#!/usr/bin/env bash
# Self-distillation, loss decay and recursive unroll on the demo (issue 15), 2 CPU cores.
# Usage: bash experiments/self_distill/run.sh [gen|train NAME|eval NAME SPEC [K]|all]
# Everything is written under $RUNS (default /work/runs); rerunning a step resumes it.
set -euo pipefail
cd "$(dirname "$0")/../.."
RUNS=${RUNS:-/work/runs}
DISTILL=$RUNS/distill_gsm8k_train

gen() {  # the target's own greedy answers to the first 2048 GSM8K-train questions
  python train_or_eval.py mode=distill data=gsm8k data.path='${data_dir}/gsm8k/train.jsonl' \
    distill.out_dir=$DISTILL distill.num_prompts=2048 distill.shard_size=128 distill.max_tokens=256 \
    distill.threads=1 engine.max_num_seqs=32 +spec=mtp8 logger=none
}

# Every fine-tune: frozen demo target, heads from checkpoints/demo, 150 steps of 16 x 256 tokens.
COMMON="mode=train train.freeze_base=true model.path=checkpoints/demo train.steps=150 train.warmup_steps=10
  train.lr=1e-3 train.min_lr=1e-4 train.eval_every=50 train.save_every=25 train.threads=1 logger=none"
train() {
  local name=$1 extra
  case $name in
    human)         extra="train.data_sources=[gsm8k]" ;;                       # GSM8K train, human answers
    distill)       extra="train.data_sources=[distill] train.distill_path=$DISTILL" ;;
    distill_decay) extra="train.data_sources=[distill] train.distill_path=$DISTILL train.mtp_loss_decay=0.6" ;;
    # single-module MTP (mtp1): module 0 only, one depth or unrolled 4 times on its own outputs
    mtp1_distill)  extra="train.data_sources=[distill] train.distill_path=$DISTILL model.num_nextn_predict_layers=1" ;;
    mtp1_unroll)   extra="train.data_sources=[distill] train.distill_path=$DISTILL model.num_nextn_predict_layers=1 train.mtp_unroll=4" ;;
    *) echo "unknown run $name"; exit 2 ;;
  esac
  python train_or_eval.py $COMMON $extra train.out_dir=$RUNS/ft_$name hydra.run.dir=$RUNS/ft_$name.hydra
}

# GSM8K test, first 128 questions, greedy, at most 256 tokens; acceptance does not depend on timing.
evaluate() {  # NAME SPEC [K]: K = num_speculative_tokens (default: the spec's, mtp1 1, mtp8 8)
  local name=$1 spec=$2 k=${3:-} ckpt tag
  if [ "$name" = base ]; then ckpt=checkpoints/demo; else ckpt=$RUNS/ft_$name; fi
  tag=${name}_$spec${k:+_k$k}
  python train_or_eval.py mode=eval data=gsm8k model.path=$ckpt +spec=$spec ${k:+spec.num_speculative_tokens=$k} \
    eval.num_prompts=128 eval.max_tokens=256 eval.concurrency=16 eval.check_lossless=false eval.threads=1 logger=none \
    hydra.run.dir=$RUNS/eval_$tag
  cp $RUNS/eval_$tag/metrics.json experiments/self_distill/metrics/$tag.json
}

mkdir -p experiments/self_distill/metrics
case ${1:-all} in
  gen) gen ;;
  train) train "$2" ;;
  eval) evaluate "$2" "$3" "${4:-}" ;;
  all)
    gen
    for n in human distill distill_decay mtp1_distill mtp1_unroll; do train $n; done
    for s in mtp1 mtp8; do for n in base human distill distill_decay; do evaluate $n $s; done; done
    for n in base distill mtp1_distill mtp1_unroll; do evaluate $n mtp1 4; done
    for n in mtp1_distill mtp1_unroll; do evaluate $n mtp1; done ;;
esac
