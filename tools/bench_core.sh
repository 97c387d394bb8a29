#!/bin/bash
# Run a benchmark on one reserved core at real-time priority, one benchmark at a time.
#   tools/bench_core.sh <command ...>      (BENCH_CPU, default 1; BENCH_LOCK, default /tmp/mtpx_bench.lock)
# One thread (OMP_NUM_THREADS=1), pinned with taskset, SCHED_FIFO 10 (needs root or CAP_SYS_NICE). Leave
# /proc/sys/kernel/sched_rt_runtime_us below its period (950000-980000, not -1): unthrottled, a real-time
# task starves the core's kernel workers, and a process exiting there (tools/bench_speedup.py --isolate's
# workers) then spins in the kernel for good. A second call waits for the lock, so benchmarks never
# overlap. Keep other work off BENCH_CPU.
cpu=${BENCH_CPU:-1}
exec 9>"${BENCH_LOCK:-/tmp/mtpx_bench.lock}"
if ! flock -n 9; then echo "bench_core: waiting for CPU $cpu..." >&2; flock 9; fi
echo "bench_core: start $(date +%T) on CPU $cpu (SCHED_FIFO 10, OMP_NUM_THREADS=1)" >&2
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
chrt -f 10 taskset -c "$cpu" "$@"
rc=$?
echo "bench_core: end $(date +%T) rc=$rc" >&2
exit $rc
