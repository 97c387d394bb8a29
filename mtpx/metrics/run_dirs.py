"""Eval run directories for the dashboard and sweep tables: reading one (`load_run`: metrics.json,
.hydra/config.yaml and overrides.yaml) into a `Run`, naming runs apart (`load_runs`), what a run
ran on (`run_data`, `run_mode`, `mixed_runs_warning`), its one-line identity for figure titles
(`run_identity`, `provenance`), and the shapes of its analytics the figures and tables read
(`bucket_rows`, `buckets_have_data`, `categories_with_data`; mtpx.metrics.analytics).
"""
from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class RunDirError(ValueError):
    """A run directory that cannot be read (no metrics.json, unreadable JSON); one-line message."""


@dataclass
class Run:
    """One eval run directory.

    Attributes:
        path: the run directory.
        name: display name (`--names`, else from the spec method and k, e.g. "mtp8", "mtp1 k=3",
            "no spec"; made unique by `load_runs`).
        metrics: metrics.json.
        method: the spec method ("mtp1", "mtp8"), None without speculation.
        k: num_speculative_tokens: len(per_position_acceptance) when the run has it, else the
            config's spec.num_speculative_tokens, else 0.
        config: .hydra/config.yaml as a dict (None when absent).
        overrides: .hydra/overrides.yaml (None when absent).
    """

    path: Path
    name: str
    metrics: dict
    method: str | None
    k: int
    config: dict | None = None
    overrides: list[str] | None = None

    @property
    def analytics(self) -> dict | None:
        return self.metrics.get("analytics") or None

    @property
    def is_spec(self) -> bool:
        return self.k > 0


def read_yaml(path: Path) -> Any:
    import yaml

    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return None


def read_metrics(run_dir: Path) -> dict:
    file = run_dir / "metrics.json"
    if not run_dir.is_dir():
        raise RunDirError(f"{run_dir} is not a directory: pass run directories written by mode=eval")
    if not file.is_file():
        raise RunDirError(f"{file} not found: pass run directories written by mode=eval "
                          "(python train_or_eval.py [+spec=...]), after the run has finished")
    try:
        metrics = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise RunDirError(f"{file} is not readable JSON ({err}): rerun the eval") from err
    if not isinstance(metrics, dict):
        raise RunDirError(f"{file} holds a {type(metrics).__name__}, not a metrics object: rerun the eval")
    return metrics


def _default_name(method: str | None, k: int, config: dict | None) -> str:
    if not k:
        return "no spec"
    spec = (config or {}).get("spec") or {}
    name = method or "spec"
    if not ((method == "mtp1" and k == 1) or (method == "mtp8" and k == 8)):
        name += f" k={k}"
    if spec.get("verify") == "block":
        name += " block"
    return name


def load_run(run_dir: str | os.PathLike, name: str | None = None) -> Run:
    """Read one eval run directory (metrics.json, and .hydra/config.yaml and overrides.yaml when
    present). Raises RunDirError with a one-line message when metrics.json is missing or unreadable."""
    path = Path(run_dir)
    metrics = read_metrics(path)
    config = read_yaml(path / ".hydra" / "config.yaml")
    config = config if isinstance(config, dict) else None
    overrides = read_yaml(path / ".hydra" / "overrides.yaml")
    overrides = [str(o) for o in overrides] if isinstance(overrides, list) else None
    spec = (config or {}).get("spec") or {}
    k = len(metrics.get("per_position_acceptance") or [])
    if not k and isinstance(spec.get("num_speculative_tokens"), int) and metrics.get("num_drafts"):
        k = spec["num_speculative_tokens"]
    method = spec.get("method") if k else None
    return Run(path, name or _default_name(method, k, config), metrics, method, k, config, overrides)


