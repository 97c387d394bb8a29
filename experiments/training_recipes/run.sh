#!/usr/bin/env bash
# The recipe table of issue 70 on the demo (frozen target): self-distilled data, the target's
# hidden states extracted once (mode=extract), then each recipe's heads trained from the shards,
# and acceptance on held-out GSM8K test and HumanEval prompts (greedy, eager; acceptance does not
# depend on timing).
# Usage: bash experiments/training_recipes/run.sh gen|extract|train NAME|eval NAME SPEC K DATA|table
# Outputs under $RUNS (default /tmp/mtpx_recipes3), outside the repository; every step resumes.
set -euo pipefail
cd "$(dirname "$0")/../.."
export MTPX_DATA_DIR=${MTPX_DATA_DIR:-/work/shared/data} OMP_NUM_THREADS=1
RUNS=${RUNS:-/tmp/mtpx_recipes3}
DISTILL=$RUNS/distill
SHARDS=$RUNS/shards
NUM_PROMPTS=${NUM_PROMPTS:-1280}  # distilled GSM8K-train questions
STEPS=${STEPS:-36}
LR=${LR:-1e-3}
EVAL_PROMPTS=${EVAL_PROMPTS:-32}
SAVE_EVERY=${SAVE_EVERY:-12}
TAG=${TAG:-}  # train NAME writes $RUNS/ft_NAME$TAG (evaluate it as NAME$TAG)

gen() {  # the target's greedy answers (at most 128 tokens) to the first NUM_PROMPTS GSM8K-train questions
  torchrun --nproc_per_node=2 --master_port=29611 train_or_eval.py mode=distill data=gsm8k \
    data.path='${data_dir}/gsm8k/train.jsonl' distill.out_dir=$DISTILL distill.num_prompts=$NUM_PROMPTS \
    distill.shard_size=64 distill.max_tokens=128 distill.threads=1 engine.max_num_seqs=32 engine.compile=false \
    +spec=mtp8 logger=none hydra.run.dir=$RUNS/gen.hydra
}

DATA="train.data_sources=[distill] train.distill_path=$DISTILL train.seq_len=256"
extract() {  # the frozen target's hidden states and top-64 log-probs on the packed corpus, 2 ranks
  torchrun --nproc_per_node=2 --master_port=29612 train_or_eval.py mode=extract model.path=checkpoints/demo \
    $DATA train.hidden_states_path=$SHARDS train.threads=1 train.batch_size=16 logger=none \
    hydra.run.dir=$RUNS/extract.hydra
}

# every recipe: the demo target frozen, heads trained from the shards, STEPS steps of 16 x 256
# tokens, AdamW at LR (10 warm-up steps, cosine to LR / 10), FastMTP's step decay 0.6
COMMON="mode=train train.freeze_base=true train.hidden_states_path=$SHARDS $DATA
  train.steps=$STEPS train.warmup_steps=4 train.lr=$LR train.min_lr=$(python -c "print($LR / 10)")
  train.batch_size=16 train.eval_every=0 train.save_every=$SAVE_EVERY train.eval_batches=2 train.threads=1 train.mtp_loss_decay=0.6 logger=none"
MTP1="model.num_nextn_predict_layers=1 train.mtp_unroll=3"
heads4() {  # $RUNS/heads4: the demo checkpoint with only its first 4 draft modules; with `copy`,
  # $RUNS/heads4_copy: 8 modules, 4-7 copies of module 3 (the new modules' initialisation)
  local out=$RUNS/heads4${1:+_$1}
  [ -f $out/model.safetensors ] || python - "$out" "${1:-}" <<'PY'
import json, shutil, sys
from pathlib import Path
from safetensors.torch import load_file, save_file
src, out = Path("checkpoints/demo"), Path(sys.argv[1])
shutil.copytree(src, out, dirs_exist_ok=True)
cfg = json.loads((src / "config.json").read_text())
state = load_file(src / "model.safetensors")
keep = {k: v for k, v in state.items() if not (k.startswith("mtp.") and int(k.split(".")[1]) >= 4)}
if sys.argv[2] == "copy":
    keep.update({f"mtp.{i}." + k[len("mtp.3."):]: v.clone() for k, v in keep.items() if k.startswith("mtp.3.")
                 for i in range(4, 8)})
cfg["num_nextn_predict_layers"] = 8 if sys.argv[2] == "copy" else 4
(out / "config.json").write_text(json.dumps(cfg, indent=2))
save_file(keep, out / "model.safetensors", metadata={"format": "pt"})
PY
}

train() {
  local name=$1 extra ckpt=checkpoints/demo
  case $name in
    ce)        extra="train.mtp_loss=ce" ;;
    kl)        extra="train.mtp_loss=kl" ;;
    lk)        extra="train.mtp_loss=lk_hybrid" ;;
    lk_tf)     extra="train.mtp_loss=lk_hybrid train.mtp_hidden_input=target" ;;   # teacher forcing
    ce_tf)     extra="train.mtp_loss=ce train.mtp_hidden_input=target" ;;   # teacher forcing
    # modules 4-7 added after the fact: a 4-module copy of the shipped heads (heads4), 4 fresh
    # modules trained on the frozen modules 0-3's own outputs
    posthoc)   heads4; ckpt=$RUNS/heads4
               extra="train.mtp_loss=ce model.num_nextn_predict_layers=8 train.mtp_freeze_modules=4" ;;
    posthoc_copy) heads4 copy; ckpt=$RUNS/heads4_copy   # the same, new modules start as module 3
               extra="train.mtp_loss=ce train.mtp_freeze_modules=4" ;;
    mtp1_unroll) extra="train.mtp_loss=lk_hybrid $MTP1" ;;
    mtp1_ttt)  extra="train.mtp_loss=lk_hybrid $MTP1 train.mtp_unroll_ttt=true" ;;
    *) echo "unknown recipe $name"; exit 2 ;;
  esac
  /usr/bin/time -f "$name train wall %e s cpu %U+%S s" python train_or_eval.py $COMMON model.path=$ckpt $extra \
    train.out_dir=$RUNS/ft_$name$TAG hydra.run.dir=$RUNS/ft_$name$TAG.hydra
}

evaluate() {  # NAME SPEC K DATA: the first EVAL_PROMPTS prompts of DATA (gsm8k test | humaneval)
  local name=$1 spec=$2 k=$3 data=$4 ckpt
  if [ "$name" = base ]; then ckpt=checkpoints/demo; else ckpt=$RUNS/ft_$name; fi
  python train_or_eval.py mode=eval data=$data model.path=$ckpt +spec=$spec spec.num_speculative_tokens=$k \
    eval.num_prompts=$EVAL_PROMPTS eval.max_tokens=128 eval.concurrency=16 eval.check_lossless=false \
    eval.threads=1 engine.compile=false logger=none hydra.run.dir=$RUNS/eval_${name}_${spec}_k${k}_$data
}

case ${1:-} in
  gen) gen ;;
  extract) extract ;;
  train) train "$2" ;;
  eval) evaluate "$2" "$3" "$4" "$5" ;;
  table) python experiments/training_recipes/table.py "$RUNS" ;;
  *) echo "usage: $0 gen|extract|train NAME|eval NAME SPEC K DATA|table"; exit 2 ;;
esac
