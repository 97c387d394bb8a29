#!/usr/bin/env bash
# The recipe table of issue 70 on the demo (frozen target): self-distilled data, the target's
# hidden states extracted once (mode=extract), then each recipe's heads trained from the shards,
# and acceptance on held-out GSM8K test and HumanEval prompts (greedy, eager; acceptance does not
# depend on timing).
# Usage: bash experiments/training_recipes/run.sh STEP, STEP one of gen | gen_code | extract |
#        extract_mix | extract_mix2 | train NAME | eval NAME SPEC K DATA | mixed | table
# `mixed` is the recommended recipe in one command: the target's answers to GSM8K and code prompts,
# extracted as two sources, ce for STEPS steps with GSM8K rows drawn MIX_WEIGHT (3) times as often
# as code rows, evaluated on GSM8K test and HumanEval:
#   RUNS=/tmp/recipes STEPS=300 TAG=_s300 bash experiments/training_recipes/run.sh mixed
# Outputs under $RUNS (default /tmp/mtpx_recipes3), outside the repository; every step resumes.
# RANKS=1 runs gen / gen_code / extract in one process (no torchrun).
set -euo pipefail
cd "$(dirname "$0")/../.."
export MTPX_DATA_DIR=${MTPX_DATA_DIR:-/work/shared/data} OMP_NUM_THREADS=1
RUNS=${RUNS:-/tmp/mtpx_recipes3}
DISTILL=$RUNS/distill            # the target's answers to GSM8K-train questions
DISTILL_CODE=$RUNS/distill_code  # its continuations of stdlib code (not the held-out modules)
SHARDS=$RUNS/shards              # hidden states on the GSM8K answers
SHARDS_MIX=$RUNS/shards_mix      # on GSM8K + code answers, one source (mixed by tokens)
SHARDS_MIX2=$RUNS/shards_mix2    # on GSM8K + code answers, two sources (distill.0, distill.1)
NUM_PROMPTS=${NUM_PROMPTS:-1536}  # distilled GSM8K-train questions
NUM_CODE=${NUM_CODE:-1536}        # distilled code prompts
RANKS=${RANKS:-2}
STEPS=${STEPS:-36}
LR=${LR:-1e-3}
EVAL_PROMPTS=${EVAL_PROMPTS:-32}
SAVE_EVERY=${SAVE_EVERY:-12}
TAG=${TAG:-}  # train NAME writes $RUNS/ft_NAME$TAG (evaluate it as NAME$TAG)

launch() {  # PORT ARGS...: one process, or RANKS ranks under torchrun
  local port=$1; shift
  if [ "$RANKS" = 1 ]; then python "$@"; else torchrun --nproc_per_node=$RANKS --master_port=$port "$@"; fi
}

gen() {  # the target's greedy answers (at most 128 tokens) to the first NUM_PROMPTS GSM8K-train questions
  launch 29611 train_or_eval.py mode=distill data=gsm8k \
    data.path='${data_dir}/gsm8k/train.jsonl' distill.out_dir=$DISTILL distill.num_prompts=$NUM_PROMPTS \
    distill.shard_size=64 distill.max_tokens=128 distill.threads=1 engine.max_num_seqs=32 engine.compile=false \
    +spec=mtp8 logger=none hydra.run.dir=$RUNS/gen.hydra
}

gen_code() {  # its greedy continuations (at most 128 tokens) of NUM_CODE code prompts cut from the
  # stdlib files training reads (data.split=train: never the held-out modules; HumanEval is not stdlib)
  launch 29613 train_or_eval.py mode=distill data=builtin data.split=train data.prompt_tokens=128 \
    distill.out_dir=$DISTILL_CODE distill.num_prompts=$NUM_CODE distill.shard_size=64 distill.max_tokens=128 \
    distill.threads=1 engine.max_num_seqs=32 engine.compile=false +spec=mtp8 logger=none \
    hydra.run.dir=$RUNS/gen_code.hydra
}

