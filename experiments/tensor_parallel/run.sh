#!/bin/bash
# Tensor parallelism on the CPU (docs/tensor_parallel.md): TP=2 (two processes, one thread each,
# gloo) against TP=1 (one process, one thread) on the demo checkpoint, GSM8K test, greedy, at
# most 256 tokens, eager (engine.compile=false) except the last pair of runs.
#   concurrency 64: the first 32 prompts (tokens compared request by request, tok/s)
#   concurrency 1:  the first 4 prompts (tok/s)
# Every run writes runs/<name>/{metrics.json,outputs.jsonl}; compare.py prints the tables.
set -e
cd "$(dirname "$0")/../.."
OUT=experiments/tensor_parallel/runs
export OMP_NUM_THREADS=1 PYTHONPATH=$PWD
run() {  # name tp spec concurrency num_prompts [extra overrides]
  local name=$1 tp=$2 spec=$3 conc=$4 n=$5; shift 5
  local specarg=(); [ "$spec" != plain ] && specarg=(+spec=$spec)
  python train_or_eval.py mode=eval "${specarg[@]}" data=gsm8k eval.num_prompts=$n eval.max_tokens=256 \
    eval.concurrency=$conc eval.threads=1 eval.check_lossless=false engine.compile=${COMPILE:-false} \
    engine.tensor_parallel_size=$tp logger=none hydra.run.dir=$OUT/$name "$@" > /dev/null
  rm -f $OUT/$name/*.png
  echo "$name done"
}
for spec in plain mtp1 mtp8; do
  for tp in 1 2; do
    run ${spec}_tp${tp}_c64 $tp $spec 64 32
    run ${spec}_tp${tp}_c1 $tp $spec 1 4
  done
done
# prefix caching on, multi-module MTP
for tp in 1 2; do run mtp8_prefix_tp${tp}_c64 $tp mtp8 64 32 engine.enable_prefix_caching=true; done
python experiments/tensor_parallel/memory.py > experiments/tensor_parallel/memory.txt
python experiments/tensor_parallel/compare.py > experiments/tensor_parallel/results.md
# automatic k (start-up calibration of the step costs runs on both ranks), multi-module MTP
for tp in 1 2; do run mtp8_auto_tp${tp}_c64 $tp mtp8 64 32 spec.num_speculative_tokens=auto; done
python experiments/tensor_parallel/compare.py > experiments/tensor_parallel/results.md
# compiled (engine.compile=true, Inductor, layer regions), multi-module MTP
for tp in 1 2; do COMPILE=true run mtp8_compiled_tp${tp}_c64 $tp mtp8 64 32; done
python experiments/tensor_parallel/compare.py > experiments/tensor_parallel/results.md
