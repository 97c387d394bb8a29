"""The micro-benchmark timers the experiment scripts share (experiments/step_costs/batch64_window,
verify_window, lean_step/prefetch): put tools/ on sys.path, then `from timing import bench` (or
`quartiles`)."""
import statistics
import time


def bench(f, n: int = 100, warmup: int = 10) -> float:
    """Median µs of n calls of f() after `warmup` untimed ones, rounded to 0.1."""
    for _ in range(warmup):
        f()
    ts = []
    for _ in range(n):
        t = time.perf_counter()
        f()
        ts.append(time.perf_counter() - t)
    ts.sort()
    return round(1e6 * ts[len(ts) // 2], 1)


def quartiles(f, n: int = 30, warmup: int = 3, before=None) -> tuple[float, float, float]:
    """(q1, median, q3) ms of n calls of f() after `warmup` untimed ones; before() (untimed) runs
    before each timed call, e.g. to evict the caches."""
    for _ in range(warmup):
        f()
    ts = []
    for _ in range(n):
        if before is not None:
            before()
        t = time.perf_counter()
        f()
        ts.append(1e3 * (time.perf_counter() - t))
    q1, q2, q3 = statistics.quantiles(ts, n=4)
    return q1, q2, q3
