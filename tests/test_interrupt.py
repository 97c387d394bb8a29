"""Ctrl-C keeps what finished: eval writes the finished requests (metrics.json marked partial) and
exits 130 with one line; training saves a checkpoint first; runs started in the same second get
their own folders."""
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _start(args: list[str], cwd: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(ROOT / "train_or_eval.py"), *args], cwd=cwd,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**__import__("os").environ, "OMP_NUM_THREADS": "1"})


def _wait_for(predicate, proc: subprocess.Popen, timeout: float = 240) -> None:
    t0 = time.time()
    while not predicate():
        if proc.poll() is not None:
            pytest.fail(f"the run ended before the condition: {proc.communicate()[1][-2000:]}")
        if time.time() - t0 > timeout:
            proc.kill()
            pytest.fail("timed out")
        time.sleep(0.1)


def test_ctrl_c_during_eval_keeps_the_finished_requests(tiny_ckpt, tmp_path):
    run = tmp_path / "run"
    proc = _start([f"model.path={tiny_ckpt}", "+spec=mtp8", "spec.num_speculative_tokens=2", "logger=none",
                   "eval.num_prompts=64", "eval.max_tokens=200", "eval.concurrency=1", f"hydra.run.dir={run}"], ROOT)
    rows = run / "outputs.jsonl"
    _wait_for(lambda: rows.exists() and len(rows.read_text().splitlines()) >= 2, proc)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    lines = [line for line in err.strip().splitlines() if line.startswith(("interrupted", "Traceback"))]
    assert len(lines) == 1 and lines[0].startswith("interrupted: ") and "of 64 requests had finished" in lines[0]
    metrics = json.loads((run / "metrics.json").read_text())
    kept = [json.loads(line) for line in rows.read_text().splitlines()]
    assert metrics["partial"] is True and metrics["num_prompts_requested"] == 64
    assert 2 <= metrics["num_requests"] == len(kept) < 64
    assert all(r["finish_reason"] in ("stop", "length") and r["prompt"] for r in kept)
    assert (run / "report.txt").exists() and "interrupted" in (run / "report.txt").read_text()
    log = (run / "train_or_eval.log").read_text()     # the run's output, through Hydra's job log
    assert "threads: " in log and "interrupted: " in log and "run directory:" in log


def test_ctrl_c_during_training_saves_a_checkpoint_first(tmp_path):
    from mtpx.train import checkpoint as ckpt
    from tests.test_train import run_cfg, write_synthetic_gsm8k
    write_synthetic_gsm8k(tmp_path / "gsm8k.jsonl")
    t = run_cfg(tmp_path, "out", steps=100000, save_every=3, eval_every=0)["train"]
    args = ["mode=train", "logger=none", f"hydra.run.dir={tmp_path / 'run'}", "model.num_hidden_layers=2",
            "model.hidden_size=32", "model.intermediate_size=64", "model.num_nextn_predict_layers=2"]
    args += [f"train.{k}={json.dumps(v) if isinstance(v, list) else v}" for k, v in t.items()]
    proc = _start(args, tmp_path)
    _wait_for(lambda: (tmp_path / "out" / "trainer_state.json").exists(), proc)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    assert "Traceback" not in err
    step = ckpt.load_trainer_state(tmp_path / "out")["step"]
    assert step >= 3 and f"interrupted: training stopped after step {step} of 100000" in err


def test_runs_started_in_the_same_second_get_their_own_folders(tmp_path):
    procs = [_start(["mode=bogus", "logger=none"], tmp_path) for _ in range(2)]
    for proc in procs:
        proc.communicate(timeout=120)
        assert proc.returncode == 2
    folders = [p for p in (tmp_path / "outputs").glob("*/*") if p.is_dir()]
    assert len(folders) == 2 and all((f / "error.txt").exists() for f in folders)