def load_runs(run_dirs: Sequence[str | os.PathLike], names: Sequence[str] | None = None) -> list[Run]:
    """`load_run` for each directory; default names that collide get the directory name appended.

    Raises:
        RunDirError: a directory without a readable metrics.json.
        ValueError: `names` given with a different length, or with duplicates.
    """
    if names is not None:
        if len(names) != len(run_dirs):
            raise ValueError(f"{len(names)} names for {len(run_dirs)} run directories: give one name per run")
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate run names in {list(names)}: give each run its own name")
    runs = [load_run(d, None if names is None else names[i]) for i, d in enumerate(run_dirs)]
    if names is None:
        for run in runs:
            if sum(r.name == run.name for r in runs) > 1:
                run.name = f"{run.name} ({run.path.name})"
        seen: dict[str, int] = {}
        for run in runs:
            n = seen[run.name] = seen.get(run.name, 0) + 1
            if n > 1:
                run.name = f"{run.name} #{n}"
    return runs


def run_data(run: Run) -> str | None:
    """The run's data set: metrics.json["run"]["data"], else .hydra/config.yaml's data.name."""
    return (run.metrics.get("run") or {}).get("data") or ((run.config or {}).get("data") or {}).get("name")


def run_mode(run: Run) -> str | None:
    return (run.metrics.get("run") or {}).get("mode") or (run.config or {}).get("mode")


def mixed_runs_warning(runs: Sequence[Run]) -> str | None:
    """A line when the runs mix data sets or modes (eval and bench clients differ in concurrency
    and prompt count), whose throughput and acceptance do not compare; None otherwise."""
    parts = []
    for what, values in (("data sets", {run_data(r) for r in runs}), ("modes", {run_mode(r) for r in runs})):
        known = sorted(v for v in values if v)
        if len(known) > 1:
            parts.append(f"{what} ({', '.join(known)})")
    if not parts:
        return None
    return f"warning: these runs mix {' and '.join(parts)}: their throughput and acceptance do not compare"


def run_identity(metrics: dict) -> str:
    """'MODEL · SPEC k=K · DATA · N prompts · DATE · commit C' from metrics["run"]
    (mtpx.evaluate), for figure titles; the date (UTC, to the minute) and the commit's first 9
    hex digits ("+dirty" kept) when recorded; '' for a metrics dict without "run" (an older
    metrics.json)."""
    r = metrics.get("run") or {}
    if not r:
        return ""
    spec = f"{r['spec']} k={r['num_speculative_tokens']}" if r.get("spec") else "plain decoding"
    partial = " (interrupted)" if metrics.get("partial") else ""
    return (f"{Path(str(r.get('model', ''))).name} · {spec} · {r.get('data')} · {r.get('num_prompts')} "
            f"prompts{partial}{provenance(r.get('date'), r.get('commit'))}")


def provenance(date: str | None, commit: str | None) -> str:
    """' · 2026-12-03 16:40 UTC · commit 04292ad1f' (the parts that are known), for figure titles.
    date: ISO 8601 in UTC (mtpx.io.utc_now); commit: mtpx.io.source_commit's."""
    parts = []
    if date:
        parts.append(f"{str(date)[:16].replace('T', ' ')} UTC")
    if commit:
        head, dirty = str(commit).partition("+")[::2]
        parts.append(f"commit {head[:9]}" + (f"+{dirty}" if dirty else ""))
    return "".join(f" · {p}" for p in parts)


def bucket_rows(buckets: dict) -> list[tuple[str, int, float | None]]:
    """(label, count, rate) for the first round, each previous-round bucket and "all"."""
    rows = [("first", buckets["first_round"]["count"], buckets["first_round"]["rate"])]
    rows += [(str(r["prev_accepted"]), r["count"], r["rate"]) for r in buckets["rows"]]
    return rows


def buckets_have_data(buckets: dict | None) -> bool:
    return bool(buckets) and any(count for _, count, _ in bucket_rows(buckets))


def categories_with_data(metrics: dict) -> dict[str, dict]:
    """Every category of the run, those whose requests all failed (no drafts) included: the bar
    chart marks them instead of leaving them out."""
    return dict(((metrics.get("analytics") or {}).get("by_category")) or {})