DATA="train.data_sources=[distill] train.distill_path=$DISTILL train.seq_len=256"
DATA_MIX="train.data_sources=[distill] train.distill_path=[$DISTILL,$DISTILL_CODE] train.seq_len=256"
data_mix2() {  # W: GSM8K answers (distill.0) weighted W against code answers (distill.1)
  echo "train.data_sources=[distill.0:$1,distill.1] train.distill_path=[$DISTILL,$DISTILL_CODE] train.seq_len=256"
}
extract() {  # [mix|mix2]: the frozen target's hidden states and top-64 log-probs on the packed corpus
  local data=$DATA shards=$SHARDS tag=
  if [ "${1:-}" = mix ]; then data=$DATA_MIX shards=$SHARDS_MIX tag=_mix; fi
  if [ "${1:-}" = mix2 ]; then data=$(data_mix2 1) shards=$SHARDS_MIX2 tag=_mix2; fi
  launch 29612 train_or_eval.py mode=extract model.path=checkpoints/demo \
    $data train.hidden_states_path=$shards train.threads=1 train.batch_size=16 logger=none \
    hydra.run.dir=$RUNS/extract$tag.hydra
}

# every recipe: the demo target frozen, heads trained from the shards, STEPS steps of 16 x 256
# tokens, AdamW at LR (4 warm-up steps, cosine to LR / 10), FastMTP's step decay 0.6
# (a recipe NAME_mix trains on the GSM8K + code shards, one source mixed by tokens; NAME_mixW on the
# two-source shards, GSM8K rows drawn W times as often as code rows)
common() {
  echo "mode=train train.freeze_base=true train.hidden_states_path=$1 $2
  train.steps=$STEPS train.warmup_steps=4 train.lr=$LR train.min_lr=$(python -c "print($LR / 10)")
  train.batch_size=16 train.eval_every=0 train.save_every=$SAVE_EVERY train.eval_batches=2 train.threads=1 train.mtp_loss_decay=0.6 logger=none"
}
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
  local name=$1 extra ckpt=checkpoints/demo shards=$SHARDS data=$DATA
  local base=${name%_mix*} w=${name##*_mix}
  if [ "$base" != "$name" ] && [ -z "$w" ]; then shards=$SHARDS_MIX data=$DATA_MIX; fi
  if [ "$base" != "$name" ] && [ -n "$w" ]; then shards=$SHARDS_MIX2 data=$(data_mix2 "$w"); fi
  case $base in
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
  /usr/bin/time -f "$name train wall %e s cpu %U+%S s" python train_or_eval.py $(common $shards "$data") model.path=$ckpt $extra \
    train.out_dir=$RUNS/ft_$name$TAG hydra.run.dir=$RUNS/ft_$name$TAG.hydra
}

evaluate() {  # NAME SPEC K DATA: the first EVAL_PROMPTS prompts of DATA (gsm8k test | humaneval)
  local name=$1 spec=$2 k=$3 data=$4 ckpt
  if [ "$name" = base ]; then ckpt=checkpoints/demo; else ckpt=$RUNS/ft_$name; fi
  python train_or_eval.py mode=eval data=$data model.path=$ckpt +spec=$spec spec.num_speculative_tokens=$k \
    eval.num_prompts=$EVAL_PROMPTS eval.max_tokens=128 eval.concurrency=16 eval.check_lossless=false \
    eval.threads=1 engine.compile=false logger=none hydra.run.dir=$RUNS/eval_${name}_${spec}_k${k}_$data
}

mixed() {  # the recommended recipe: ce on GSM8K and code answers, GSM8K rows weighted MIX_WEIGHT
  # (default 3) against code rows, evaluated on both sets
  local name=ce_mix${MIX_WEIGHT:-3}
  gen; gen_code; extract mix2; train $name
  evaluate $name$TAG mtp8 8 gsm8k; evaluate $name$TAG mtp8 8 humaneval
}

case ${1:-} in
  gen) gen ;;
  gen_code) gen_code ;;
  extract) extract ;;
  extract_mix) extract mix ;;
  extract_mix2) extract mix2 ;;
  mixed) mixed ;;
  train) train "$2" ;;
  eval) evaluate "$2" "$3" "$4" "$5" ;;
  table) python experiments/training_recipes/table.py "$RUNS" ;;
  *) echo "usage: $0 gen|gen_code|extract|extract_mix|extract_mix2|train NAME|eval NAME SPEC K DATA|mixed|table"; exit 2 ;;
esac
