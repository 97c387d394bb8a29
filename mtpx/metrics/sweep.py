"""A Hydra multirun as one table (`sweep_table`, used by tools/sweep_table.py): one markdown row
per job, the overrides that vary first, and the failed, incomplete or never-started jobs with
their reason. `SweepTableCallback` (conf/config.yaml's hydra.callbacks) prints it when a multirun
ends and writes it into the sweep folder (sweep.md)."""
from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from hydra.experimental.callback import Callback

from mtpx.metrics.dashboard_summary import md_row
from mtpx.metrics.launchers import note_sweep_problems
from mtpx.metrics.pareto import QUALITY_COLUMNS, has_quality, job_label, write_pareto_figure
from mtpx.metrics.run_dirs import RunDirError, read_metrics, read_yaml
from mtpx.metrics.report import DASH
from mtpx.metrics.tree_metrics import TREE_COLUMNS

__all__ = ["SweepJob", "collect_sweep", "sweep_table", "SweepTableCallback"]


@dataclass
class SweepJob:
    """One job of a multirun: its number, overrides, run directory (None when never started),
    metrics (None when metrics.json is missing or unreadable) and its problems (reasons)."""

    num: int | None
    overrides: list[str]
    path: Path | None
    metrics: dict | None = None
    problems: list[str] = field(default_factory=list)


_NO_METRICS = ("no metrics.json: the job stopped before writing it (killed, or a crash with a traceback "
               "on the sweep's stderr), or is still running")
_FAILED = "failed before writing metrics.json: "   # + the error line the job recorded (error.txt, its log)
_NOT_STARTED = ("not started: the sweep was stopped before this job (a failed job does not stop it: "
                "train_or_eval.py runs the next one), or is still running")


def _job_num(path: Path, root: Path) -> int | None:
    rel = path.relative_to(root)
    return int(rel.name) if rel.name.isdigit() else None


def _expected_jobs(root: Path) -> list[list[str]] | None:
    """Every job's overrides, in job-number order, from multirun.yaml's task overrides (Hydra's
    basic sweeper expands them); None when unknown (no multirun.yaml, another sweeper or subdir)."""
    cfg = read_yaml(root / "multirun.yaml")
    try:
        hydra = cfg["hydra"]
        if (hydra["sweep"]["subdir"] != "${hydra.job.num}"
                or "basic_sweeper" not in hydra["sweeper"]["_target_"]):
            return None
        task = [str(o) for o in hydra["overrides"]["task"]]
        from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
        from hydra.core.override_parser.overrides_parser import OverridesParser

        parsed = OverridesParser.create().parse_overrides(task)
        return [job for batch in BasicSweeper.split_arguments(parsed, None) for job in batch]
    except Exception:  # noqa: BLE001 - an unexpected layout only loses the "not started" rows
        return None


def _log_error(job_dir: Path) -> str | None:
    """The last line of the job's Hydra log(s) (*.log) or error.txt that names an error, if any."""
    line = None
    for log in [*sorted(job_dir.glob("*.log")), job_dir / "error.txt"]:
        try:
            for text in log.read_text(encoding="utf-8", errors="replace").splitlines():
                if re.search(r"error|exception|traceback", text, re.IGNORECASE):
                    line = text.strip()
        except OSError:
            continue
    return line


