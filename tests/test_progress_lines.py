"""Without a terminal (nohup, a pipe, CI) eval, bench, train and distill print a progress line
every MTPX_PROGRESS_S seconds: done/total, tok/s, acceptance length (spec), ETA."""
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from mtpx.metrics.progress import ProgressLines, duration_text, progress_every_s

ROOT = Path(__file__).resolve().parents[1]
LINE = r"{}: \d+/{} {}, .*\d+ tok/s.*, \d+ s elapsed"


class _Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


class _Tty(io.StringIO):
    def isatty(self):
        return True


def test_lines_every_n_seconds_with_eta_and_none_on_a_terminal():
    clock, out = _Clock(), io.StringIO()
    p = ProgressLines("eval mtp8", 10, "requests", every=5, stream=out, clock=clock)
    clock.t = 2.0
    p.update(1, "300 tok/s", None)
    assert out.getvalue() == ""                           # not due yet
    clock.t = 6.0
    p.update(3, "310 tok/s", "acceptance length 2.40")
    assert out.getvalue() == ("eval mtp8: 3/10 requests, 310 tok/s, acceptance length 2.40, 6 s elapsed, "
                              "ETA 14 s\n")
    clock.t = 12.0
    p.tick()                                             # nothing finished: the last state again
    assert out.getvalue().count("\n") == 2
    tty = _Tty()
    q = ProgressLines("x", 2, "steps", every=5, stream=tty, clock=clock)
    clock.t = 100.0
    q.update(1, "1 tok/s")
    assert tty.getvalue() == "" and not q.enabled
    assert duration_text(173) == "2m53s" and duration_text(3840) == "1h04m"


def test_progress_every_is_read_from_the_environment(monkeypatch):
    monkeypatch.setenv("MTPX_PROGRESS_S", "0.5")
    assert progress_every_s() == 0.5
    monkeypatch.setenv("MTPX_PROGRESS_S", "often")
    with pytest.raises(ValueError, match="MTPX_PROGRESS_S='often': give the seconds between progress lines"):
        progress_every_s()


def _cli(args, cwd):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MTPX_PROGRESS_S": "0.000001"}   # every update prints
    # stderr is a pipe, not a terminal
    return subprocess.run([sys.executable, str(ROOT / "train_or_eval.py"), *args], cwd=cwd,
                          capture_output=True, text=True, timeout=300, env=env)


@pytest.mark.parametrize("mode", [pytest.param("eval", marks=pytest.mark.slow), "bench"])   # one printer
def test_eval_and_bench_print_progress_lines_on_a_pipe(tiny_ckpt, tmp_path, mode):
    r = _cli([f"mode={mode}", f"model.path={tiny_ckpt}", "+spec=mtp8", "spec.num_speculative_tokens=2",
              "logger=none", f"{mode}.num_prompts=3", f"{mode}.max_tokens=8",
              f"hydra.run.dir={tmp_path / 'run'}"]
             + (["eval.check_lossless=false"] if mode == "eval" else []), tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    lines = [line for line in r.stderr.splitlines()
             if re.match(LINE.format("mtp8: 3 prompts", 3, "requests"), line)]
    assert (lines and "acceptance length" in lines[-1]
            and lines[-1].startswith("mtp8: 3 prompts: 3/3 requests"))
    assert any("ETA" in line for line in lines) or len(lines) == 1
    # before any request finishes, the running requests' tokens move the line (and the bar)
    assert any(re.search(r"mtp8: 3 prompts: 0/3 requests, \d+ tok/s, [1-9]\d* tokens", line)
               for line in r.stderr.splitlines()), r.stderr[-2000:]


def test_train_and_distill_print_progress_lines_on_a_pipe(tiny_ckpt, tmp_path):
    from tests.test_train import run_cfg, write_synthetic_gsm8k
    write_synthetic_gsm8k(tmp_path / "gsm8k.jsonl")
    t = run_cfg(tmp_path, "out", steps=4, eval_every=0)["train"]
    args = ["mode=train", "logger=none", f"hydra.run.dir={tmp_path / 'run'}", "model.num_hidden_layers=2",
            "model.hidden_size=32", "model.intermediate_size=64", "model.num_nextn_predict_layers=2"]
    args += [f"train.{k}={json.dumps(v) if isinstance(v, list) else v}" for k, v in t.items()]
    r = _cli(args, tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    lines = [line for line in r.stderr.splitlines() if re.match(LINE.format("train", 4, "steps"), line)]
    assert lines and "loss main" in lines[-1] and lines[-1].startswith("train: 4/4 steps")
    r = _cli(["mode=distill", f"model.path={tiny_ckpt}", "logger=none", f"distill.out_dir={tmp_path / 'd'}",
              "distill.num_prompts=3", "distill.max_tokens=4", f"hydra.run.dir={tmp_path / 'run2'}"],
             tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    lines = [line for line in r.stderr.splitlines() if re.match(LINE.format("distill", 3, "prompts"), line)]
    assert lines and lines[-1].startswith("distill: 3/3 prompts")
