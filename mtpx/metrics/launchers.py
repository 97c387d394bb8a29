"""Sweeps on Hydra's launcher plugins (`pip install -e .[launchers]`): `hydra/launcher=joblib` runs
a multirun's jobs in parallel local processes, `hydra/launcher=submitit_local` / `submitit_slurm`
through submitit (docs/configuration.md, "Sweeps"). Each job is its own process: its W&B run joins
the sweep's group (the sweep folder) and its sweep table row comes from its own folder
(mtpx/metrics/sweep.py), whichever launcher ran it.

Threads: jobs that run at once on one machine would each take every CPU. `job_threads` gives a
job of such a launcher its share: hydra.launcher.cpus_per_task when the launcher has it
(submitit), else the machine's CPUs divided by hydra.launcher.n_jobs (joblib); OMP_NUM_THREADS
and the run's own threads keys (eval.threads, train.threads, ...) still win.

Exit status: a job of such a launcher runs in another process, so the sweep's process learns of
its failure from the sweep table (`SweepTableCallback` calls `note_sweep_problems`);
train_or_eval.py then exits non-zero (`sweep_exit_code`), as it does for the basic launcher.
"""
from __future__ import annotations

import os


def job_threads(launcher, cpus: int) -> int | None:
    """The thread count a job of `launcher` (the hydra.launcher node; None for the basic launcher)
    should use on a machine of `cpus` CPUs, or None to leave the choice to the run."""
    if launcher is None:
        return None
    per_task = launcher.get("cpus_per_task")
    if isinstance(per_task, int) and per_task >= 1:
        return per_task
    n_jobs = launcher.get("n_jobs")
    if isinstance(n_jobs, int) and n_jobs != 1:
        parallel = cpus if n_jobs < 0 else n_jobs       # joblib: -1 = as many jobs as CPUs
        return max(1, cpus // max(1, parallel))
    return None


def set_job_threads() -> int | None:
    """In a multirun job of a parallel launcher without OMP_NUM_THREADS: set OMP_NUM_THREADS to
    job_threads(...) for this process (mtpx.engine.threads and mtpx.train take it, as they take a
    user's). Returns the count set, or None."""
    if os.environ.get("OMP_NUM_THREADS", "").strip():
        return None
    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode
        hc = HydraConfig.get()
    except ValueError:                 # outside Hydra
        return None
    if hc.mode != RunMode.MULTIRUN:
        return None
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    n = job_threads(hc.get("launcher"), cpus)
    if n is not None:
        os.environ["OMP_NUM_THREADS"] = str(n)
        import torch
        torch.set_num_threads(n)
    return n


_PROBLEM_JOBS: list[int | None] = []   # the last multirun's jobs with problems (failed, not started)


def note_sweep_problems(jobs) -> None:
    """Record the job numbers of `jobs` (mtpx.metrics.sweep.SweepJob) that have problems."""
    _PROBLEM_JOBS[:] = [j.num for j in jobs if j.problems]


def sweep_exit_code(failed_codes: list[int]) -> int:
    """The multirun's exit status: the largest exit code of its failed jobs that this process saw
    (basic launcher), else 1 when the sweep table lists a job with problems, else 0."""
    if failed_codes:
        return max(failed_codes)
    return 1 if _PROBLEM_JOBS else 0