def collect_sweep(multirun_dir: str | os.PathLike) -> list[SweepJob]:
    """The jobs of a Hydra multirun folder (multirun/DATE/TIME), by job number.

    Job folders are the sub-folders holding .hydra/overrides.yaml. Jobs that multirun.yaml
    expands to but whose folder does not exist are returned with path None (never started).

    Raises:
        RunDirError: `multirun_dir` is not a folder or holds no job folder and no multirun.yaml.
    """
    root = Path(multirun_dir)
    if not root.is_dir():
        raise RunDirError(f"{root} is not a directory: pass a Hydra multirun folder (multirun/DATE/TIME)")
    dirs = sorted({p.parent.parent for p in root.rglob("overrides.yaml") if p.parent.name == ".hydra"}
                  - {root}, key=lambda p: (_job_num(p, root) is None, _job_num(p, root) or 0, str(p)))
    expected = _expected_jobs(root)
    if not dirs and expected is None:
        raise RunDirError(f"{root} has no job folders (N/.hydra/overrides.yaml) and no multirun.yaml: "
                          "pass the folder a multirun wrote (python train_or_eval.py -m ...; "
                          "multirun/DATE/TIME)")
    jobs = []
    for d in dirs:
        overrides = read_yaml(d / ".hydra" / "overrides.yaml")
        job = SweepJob(_job_num(d, root), [str(o) for o in overrides] if isinstance(overrides, list) else [],
                       d)
        try:
            job.metrics = read_metrics(d)
        except RunDirError as err:
            if (d / "metrics.json").exists():
                job.problems.append(str(err))
            else:
                error = _log_error(d)
                job.problems.append(_FAILED + error if error else _NO_METRICS)
        if job.metrics is not None:
            m = job.metrics
            if m.get("lossless_mismatches"):
                job.problems.append(f"lossless check failed: {m['lossless_mismatches']} request(s) differ "
                                    "from plain decoding (the job exited with status 1)")
            if m.get("num_failed"):
                job.problems.append(f"{m['num_failed']} of {m.get('num_requests')} requests failed "
                                    "(their error is in outputs.jsonl)")
        jobs.append(job)
    if expected is not None:
        have = {j.num for j in jobs}
        jobs += [SweepJob(i, ov, None, problems=[_NOT_STARTED]) for i, ov in enumerate(expected)
                 if i not in have]
        jobs.sort(key=lambda j: (j.num is None, j.num or 0))
    return jobs


def _split_override(o: str) -> tuple[str, str]:
    key, sep, value = o.partition("=")
    return key.lstrip("+~"), value if sep else ""


_SWEEP_COLUMNS = (
    ("Acceptance rate (%)",
     lambda m: None if m.get("acceptance_rate") is None else f"{m['acceptance_rate'] * 100:.2f}"),
    ("Acceptance length",
     lambda m: None if m.get("acceptance_length") is None else f"{m['acceptance_length']:.2f}"),
    ("Per-position acceptance (%)", lambda m: " / ".join(DASH if v is None else f"{v * 100:.1f}"
                                                         for v in m.get("per_position_acceptance") or [])
                                              or None),
    ("Output tok/s",
     lambda m: None if m.get("output_throughput") is None else f"{m['output_throughput']:.2f}"),
    ("Median TTFT (ms)", lambda m: None if m.get("median_ttft_ms") is None else f"{m['median_ttft_ms']:.2f}"),
    ("Median TPOT (ms)", lambda m: None if m.get("median_tpot_ms") is None else f"{m['median_tpot_ms']:.2f}"),
    ("Median ITL (ms)", lambda m: None if m.get("median_itl_ms") is None else f"{m['median_itl_ms']:.2f}"),
    ("Lossless mismatches",
     lambda m: None if m.get("lossless_mismatches") is None else str(m["lossless_mismatches"])),
)


def _varying(jobs: Sequence[SweepJob]) -> tuple[list[dict[str, str]], list[str]]:
    """Each job's overrides as {key: value}, and the keys whose values differ between jobs (all
    keys when none differ)."""
    parsed = [dict(_split_override(o) for o in j.overrides) for j in jobs]
    keys = list(dict.fromkeys(k for p in parsed for k in p))
    return parsed, [k for k in keys if len({p.get(k) for p in parsed}) > 1] or keys


def write_sweep_pareto(root: Path, jobs: Sequence[SweepJob]) -> Path | None:
    """pareto.png in the sweep folder when a job ran a lossy acceptance rule (mtpx.metrics.pareto)."""
    parsed, varying = _varying(jobs)
    done = [(job_label(p, varying), j.metrics) for j, p in zip(jobs, parsed) if j.metrics is not None]
    if not has_quality([m for _, m in done]):
        return None
    return write_pareto_figure([label for label, _ in done], [m for _, m in done], root / "pareto.png")


