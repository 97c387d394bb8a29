"""The micro-benchmark timer the experiment scripts share (batch64_window, verify_window):
`sys.path.insert(0, str(Path(__file__).resolve().parents[1]))`, then `from timing import bench`."""
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
