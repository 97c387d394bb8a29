"""Sweeps on Hydra's launcher plugins (mtpx/metrics/launchers.py; the optional extra `launchers`):
each job's share of the CPUs, and (slow, `pytest -m slow tests/test_launchers.py`, about 2 min on 2
loaded cores) a joblib multirun of two jobs at once and a submitit_local one that write one sweep
table with a failing job reported in it."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from mtpx.metrics.launchers import job_threads, note_sweep_problems, sweep_exit_code
from mtpx.metrics.sweep import SweepJob

ROOT = Path(__file__).resolve().parents[1]


def test_parallel_jobs_share_the_cpus():
    assert job_threads(None, 16) is None                                          # the basic launcher
    assert job_threads(OmegaConf.create({"n_jobs": 4}), 16) == 4                   # joblib
    assert job_threads(OmegaConf.create({"n_jobs": 3}), 2) == 1
    assert job_threads(OmegaConf.create({"n_jobs": -1}), 16) == 1                  # a job per CPU
    assert job_threads(OmegaConf.create({"n_jobs": 1}), 16) is None
    assert job_threads(OmegaConf.create({"cpus_per_task": 6, "tasks_per_node": 1}), 16) == 6   # submitit


def test_a_failed_job_makes_the_sweep_exit_non_zero():
    done = SweepJob(1, ["a=1"], Path("1"), metrics={"acceptance_rate": 0.5})
    failed = SweepJob(0, ["a=0"], Path("0"), problems=["failed before writing metrics.json: error: x"])
    note_sweep_problems([done])
    assert sweep_exit_code([]) == 0
    assert sweep_exit_code([2]) == 2                  # the basic launcher: the job's own exit code
    note_sweep_problems([failed, done])               # a launcher's job ran in another process
    assert sweep_exit_code([]) == 1
    note_sweep_problems([])


def _sweep(tiny_ckpt, out: Path, launcher: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "train_or_eval.py"), "-m", *launcher, f"model.path={tiny_ckpt}",
         "+spec=mtp8", "spec.num_speculative_tokens=9,2", "eval.num_prompts=2", "eval.max_tokens=4",
         "logger=none", f"hydra.sweep.dir={out}"],
        capture_output=True, text=True, cwd=ROOT, timeout=400)


def _installed(module: str) -> bool:
    """Whether a dotted module is importable (find_spec raises when its parent package is missing)."""
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


@pytest.mark.slow
@pytest.mark.skipif(not (_installed("hydra_plugins.hydra_joblib_launcher")
                         and _installed("hydra_plugins.hydra_submitit_launcher")),
                    reason="the launcher plugins are not installed (pip install -e .[launchers])")
@pytest.mark.parametrize("launcher", [["hydra/launcher=joblib", "hydra.launcher.n_jobs=2"],
                                      ["hydra/launcher=submitit_local", "hydra.launcher.cpus_per_task=1",
                                       "hydra.launcher.timeout_min=5"]])
def test_a_sweep_on_a_launcher_writes_one_table_with_its_failed_job(tiny_ckpt, tmp_path, launcher):
    res = _sweep(tiny_ckpt, tmp_path, launcher)
    table = (tmp_path / "sweep.md").read_text()
    assert "2 job(s), 1 with metrics, 1 with problems." in table, res.stderr[-2000:]
    assert res.returncode == 1, res.stderr[-2000:]          # a failed job is not a successful sweep
    assert ("- job 0 (`spec.num_speculative_tokens=9`): failed before writing metrics.json: error: "
            "num_speculative_tokens=9 but the model has only 4 MTP modules") in table
    assert json.loads((tmp_path / "1" / "metrics.json").read_text())["num_requests"] == 2
    log = (tmp_path / "1" / "train_or_eval.log").read_text()
    assert "threads: 1" in log        # its share of the CPUs: OMP_NUM_THREADS set for the job