def sweep_table(multirun_dir: str | os.PathLike, jobs: Sequence[SweepJob] | None = None) -> str:
    """A markdown summary of a Hydra multirun: the overrides every job shares, one table row per
    job with metrics (the overrides that differ between jobs first, then acceptance rate, length,
    per-position acceptance, output throughput, median TTFT / TPOT / ITL, lossless mismatches,
    with a lossy acceptance rule its speed-up and quality (mtpx.metrics.pareto.QUALITY_COLUMNS),
    the job number), then the failed, incomplete or never-started jobs with their reasons.

    Args:
        multirun_dir: the multirun folder (named in the title).
        jobs: `collect_sweep(multirun_dir)` when None.
    """
    jobs = collect_sweep(multirun_dir) if jobs is None else list(jobs)
    parsed, varying = _varying(jobs)
    columns = _SWEEP_COLUMNS + (QUALITY_COLUMNS if has_quality([j.metrics for j in jobs]) else ())
    columns += TREE_COLUMNS if any((j.metrics or {}).get("tree") for j in jobs) else ()
    common = [o for o in (jobs[0].overrides if jobs else []) if _split_override(o)[0] not in varying]
    done = [(j, p) for j, p in zip(jobs, parsed) if j.metrics is not None]
    out = [f"# Sweep {multirun_dir}\n",
           f"{len(jobs)} job(s), {len(done)} with metrics, "
           f"{sum(1 for j in jobs if j.problems)} with problems.\n"]
    if common:
        out.append("Common overrides: " + " ".join(f"`{o}`" for o in common) + "\n")
    if done:
        rows = [[*(p.get(k, DASH) or DASH for k in varying),
                 *((fn(j.metrics) or DASH) for _, fn in columns),
                 DASH if j.num is None else j.num] for j, p in done]
        header = [*varying, *(c for c, _ in columns), "Job"]
        align = ["---"] * len(varying) + ["---:"] * (len(header) - len(varying))
        out.append("".join(md_row(r) + "\n" for r in [header, align, *rows]))
    problems = [j for j in jobs if j.problems]
    if problems:
        out.append("## Failed or incomplete jobs\n")
        def own(j: SweepJob) -> str:   # the job's overrides less the common ones (listed above)
            return " ".join(o for o in j.overrides if o not in common) or "no overrides"
        out.append("".join(f"- job {DASH if j.num is None else j.num} (`{own(j)}`): {'; '.join(j.problems)}\n"
                           for j in problems))
    return "\n".join(out)


class SweepTableCallback(Callback):
    """Hydra callback: at the end of a multirun, print the sweep table and write it into the
    sweep folder as sweep.md (tools/sweep_table.py does the same for any multirun folder). A
    folder that cannot be read or written gets one line on stderr instead."""

    def on_multirun_end(self, config, **kwargs) -> None:
        import sys

        from mtpx.io import atomic_write_text, disk_error_line
        root = Path(str(config.hydra.sweep.dir))
        try:
            jobs = collect_sweep(root)
            note_sweep_problems(jobs)      # the sweep's exit status (train_or_eval.py)
            text = sweep_table(root, jobs)
            out = atomic_write_text(root / "sweep.md", text)
            figure = write_sweep_pareto(root, jobs)
        except RunDirError as err:
            print(f"sweep table: {err}", file=sys.stderr)
            return
        except OSError as err:
            print(f"sweep table: not written: {disk_error_line(err) or err}", file=sys.stderr)
            return
        print("\n" + text, end="")
        print(f"\nsweep table: {out}")
        if figure is not None:
            print(f"speed against quality: {figure}")
            _log_figure(config, root, figure)


def _log_figure(config, root: Path, figure: Path) -> None:
    """The Pareto figure to W&B (a run of the sweep's group) when the sweep's logger is wandb."""
    from omegaconf import OmegaConf

    from mtpx.metrics.logging import RunLogger
    logger_cfg = config.get("logger")
    if logger_cfg is None or logger_cfg.get("name", "none") == "none":
        return
    run = RunLogger(OmegaConf.to_container(logger_cfg, resolve=True), run_dir=root, run_name="sweep-pareto",
                    group=str(root))
    run.log_images([figure])
    run.finish()
