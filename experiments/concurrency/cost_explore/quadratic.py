"""tools/bench_speedup.py with automatic k's calibration smoothed as before commit 19d1ddc (the
least-squares quadratic over k >= 1, then non-decreasing; `git show 0914245:mtpx/core/cost_curve.py`,
copied here) and everything else as committed, cost exploring included: separates the smoothing
from cost exploring.

    MTPX_DATA_DIR=../shared/data python experiments/concurrency/cost_explore/quadratic.py --concurrency 4 ...
"""
import runpy
import sys
from pathlib import Path

from mtpx.core import cost_curve, draft_length

ROOT = Path(__file__).resolve().parents[3]


def quadratic_smoothing(values: list[float]) -> list[float]:
    """0914245's smooth_step_costs: k = 0 as measured; for k >= 1 (4 or more of them) the
    least-squares quadratic in k, at least k = 0's cost; then non-decreasing."""
    if len(values) - 1 >= 4:
        a, b, c = _quadratic_fit(list(range(1, len(values))), values[1:])
        values = [values[0]] + [max(values[0], a + b * k + c * k * k) for k in range(1, len(values))]
    return cost_curve._non_decreasing(values)


def _quadratic_fit(xs, ys):
    s = [sum(x ** p for x in xs) for p in range(5)]
    t = [sum(y * x ** p for x, y in zip(xs, ys)) for p in range(3)]
    m = [[s[0], s[1], s[2]], [s[1], s[2], s[3]], [s[2], s[3], s[4]]]

    def det(a):
        return (a[0][0] * (a[1][1] * a[2][2] - a[1][2] * a[2][1])
                - a[0][1] * (a[1][0] * a[2][2] - a[1][2] * a[2][0])
                + a[0][2] * (a[1][0] * a[2][1] - a[1][1] * a[2][0]))

    d = det(m)
    return tuple(det([[t[r] if col == i else m[r][col] for col in range(3)] for r in range(3)]) / d
                 for i in range(3))


draft_length.smooth_step_costs = quadratic_smoothing
sys.argv = [str(ROOT / "tools" / "bench_speedup.py")] + sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
