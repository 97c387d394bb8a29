"""Speed against quality for a sweep over acceptance rules (docs/acceptance_rules.md): the sweep
table's quality columns (mtpx/metrics/sweep.py) and a Pareto figure, pareto.png, drawn with the
dashboard's figure helpers. Each point is one job: x its speed-up over the lossless rule measured in
the same run (metrics.json speedup_vs_lossless; the lossless job itself is x = 1, loss 0), y a
quality loss with its 95% interval as an error bar; the non-dominated points (faster, or losing
less) are joined."""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from mtpx.metrics.dashboard import _figure, _save
from mtpx.metrics.report import DASH

# (panel title, loss key in metrics["quality"], its interval key or None)
PANELS = (("log-likelihood per token lost (nats)", "log_likelihood_loss", "log_likelihood_loss_interval"),
          ("requests differing from the lossless rule", "differing_share", None),
          ("task accuracy lost", "accuracy_loss", "accuracy_loss_interval"),
          ("TV distance above its noise floor", "tv_distance_loss", "tv_distance_loss_interval"))


def _fmt(value, spec: str) -> str | None:
    return None if value is None else format(value, spec)


def _quality(m: dict, key: str, spec: str, interval: str | None = None) -> str | None:
    q = m.get("quality") if isinstance(m.get("quality"), dict) else {}
    text = _fmt(q.get(key), spec)
    ci = q.get(interval) if interval else None
    return text if text is None or not ci else f"{text} [{ci[0]:{spec}}, {ci[1]:{spec}}]"


def _mean(m: dict, key: str) -> float:
    """The mean of m[key + "_runs"] (eval.speed_repeats passes), else m[key]."""
    runs = m.get(key + "_runs")
    return sum(runs) / len(runs) if runs else m[key]


def _speedup(m: dict) -> str | None:
    """"1.234" or, with repeated passes, "1.234 (1.20-1.26)": the ratio of the mean tok/s and the
    range of the per-pair ratios."""
    text, runs = _fmt(m.get("speedup_vs_lossless"), ".3f"), m.get("speedup_vs_lossless_runs") or []
    runs = [r for r in runs if r is not None]
    return text if text is None or len(runs) < 2 else f"{text} ({min(runs):.2f}-{max(runs):.2f})"


def _lossy_columns(labels: dict[str, str], pct: str, ll: str) -> tuple:
    """The quality columns both tables show, (label, formatter) in one order: `labels` maps each
    column's key to its label (keys absent are left out); `pct` formats shares, `ll` the
    log-likelihood loss."""
    formatters = {
        "throughput": lambda m: None if m.get("lossless_output_throughput") is None
        else f"{_mean(m, 'output_throughput'):.1f}, {m['lossless_output_throughput']:.1f}",
        "speedup": _speedup,
        "identical": lambda m: _quality(m, "identical_share", pct),
        "first_difference": lambda m: _quality(m, "mean_first_difference", ".1f"),
        "ll_loss": lambda m: _quality(m, "log_likelihood_loss", ll, "log_likelihood_loss_interval"),
        "accuracy": lambda m: None if _quality(m, "accuracy", pct) is None
        else f"{_quality(m, 'accuracy', pct)}, {_quality(m, 'accuracy_lossless', pct)}",
        "accuracy_loss": lambda m: _quality(m, "accuracy_loss", ".3f", "accuracy_loss_interval"),
        "tv": lambda m: None if _quality(m, "tv_distance", ".3f") is None
        else f"{_quality(m, 'tv_distance', '.3f')} ({_quality(m, 'tv_distance_floor', '.3f')})",
        "tv_loss": lambda m: _quality(m, "tv_distance_loss", ".3f", "tv_distance_loss_interval"),
    }
    return tuple((label, formatters[key]) for key, label in labels.items())


QUALITY_COLUMNS = (
    ("Acceptance rule", lambda m: m.get("acceptance") or ("lossless" if m.get("quality") is None else None)),
    ("Speed-up vs lossless", _speedup),
    ("Lossless acceptance length", lambda m: _fmt(m.get("lossless_acceptance_length"), ".2f")),
    *_lossy_columns({"throughput": "Mean tok/s: rule, lossless", "identical": "Identical (%)",
                     "ll_loss": "Log-likelihood loss [95% CI]", "accuracy": "Accuracy, lossless",
                     "accuracy_loss": "Accuracy loss [95% CI]", "tv": "TV (floor)",
                     "tv_loss": "TV loss [95% CI]"}, pct=".1%", ll=".4f"),
)
"""The sweep table's extra columns when a job ran a lossy rule (mtpx.metrics.sweep.sweep_table)."""


def has_quality(metrics_list: Sequence[dict | None]) -> bool:
    """Whether any job measured a lossy rule's quality."""
    return any(isinstance((m or {}).get("quality"), dict) for m in metrics_list)


