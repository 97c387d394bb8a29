#!/usr/bin/env bash
# Acceptance recipes on the demo (issue 70), a SHORT comparison on 2 loaded CPU cores:
# ce vs kl vs lk_hybrid vs lk_nll fine-tunes of the mtp8 heads on a frozen demo target, on the
# target's own answers; acceptance on 16 held-out GSM8K test questions.
# Usage: bash experiments/training_recipes/run.sh [gen|train NAME|eval NAME|all]
# Outputs under $RUNS (default /tmp/mtpx_recipes), outside the repository; rerunning resumes.
set -euo pipefail
cd "$(dirname "$0")/../.."
export MTPX_DATA_DIR=${MTPX_DATA_DIR:-/work/shared/data}
RUNS=${RUNS:-/tmp/mtpx_recipes}
DISTILL=$RUNS/distill_gsm8k_train
STEPS=${STEPS:-40}
NUM_PROMPTS=${NUM_PROMPTS:-128}     # distilled GSM8K-train questions
LR=${LR:-1e-3}
LOSSES=${LOSSES:-ce kl lk_hybrid lk_nll}

gen() {  # the target's greedy answers to the first 128 GSM8K-train questions (at most 128 tokens)
  python train_or_eval.py mode=distill data=gsm8k data.path='${data_dir}/gsm8k/train.jsonl' \
    distill.out_dir=$DISTILL distill.num_prompts=$NUM_PROMPTS distill.shard_size=64 distill.max_tokens=128 \
    distill.threads=1 engine.max_num_seqs=32 engine.compile=false +spec=mtp8 logger=none hydra.run.dir=$RUNS/gen.hydra
}

# every fine-tune: frozen demo target, its 8 heads trained further, STEPS steps of 8 x 128 tokens
COMMON="mode=train train.freeze_base=true model.path=checkpoints/demo train.steps=$STEPS train.warmup_steps=5
  train.lr=$LR train.min_lr=$(python -c "print($LR / 10)") train.batch_size=8 train.seq_len=128 train.eval_every=0 train.save_every=0
  train.threads=1 train.data_sources=[distill] train.distill_path=$DISTILL logger=none"
train() {
  local name=$1
  /usr/bin/time -f "$name train wall %e s" python train_or_eval.py $COMMON train.mtp_loss=$name \
    train.out_dir=$RUNS/ft_$name hydra.run.dir=$RUNS/ft_$name.hydra
}

# GSM8K test, the first 16 questions, greedy, at most 128 tokens, mtp8 k = 8
evaluate() {
  local name=$1 ckpt
  if [ "$name" = base ]; then ckpt=checkpoints/demo; else ckpt=$RUNS/ft_$name; fi
  python train_or_eval.py mode=eval data=gsm8k model.path=$ckpt +spec=mtp8 eval.num_prompts=16 \
    eval.max_tokens=128 eval.concurrency=16 eval.check_lossless=false eval.threads=1 engine.compile=false logger=none \
    hydra.run.dir=$RUNS/eval_$name
}

case ${1:-all} in
  gen) gen ;;
  train) train "$2" ;;
  eval) evaluate "$2" ;;
  all)
    gen
    for n in $LOSSES; do train $n; done
    for n in base $LOSSES; do evaluate $n; done
    python experiments/training_recipes/table.py "$RUNS" ;;
esac
