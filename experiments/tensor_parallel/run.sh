#!/bin/bash
# Tensor parallelism on the CPU (docs/tensor_parallel.md): TP=2 (two processes, one thread each,
# gloo) against TP=1 (one process, one thread) on the demo checkpoint, GSM8K test, greedy, at
# most 256 tokens, eager (engine.compile=false) unless COMPILE=true (the compiled runs at the end).
#   concurrency 64: the first 32 prompts (tokens compared request by request, tok/s)
#   concurrency 1:  the first 4 prompts (tok/s)
# Every run writes runs/<name>/{metrics.json,outputs.jsonl}; compare.py prints the tables.
# Compiled graphs and automatic k's step costs are cached under $MTPX_CACHE_DIR (default
# ~/.cache/mtpx): give a fresh folder for cold builds, as the runs here had.
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
# the rest of the matrix at concurrency 64: prefix caching on (eager: plain, mtp1, mtp8 auto);
# compiled with prefix caching on (plain, mtp1, mtp8, mtp8 auto) and off (plain, mtp1, mtp8 auto)
P=engine.enable_prefix_caching=true
A=spec.num_speculative_tokens=auto
for tp in 1 2; do run plain_prefix_tp${tp}_c64 $tp plain 64 32 $P; done
for tp in 1 2; do run mtp1_prefix_tp${tp}_c64 $tp mtp1 64 32 $P; done
for tp in 1 2; do run mtp8_auto_prefix_tp${tp}_c64 $tp mtp8 64 32 $A $P; done
for spec in plain mtp1 mtp8; do
  for tp in 1 2; do COMPILE=true run ${spec}_compiled_prefix_tp${tp}_c64 $tp $spec 64 32 $P; done
done
for tp in 1 2; do COMPILE=true run mtp8_auto_compiled_prefix_tp${tp}_c64 $tp mtp8 64 32 $A $P; done
for spec in plain mtp1; do
  for tp in 1 2; do COMPILE=true run ${spec}_compiled_tp${tp}_c64 $tp $spec 64 32; done
done
for tp in 1 2; do COMPILE=true run mtp8_auto_compiled_tp${tp}_c64 $tp mtp8 64 32 $A; done
# prefix caching with hits: the zero-shot prompts share under one 16-token block, so the runs
# above never hit the cache; with data.num_fewshot=2 every prompt starts with the same two solved
# examples (plain TP=1 eager without prefix caching is the reference for these prompts)
F=data.num_fewshot=2
run plain_fewshot_tp1_c64 1 plain 64 32 $F
for tp in 1 2; do run mtp8_fewshot_prefix_tp${tp}_c64 $tp mtp8 64 32 $F $P; done
for tp in 1 2; do COMPILE=true run mtp8_compiled_fewshot_prefix_tp${tp}_c64 $tp mtp8 64 32 $F $P; done
python experiments/tensor_parallel/compare.py > experiments/tensor_parallel/results.md
