#!/usr/bin/env bash
# Automatic k with probes that measure their k (cost_explore): concurrency 16 and 64, eager, 1
# thread, GSM8K test, the contenders side by side in one process per concurrency. Run from the
# repository root with nothing else running; the step-cost calibrations come from the cache
# ($MTPX_CACHE_DIR/step_costs, the same files as ../explore's runs loaded).
set -euo pipefail
OUT=experiments/concurrency/cost_explore
export MTPX_DATA_DIR=${MTPX_DATA_DIR:-../shared/data}
(lscpu | grep -E 'Model name|^CPU\(s\)'; grep -o -E 'avx[^ ]*|amx[^ ]*' /proc/cpuinfo | sort -u | tr '\n' ' '; echo; git rev-parse HEAD) > $OUT/machine.txt
python tools/bench_speedup.py --concurrency 64 --rounds 2 --max-tokens 128 --num-prompts 128 --threads 1 \
    --contenders plain mtp1 mtp4 auto --out $OUT/c64 2>&1 | tee $OUT/c64.log
python tools/bench_speedup.py --concurrency 16 --rounds 2 --max-tokens 128 --num-prompts 128 --threads 1 \
    --contenders plain mtp1 mtp4 auto --out $OUT/c16 2>&1 | tee $OUT/c16.log