def pareto_front(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the non-dominated points (x higher is better, y lower is better), by x: a point
    is dominated when another is at least as fast and loses no more, and is better in one."""
    front = [i for i, (x, y) in enumerate(points)
             if not any((x2 >= x and y2 <= y) and (x2 > x or y2 < y) for x2, y2 in points)]
    return sorted(front, key=lambda i: points[i][0])


def _point(m: dict, key: str, interval: str | None):
    """(speed-up, loss, (low, high) or None) of one job; the lossless rule is (1, 0); None unmeasured."""
    q = m.get("quality")
    if not isinstance(q, dict):        # the lossless rule; a lossy job stopped before its quality: none
        return (1.0, 0.0, None) if m.get("output_throughput") is not None and not m.get("lossy") else None
    if q.get(key) is None or m.get("speedup_vs_lossless") is None:
        return None
    return m["speedup_vs_lossless"], q[key], (q.get(interval) if interval else None)


def write_pareto_figure(labels: Sequence[str], metrics_list: Sequence[dict], path: str | Path) -> Path | None:
    """pareto.png: one panel per quality loss any job measured (PANELS); None when none did."""
    panels = [p for p in PANELS if any(_point(m, p[1], p[2]) and isinstance(m.get("quality"), dict)
                                       for m in metrics_list)]
    if not panels:
        return None
    fig, axes = _figure(5.0 * len(panels), 4.2, len(panels))
    for ax, (title, key, interval) in zip(axes, panels):
        pts = [(label, _point(m, key, interval)) for label, m in zip(labels, metrics_list)]
        pts = [(label, p) for label, p in pts if p is not None]
        if not any(x == 1.0 and y == 0.0 for _, (x, y, _) in pts):
            pts.append(("lossless", (1.0, 0.0, None)))      # every job's own reference, by definition
        for label, (x, y, ci) in pts:
            err = None if not ci else [[y - ci[0]], [ci[1] - y]]
            ax.errorbar([x], [y], yerr=err, fmt="o", capsize=3)
            ax.annotate(label, (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
        front = pareto_front([(x, y) for _, (x, y, _) in pts])
        ax.plot([pts[i][1][0] for i in front], [pts[i][1][1] for i in front], "k--", lw=0.8,
                label="Pareto front")
        ax.axhline(0.0, color="grey", lw=0.6)
        ax.set_xlabel("speed-up over the lossless rule (same run)")
        ax.set_ylabel(title)
        ax.legend(fontsize=7)
    fig.suptitle("Acceptance rules: speed against quality (95% intervals)")
    return _save(fig, Path(path))


SHORT = {"posterior_threshold": "eps", "posterior_alpha": "delta", "relaxed_topk": "N",
         "relaxed_delta": "delta", "lenient_lambda": "lambda", "cascade_alpha": "alpha",
         "synthetic_acceptance_rates": "rates"}


def job_label(overrides: dict[str, str], varying: Sequence[str]) -> str:
    """A point's label: the varying overrides, shortened ("spec.relaxed_topk=3" -> "N=3")."""
    def name(key: str) -> str:
        last = key.split(".")[-1]
        return SHORT.get(last, last)
    return " ".join(f"{name(k)}={overrides.get(k, DASH)}" for k in varying) or "job"


def rule_label(acceptance: str | None) -> str:
    """"relaxed N=2 delta=0.05" from metrics.json's "relaxed (relaxed_topk=2, relaxed_delta=0.05)"."""
    if not acceptance:
        return "lossless"
    name, _, keys = acceptance.partition(" (")
    parts = [kv.split("=", 1) for kv in keys.rstrip(")").split(", ") if "=" in kv]
    return " ".join([name] + [f"{SHORT.get(k, k)}={v}" for k, v in parts])


RULE_COLUMNS = (
    ("acceptance length: rule, lossless", lambda m: f"{m['acceptance_length']:.2f}, "
     f"{_fmt(m.get('lossless_acceptance_length'), '.2f') or DASH}"),
    *_lossy_columns({"throughput": "tok/s: rule, lossless", "speedup": "speed-up (pairs)",
                     "identical": "identical", "first_difference": "first difference",
                     "ll_loss": "LL loss [95% CI]", "accuracy": "accuracy: rule, lossless",
                     "accuracy_loss": "accuracy loss [95% CI]", "tv": "TV (floor)",
                     "tv_loss": "TV loss [95% CI]"}, pct=".0%", ll=".3f"),
)
"""The compact table of tools/sweep_table.py --rules: one row per lossy job, across sweeps."""


def rules_table(metrics_list: Sequence[dict]) -> str:
    """A markdown table, one row per job that measured a lossy rule's quality (RULE_COLUMNS),
    labelled by rule_label, in the given order."""
    rows = [["setting", *(name for name, _ in RULE_COLUMNS)], ["---"] + ["---:"] * len(RULE_COLUMNS)]
    rows += [[rule_label(m.get("acceptance")), *((fn(m) or DASH) for _, fn in RULE_COLUMNS)]
             for m in metrics_list if isinstance(m.get("quality"), dict)]
    return "".join("| " + " | ".join(str(c) for c in r) + " |\n" for r in rows)
