"""The cost curve of automatic k over k (scheduler side, no torch): smoothing the calibrated step
costs (mtpx/core/draft_length.py's module doc) and the small fits it uses."""
from __future__ import annotations

__all__ = ["smooth_step_costs"]


def smooth_step_costs(values: list[float]) -> list[float]:
    """Calibrated step ms for k = 0 .. max_k -> the model's costs (module doc): k = 0 as measured
    (no window, no draft loop); for k >= 1, with 4 or more of them, the least-squares quadratic in
    k (the window grows linearly in k, and the draft loop's k modules each re-prefill up to k + 1
    positions), so that one noisy k cannot look cheaper than its neighbours, at least k = 0's;
    then non-decreasing (module doc)."""
    if len(values) - 1 >= 4:
        a, b, c = _quadratic_fit(list(range(1, len(values))), values[1:])
        # a step with drafts never costs less than one without (a fit to noise can dip below it)
        values = [values[0]] + [max(values[0], a + b * k + c * k * k) for k in range(1, len(values))]
    return _non_decreasing(values)


def _quadratic_fit(xs: list[float], ys: list[float]) -> tuple[float, float, float]:
    """Least-squares (a, b, c) of y = a + b x + c x^2: the normal equations solved by Cramer's rule
    in Python floats, so the same costs always give the same fit (a BLAS least-squares solve gave
    results differing in the last bits between calls, and a cost file reloaded then differed from
    the costs it was saved from)."""
    s = [sum(x ** p for x in xs) for p in range(5)]                     # sum x^0 .. x^4
    t = [sum(y * x ** p for x, y in zip(xs, ys)) for p in range(3)]     # sum y x^0 .. y x^2
    m = [[s[0], s[1], s[2]], [s[1], s[2], s[3]], [s[2], s[3], s[4]]]

    def det(a):
        return (a[0][0] * (a[1][1] * a[2][2] - a[1][2] * a[2][1])
                - a[0][1] * (a[1][0] * a[2][2] - a[1][2] * a[2][0])
                + a[0][2] * (a[1][0] * a[2][1] - a[1][1] * a[2][0]))

    d = det(m)
    return tuple(det([[t[r] if col == i else m[r][col] for col in range(3)] for r in range(3)]) / d
                 for i in range(3))


def _non_decreasing(values: list[float]) -> list[float]:
    """The least-squares non-decreasing fit of values (pool adjacent violators)."""
    blocks: list[list[float]] = []                 # [sum, count]
    for v in values:
        blocks.append([v, 1])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            s, n = blocks.pop()
            blocks[-1][0] += s
            blocks[-1][1] += n
    return [s / n for s, n in blocks for _ in range(n)]


def _interpolate(known: list[tuple[int, float]], k: int, default: float) -> float:
    """The ratio at k from [(k, ratio)] sorted by k: linear between two, the nearest's beyond
    them, default without any."""
    if not known:
        return default
    if k <= known[0][0]:
        return known[0][1]
    for (k0, r0), (k1, r1) in zip(known, known[1:]):
        if k <= k1:
            return r0 + (r1 - r0) * (k - k0) / (k1 - k0)
    return known[-1][1]
