"""Command lines that pointed the wrong way (issue 73 item 3): a key given twice names the value
that failed (Hydra applies overrides in order; the last wins), a group chosen twice both choices;
a key in the wrong group (device=cuda, eval.device, tensor_parallel_size) names the group that has
it, not a look-alike; threads or tensor-parallel ranks past the CPUs are a
warning line (the run goes on: legal, only slow)."""
from pathlib import Path

import pytest

from mtpx.cli import check_overrides
from mtpx.engine.threads import oversubscription_warning

CONF = Path(__file__).resolve().parents[1] / "conf"


@pytest.mark.parametrize("argv,line", [
    (["eval.max_tokens=4", "eval.max_tokens=abc"], "eval.max_tokens=abc: must be an integer"),
    (["eval.max_tokens=abc", "eval.max_tokens=4"], "eval.max_tokens=abc: must be an integer"),
    (["eval.max_tokens=4", "eval.max_tokens=8"], None),                    # legal: the last wins
    (["+spec=mtp8", "+spec=mtp1"], "spec is given twice (+spec=mtp8 and +spec=mtp1): give it once"),
    (["model=hf", "model=demo"], "model is given twice (model=hf and model=demo): give it once"),
    (["device=cuda"],
     "unknown key 'device': did you mean train.device? (eval, bench and serve decode on the CPU)"),
    (["eval.device=cuda"],
     "unknown key 'eval.device': did you mean train.device? (eval, bench and serve decode on the CPU)"),
    (["tensor_parallel_size=2"],
     "unknown key 'tensor_parallel_size': did you mean engine.tensor_parallel_size?"),
    (["eval.num_promts=8"], "unknown key 'eval.num_promts': did you mean eval.num_prompts?"),
])
def test_wrong_way_command_lines_are_one_line_naming_the_fix(argv, line):
    assert check_overrides(argv, CONF) == line


@pytest.mark.parametrize("requested,tp,line", [
    (2, 1, None), (None, 1, None), (1, 2, None),
    (100, 1, "warning: eval.threads=100 is more than the 2 CPU(s) this process may use: threads wait on each "
             "other (often many times slower); set eval.threads=2 or null (measured at start-up)"),
    (2, 2, "warning: eval.threads=2 on each of engine.tensor_parallel_size=2 ranks is more than the 2 "
           "CPU(s) this process may use: threads wait on each other (often many times slower); set "
           "eval.threads=1 or null (measured at start-up)"),
    (None, 4, "warning: engine.tensor_parallel_size=4 is more than the 2 CPU(s) this process may use: the "
              "ranks wait on each other (slower than one rank); lower engine.tensor_parallel_size"),
])
def test_threads_or_ranks_past_the_cpus_are_a_warning_line(requested, tp, line):
    assert oversubscription_warning(requested, tp, "eval.threads", cpus=2) == line


def test_resume_with_a_run_folder_of_no_earlier_run_is_one_line(tiny_ckpt, tmp_path):
    """eval.resume=true with a mistyped hydra.run.dir (Hydra creates it, empty) is refused before
    the model loads, instead of silently starting afresh."""
    import os
    import subprocess
    import sys
    run = tmp_path / "typo"
    r = subprocess.run([sys.executable, str(CONF.parent / "train_or_eval.py"), f"model.path={tiny_ckpt}",
                        "eval.resume=true", "logger=none", f"hydra.run.dir={run}"], capture_output=True,
                       text=True, timeout=300, cwd=tmp_path, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 2, r.stderr[-2000:]
    assert r.stderr.strip().splitlines()[-1] == (
        f"error: eval.resume=true: the run folder {run} holds no earlier run (no outputs.jsonl): set "
        "hydra.run.dir to the interrupted run's folder, or drop eval.resume for a new run")
