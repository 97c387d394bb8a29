#!/usr/bin/env bash
# Issue 37, automatic k: a held depth alone does not raise the k in use, and a depth never
# measured prices its draft round per module of the measured ones (mtpx/core/draft_length.py
# `_rises`, mtpx/core/cost_learning.py `draft_cost`). The issue's settings: GSM8K test, 128
# prompts, greedy, 128 tokens, 1 thread, the contenders side by side in one process per
# (concurrency, mode), 4 chunks alternated (before_warmup_reset: 2 chunks, commit 9fa009a).
# usage: bash experiments/concurrency/held_rise/run.sh [STAGES...]   (c4 c4c c16c c16 c1 c1c c64old c1old k7 floor c64 c64c; default: all)
set -x
cd "$(dirname "$0")/../../.."
export OMP_NUM_THREADS=1
export MTPX_DATA_DIR=${MTPX_DATA_DIR:-$(cd .. && pwd)/shared/data}
OUT=experiments/concurrency/held_rise
mkdir -p $OUT
lscpu | grep 'Model name' > $OUT/machine.txt
grep -o 'avx[^ ]*' /proc/cpuinfo | sort -u | tr '\n' ' ' >> $OUT/machine.txt
A="--max-tokens 128 --threads 1 --num-prompts 128"
B="python tools/bench_speedup.py"
stage() { [ -z "$STAGES" ] || [[ " $STAGES " == *" $1 "* ]]; }
STAGES="$*"
# 4 chunks of 32 prompts, but 2 of 64 at concurrency 64 (a chunk of 32 never fills a batch of 64)
run() { name=$1; shift; $B "$@" $A --out $OUT/$name > $OUT/$name.log 2>&1; date >> $OUT/$name.log; }
stage c4 && run eager_c4 --concurrency 4 --rounds 4 --contenders plain mtp4 mtp8 auto
stage c4c && run compiled_c4 --compile --concurrency 4 --rounds 4 --contenders plain mtp4 mtp8 auto
stage c16c && run compiled_c16 --compile --concurrency 16 --rounds 4 --contenders plain mtp4 auto
stage c16 && run eager_c16 --concurrency 16 --rounds 4 --contenders plain mtp4 auto
stage c1 && run eager_c1 --concurrency 1 --rounds 4 --contenders plain mtp4 mtp8 auto
stage c1c && run compiled_c1 --compile --concurrency 1 --rounds 4 --contenders plain mtp4 mtp8 auto
# c64old, c1old: the issue's commit (08e9920, its "today", in a worktree) alternated with this
# code (its contenders and auto), then the issue's commit again; eager, 2 chunks of 64
old() {  # old NAME ARGS...: tools/bench_speedup.py of the issue's commit
  [ -d /tmp/mtpx_08e9920 ] || git worktree add --detach /tmp/mtpx_08e9920 08e9920
  local name=$1; shift
  (cd /tmp/mtpx_08e9920 && python tools/bench_speedup.py "$@" $A --out $OLDPWD/$OUT/$name) > $OUT/$name.log 2>&1
}
vs_issue() {  # vs_issue CONCURRENCY CONTENDERS...
  local c=$1; shift
  old before_08e9920_c${c}_1 --concurrency $c --rounds 2 --contenders "$@"
  run after_c$c --concurrency $c --rounds 2 --contenders "$@" auto
  old before_08e9920_c${c}_2 --concurrency $c --rounds 2 --contenders "$@"
}
stage c64old && vs_issue 64 plain mtp4
stage c1old && vs_issue 1 plain mtp8
# k7: fixed k = 6, 7 and 8 engines' steps at concurrency 1 (is a k = 7 step dearer than k = 8's?)
stage k7 && $B --concurrency 1 --num-prompts 16 --rounds 2 --max-tokens 128 --threads 1 --contenders plain mtp6 mtp7 mtp8 --out $OUT/fixed_k_c1 > $OUT/fixed_k_c1.log 2>&1
# floor: the batch-64 step against one matmul of its FLOPs (tools/bench_floor.py), eager and compiled
if stage floor; then
  F="--batch-sizes 64 --cases plain mtp8:4 --threads 1 --pairs 10"
  python tools/bench_floor.py $F --out $OUT/floor_eager.json > $OUT/floor_eager.txt 2>&1
  python tools/bench_floor.py $F --compile --out $OUT/floor_compiled.json > $OUT/floor_compiled.txt 2>&1
fi
stage c64 && run eager_c64 --concurrency 64 --rounds 2 --contenders plain mtp1 mtp4 auto
stage c64c && run compiled_c64 --compile --concurrency 64 --rounds 2 --contenders plain mtp1 mtp4 auto
true
