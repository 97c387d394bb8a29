"""Ctrl-C and SIGTERM keep what finished: eval writes the finished requests (metrics.json marked
partial) and exits 130 (SIGTERM: 143) with one line; training saves a checkpoint first and resumes
bit-identically; a second signal says what it kept; runs started in the same second get their own
folders."""
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
# Seconds from SIGTERM to exit, written files included: 7.1 s for eval measured at load average 13 on
# 2 cores (the default suite beside other jobs); the target on a quiet core is under 5 s. A bound a
# loaded CI core keeps, which a run that kept generating or compiling after the signal would not.
SIGNAL_EXIT_BOUND_S = 30.0


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


# about 25 s; the SIGTERM test below takes the same handler (mtpx.io) in the default suite
@pytest.mark.slow
def test_ctrl_c_during_eval_keeps_the_finished_requests(tiny_ckpt, tmp_path):
    run = tmp_path / "run"
    proc = _start([f"model.path={tiny_ckpt}", "+spec=mtp8", "spec.num_speculative_tokens=2", "logger=none",
                   "eval.num_prompts=64", "eval.max_tokens=200", "eval.concurrency=1",
                   f"hydra.run.dir={run}"], ROOT)
    rows = run / "outputs.jsonl"
    _wait_for(lambda: rows.exists() and len(rows.read_text().splitlines()) >= 2, proc)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    lines = [line for line in err.strip().splitlines() if line.startswith(("interrupted", "Traceback"))]
    assert (len(lines) == 1 and lines[0].startswith("interrupted: ")
            and "of 64 requests had finished" in lines[0])
    metrics = json.loads((run / "metrics.json").read_text())
    kept = [json.loads(line) for line in rows.read_text().splitlines()]
    assert metrics["partial"] is True and metrics["num_prompts_requested"] == 64
    assert 2 <= metrics["num_requests"] == len(kept) < 64
    assert all(r["finish_reason"] in ("stop", "length") and r["prompt"] for r in kept)
    assert (run / "report.txt").exists() and "interrupted" in (run / "report.txt").read_text()
    log = (run / "train_or_eval.log").read_text()     # the run's output, through Hydra's job log
    assert "threads: " in log and "interrupted: " in log and "run directory:" in log


@pytest.mark.parametrize("sig,code,word",
                         [pytest.param(signal.SIGINT, 130, "interrupted", marks=pytest.mark.slow),
                          (signal.SIGTERM, 143, "interrupted by SIGTERM")])
def test_ctrl_c_or_sigterm_during_training_saves_a_checkpoint_first(tmp_path, sig, code, word):
    from mtpx.train import checkpoint as ckpt
    from tests.test_train import run_cfg, write_synthetic_gsm8k
    write_synthetic_gsm8k(tmp_path / "gsm8k.jsonl")
    t = run_cfg(tmp_path, "out", steps=100000, save_every=3, eval_every=0)["train"]
    args = ["mode=train", "logger=none", f"hydra.run.dir={tmp_path / 'run'}", "model.num_hidden_layers=2",
            "model.hidden_size=32", "model.intermediate_size=64", "model.num_nextn_predict_layers=2"]
    args += [f"train.{k}={json.dumps(v) if isinstance(v, list) else v}" for k, v in t.items()]
    proc = _start(args, tmp_path)
    _wait_for(lambda: (tmp_path / "out" / "trainer_state.json").exists(), proc)
    t0 = time.monotonic()
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == code, err[-2000:]
    assert time.monotonic() - t0 < SIGNAL_EXIT_BOUND_S
    assert "Traceback" not in err
    step = ckpt.load_trainer_state(tmp_path / "out")["step"]
    assert step >= 3 and f"{word}: training stopped after step {step} of 100000" in err


@pytest.mark.slow     # two evals at once: about 30 s on 2 busy cores
def test_runs_started_in_the_same_second_get_their_own_folders(tmp_path):
    # runs that fail fast but keep their folder (every request fails: exit 1, metrics.json written;
    # a bad-input error, exit 2, removes its folder: tests/test_cli.py)
    procs = [_start(["eval.num_prompts=1", "engine.max_model_len=4", "logger=none"], tmp_path)
             for _ in range(2)]
    for proc in procs:
        proc.communicate(timeout=120)
        assert proc.returncode == 1
    folders = [p for p in (tmp_path / "outputs").glob("*/*") if p.is_dir()]
    assert len(folders) == 2 and all((f / "metrics.json").exists() for f in folders)


def test_sigterm_during_eval_keeps_the_finished_requests_and_exits_143(tiny_ckpt, tmp_path):
    """SIGTERM (timeout, docker, SLURM, Kubernetes) acts as Ctrl-C: the engine stops at the next
    step, the finished requests, metrics.json ("partial": true) and the report are written, one
    line, exit 143."""
    run = tmp_path / "run"
    proc = _start([f"model.path={tiny_ckpt}", "+spec=mtp8", "spec.num_speculative_tokens=2", "logger=none",
                   "eval.num_prompts=64", "eval.max_tokens=200", "eval.concurrency=1",
                   f"hydra.run.dir={run}"], ROOT)
    rows = run / "outputs.jsonl"
    _wait_for(lambda: rows.exists() and len(rows.read_text().splitlines()) >= 2, proc)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err[-2000:]
    assert time.monotonic() - t0 < SIGNAL_EXIT_BOUND_S
    lines = [line for line in err.strip().splitlines() if line.startswith(("interrupted", "Traceback"))]
    assert (len(lines) == 1 and lines[0].startswith("interrupted by SIGTERM: ")
            and "of 64 requests" in lines[0])
    metrics = json.loads((run / "metrics.json").read_text())
    kept = [json.loads(line) for line in rows.read_text().splitlines()]
    assert metrics["partial"] is True and metrics["num_prompts_requested"] == 64
    assert 2 <= metrics["num_requests"] == len(kept) < 64
    assert (run / "report.txt").exists() and "interrupted" in (run / "report.txt").read_text()


@pytest.mark.slow
def test_sigterm_during_training_saves_and_the_resume_is_bit_identical(tmp_path):
    """SIGTERM mid-run saves a checkpoint and exits 143; the same command resumes from it, and
    the weights at the end equal those of a run that was never stopped."""
    from safetensors.torch import load_file

    from mtpx.train import checkpoint as ckpt
    from tests.test_train import run_cfg, write_synthetic_gsm8k
    write_synthetic_gsm8k(tmp_path / "gsm8k.jsonl")
    steps = 150

    def args(out: str) -> list[str]:
        t = run_cfg(tmp_path, out, steps=steps, save_every=3, eval_every=0)["train"]
        return (["mode=train", "logger=none", f"hydra.run.dir={tmp_path / ('run-' + out)}",
                 "model.num_hidden_layers=2", "model.hidden_size=32", "model.intermediate_size=64",
                 "model.num_nextn_predict_layers=2"]
                + [f"train.{k}={json.dumps(v) if isinstance(v, list) else v}" for k, v in t.items()])

    proc = _start(args("stopped"), tmp_path)
    _wait_for(lambda: (tmp_path / "stopped" / "trainer_state.json").exists(), proc)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err[-2000:]
    step = ckpt.load_trainer_state(tmp_path / "stopped")["step"]
    assert 3 <= step < steps and "Traceback" not in err
    assert f"interrupted by SIGTERM: training stopped after step {step} of {steps}" in err
    for out in ("stopped", "full"):                  # the same command resumes; a run never stopped
        proc = _start(args(out), tmp_path)
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-2000:]
    a, b = (load_file(tmp_path / out / "model.safetensors") for out in ("full", "stopped"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert ckpt.load_trainer_state(tmp_path / "stopped")["step"] == steps


def test_sigterm_acts_as_ctrl_c_and_sets_the_exit_code():
    """Inside GracefulInterrupt the first SIGTERM only asks to stop, a second raises
    KeyboardInterrupt; outside it SIGTERM raises KeyboardInterrupt; the exit code is 143."""
    import os

    from mtpx.io import GracefulInterrupt, sigterm_as_ctrl_c, stop_exit_code, stop_signal_name
    before = signal.getsignal(signal.SIGTERM)
    with sigterm_as_ctrl_c():
        assert stop_exit_code() == 130                  # nothing received: Ctrl-C's code
        with GracefulInterrupt() as interrupt:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)
            assert interrupt.requested
            with pytest.raises(KeyboardInterrupt):
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(0.05)
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)
        assert (stop_signal_name(), stop_exit_code()) == ("SIGTERM", 143)
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_second_signal_during_eval_names_the_rows_it_kept(trained_tiny, tmp_path):
    """A second Ctrl-C / SIGTERM stops at once; the line says how many finished rows
    outputs.jsonl holds instead of "nothing was written"."""
    from mtpx import LLM, SamplingParams
    from mtpx.data.prompts import Prompt
    from mtpx.evaluate import _generate
    from mtpx.io import Interrupted
    rows = tmp_path / "outputs.jsonl"

    class SecondSignal:                           # raises as the handler does once 2 rows are written
        @property
        def requested(self):
            if rows.exists() and len(rows.read_text().splitlines()) >= 2:
                raise KeyboardInterrupt
            return False

    prompts = [Prompt(text=f"p{i}", category="c", token_ids=[3 + i, 5, 7]) for i in range(8)]
    llm = LLM(model=trained_tiny, max_num_seqs=1)
    with pytest.raises(Interrupted, match=rf"the 2 requests that had finished are in {rows}"):
        _generate(llm, prompts, SamplingParams(max_tokens=4, ignore_eos=True), "x", {}, SecondSignal(), rows)
    assert len(rows.read_text().splitlines()) == 2


@pytest.mark.slow      # 66 s on a 2-core AVX2 EPYC (the default suite took 39 min there)
def test_an_interrupted_eval_resumed_equals_an_uninterrupted_one(tiny_ckpt, tmp_path):
    """SIGTERM after a few requests, then the same command with eval.resume=true on that folder:
    only the others are generated, and the rows and acceptance equal an uninterrupted run's."""
    common = [f"model.path={tiny_ckpt}", "+spec=mtp8", "spec.num_speculative_tokens=2", "logger=none",
              "eval.num_prompts=12", "eval.max_tokens=40", "eval.concurrency=1", "eval.check_lossless=false"]
    full, run = tmp_path / "full", tmp_path / "run"
    proc = _start(common + [f"hydra.run.dir={run}"], ROOT)
    rows = run / "outputs.jsonl"
    _wait_for(lambda: rows.exists() and len(rows.read_text().splitlines()) >= 2, proc)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143 and "eval.resume=true" in err, err[-2000:]
    kept = len(rows.read_text().splitlines())
    assert 2 <= kept < 12
    for folder, extra in ((run, ["eval.resume=true"]), (full, [])):
        proc = _start(common + extra + [f"hydra.run.dir={folder}"], ROOT)
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-2000:]
        if extra:
            assert f"eval.resume: {kept} of 12 requests had finished" in out
    a, b = ([json.loads(line) for line in (f / "outputs.jsonl").read_text().splitlines()]
            for f in (full, run))
    same = ("index", "prompt", "output_token_ids", "text", "finish_reason", "rounds", "num_accepted_tokens")
    assert [{k: r[k] for k in same} for r in a] == [{k: r[k] for k in same} for r in b]
    ma, mb = (json.loads((f / "metrics.json").read_text()) for f in (full, run))
    assert "partial" not in mb and mb["resumed_requests"] == kept and mb["num_requests"] == 12
    for key in ("num_drafts", "num_accepted_tokens", "num_committed_tokens", "acceptance_length",
                "per_position_acceptance", "num_prompt_tokens", "analytics"):
        assert ma[key] == mb[key], key
    assert mb["mean_ttft_ms"] > 0 and mb["duration_s"] > 0
