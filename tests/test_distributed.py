"""Data-parallel training (mtpx/train/distributed.py) on the CPU: gloo, 2 ranks started by
torch.multiprocessing.spawn with torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR/PORT), so mtpx.train.train creates its process group exactly as under torchrun;
the failure test runs torchrun itself.

Tolerances. Two ranks compute the same global batch as one process, but in another float32
summation order: each rank's CE is a mean over its half of the rows, the two halves' gradients
are averaged by all-reduce / reduce-scatter, and a matmul over 4 rows need not round like one over
8. So a 2-rank loss differs from the 1-process one by float32 rounding that AdamW then carries
through a few steps (measured over 6 steps: 2.2e-7 relative on the losses, 1.2e-7 absolute on
the weights). Losses are compared with rtol 1e-5 and weights with atol 1e-5: 50x the measured
drift, and far below what a wrong gradient would give (a step moves a weight by ~lr = 3e-3). The
same world size, resumed or not, is deterministic and compared with ==.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from safetensors.torch import load_file

from mtpx.models import ModelConfig, MTPForCausalLM
from mtpx.train import checkpoint as ckpt
from mtpx.train import distributed
from mtpx.train.loop import train
from mtpx.train.tokenizer import train_tokenizer
from tests.test_train import TINY_MODEL, run_cfg, write_synthetic_gsm8k

ROOT = Path(__file__).resolve().parents[1]
RTOL, ATOL = 1e-5, 1e-5


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, jobs: list) -> None:
    """One rank: run `jobs` in order, each a train config (with its own "port") or
    ("copy", src, dst), which rank 0 does while the others wait for it."""
    torch.set_num_threads(1)
    for job in jobs:
        if isinstance(job, (list, tuple)) and job[0] == "copy":
            _, src, dst = job
            if rank == 0:
                shutil.copytree(src, dst)
                Path(f"{dst}.done").touch()
            deadline = time.monotonic() + 60
            while not Path(f"{dst}.done").exists():
                if time.monotonic() > deadline:
                    raise TimeoutError(f"rank {rank}: no copy {dst}")
                time.sleep(0.05)
            continue
        cfg = dict(job)
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(cfg.pop("port")), RANK=str(rank),
                          WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
        train(cfg)
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        os.environ.pop(key, None)


def _spawn(jobs: list, world: int = 2) -> None:
    mp.spawn(_worker, args=(world, jobs), nprocs=world, join=True)


def _train_rows(out: Path) -> list[dict]:
    return [h for h in ckpt.load_trainer_state(out)["loss_history"] if h["split"] == "train"]


def _close(a: list[dict], b: list[dict], keys=("loss", "main", "mtp1", "mtp2", "grad_norm")) -> None:
    assert [h["step"] for h in a] == [h["step"] for h in b]
    for ha, hb in zip(a, b):
        for k in keys:
            assert hb[k] == pytest.approx(ha[k], rel=RTOL), (ha["step"], k, ha[k], hb[k])


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One spawn of 2 ranks runs every multi-process job of this module (one start-up cost):
    ddp joint training; fsdp over a frozen target, uninterrupted (6 steps) and in two legs
    (4 steps, a copy of that checkpoint, resumed to 6 at world size 2)."""
    tmp = tmp_path_factory.mktemp("dist")
    write_synthetic_gsm8k(tmp / "gsm8k.jsonl")
    tok = train_tokenizer([(tmp / "gsm8k.jsonl").read_text()], 320)
    torch.manual_seed(0)
    target = MTPForCausalLM(ModelConfig(**{**TINY_MODEL, "vocab_size": tok.get_vocab_size()}))
    ckpt.save_checkpoint(tmp / "target", target, tok)

    def job(out, **kw):
        cfg = run_cfg(tmp, out, eval_every=3, **kw)
        return {**cfg, "port": _free_port()}

    def fsdp(out, steps, save_every=0):
        cfg = job(out, steps=steps, save_every=save_every, freeze_base=True, parallel="fsdp")
        cfg["model"]["path"] = str(tmp / "target")
        return cfg

    ddp = job("ddp", steps=6)
    jobs = [ddp, fsdp("fsdp_full", 6), fsdp("fsdp_legs", 4, save_every=4),
            ("copy", str(tmp / "fsdp_legs"), str(tmp / "fsdp_legs_w1")), fsdp("fsdp_legs", 6)]
    t0 = time.perf_counter()
    _spawn(jobs)
    return tmp, time.perf_counter() - t0, ddp


def test_ddp_two_ranks_match_one_process_with_the_same_global_batch(runs):
    tmp, _, ddp = runs
    one = train({k: v for k, v in run_cfg(tmp, "single", steps=6, eval_every=3).items()})
    _close(_train_rows(one), _train_rows(tmp / "ddp"))
    val_a = [h for h in ckpt.load_trainer_state(one)["loss_history"] if h["split"] == "val"]
    val_b = [h for h in ckpt.load_trainer_state(tmp / "ddp")["loss_history"] if h["split"] == "val"]
    _close(val_a, val_b, keys=("loss", "main", "mtp1", "mtp2"))
    a, b = load_file(one / "model.safetensors"), load_file(tmp / "ddp" / "model.safetensors")
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=0, atol=ATOL, msg=k)
    # the same tokenizer and config: the checkpoint does not depend on the world size
    assert (one / "tokenizer.json").read_text() == (tmp / "ddp" / "tokenizer.json").read_text()
    assert ckpt.load_trainer_state(tmp / "ddp")["config"]["train"]["batch_size"] == 8


def test_fsdp_trains_only_the_heads_of_a_frozen_target(runs):
    tmp, _, _ = runs
    before, after = (load_file(tmp / "target" / "model.safetensors"),
                     load_file(tmp / "fsdp_full" / "model.safetensors"))
    assert before.keys() == after.keys()
    base = [k for k in before if not k.startswith("mtp.")]
    assert base and all(torch.equal(before[k], after[k]) for k in base)  # gathered, bit-identical
    assert all(not torch.equal(before[k], after[k]) for k in before
               if k.startswith("mtp.") and k.endswith("fc.weight"))
    model, _ = ckpt.load_model(tmp / "fsdp_full")  # an ordinary checkpoint: loads, exports as today
    assert len(model.mtp) == 2


def test_fsdp_checkpoint_resumes_exactly_at_world_size_2_and_1(runs):
    tmp, _, _ = runs
    full = _train_rows(tmp / "fsdp_full")
    legs = _train_rows(tmp / "fsdp_legs")
    assert legs == full  # resumed at step 4 at the same world size: every loss identical
    assert ckpt.load_trainer_state(tmp / "fsdp_legs_w1")["step"] == 4
    cfg = run_cfg(tmp, "fsdp_legs_w1", steps=6, eval_every=3, freeze_base=True)  # one process
    cfg["model"]["path"] = str(tmp / "target")
    w1 = _train_rows(train(cfg))
    assert w1[:4] == full[:4]  # the history it resumed
    _close(full[4:], w1[4:], keys=("loss", "mtp1", "mtp2", "grad_norm"))
    a, b = (load_file(tmp / "fsdp_full" / "model.safetensors"),
            load_file(tmp / "fsdp_legs_w1" / "model.safetensors"))
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=0, atol=ATOL, msg=k)


FAILING_RANK = '''
import json, os, sys
from mtpx.train import loop
cfg = json.loads(open(sys.argv[1]).read())
fail_at, calls, real = int(sys.argv[2]), [0], loop.train_step
def train_step(*args, **kwargs):
    calls[0] += 1
    if os.environ["RANK"] == "1" and calls[0] == fail_at:
        raise RuntimeError(f"injected failure on rank 1 at step {fail_at}")
    return real(*args, **kwargs)
loop.train_step = train_step
loop.train(cfg)
'''


def test_a_failing_rank_ends_the_job_in_bounded_time_and_the_last_checkpoint_loads(tmp_path):
    write_synthetic_gsm8k(tmp_path / "gsm8k.jsonl")
    cfg = run_cfg(tmp_path, "dies", steps=10, save_every=2, eval_every=0, dist_timeout_s=30)
    (tmp_path / "cfg.json").write_text(json.dumps(cfg))
    (tmp_path / "failing_rank.py").write_text(FAILING_RANK)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                        str(tmp_path / "failing_rank.py"), str(tmp_path / "cfg.json"), "5"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    wall = time.perf_counter() - t0
    assert r.returncode != 0
    assert wall < 60, wall
    assert "injected failure on rank 1 at step 5" in r.stderr
    assert ckpt.load_trainer_state(tmp_path / "dies")["step"] == 4  # the save before the failure
    model, _ = ckpt.load_model(tmp_path / "dies")
    assert len(model.mtp) == 2 and not list(tmp_path.glob(".dies.*"))


# ---- pure pieces ------------------------------------------------------------------------------------


def test_ranks_rows_are_disjoint_and_together_the_single_process_batch():
    batch = torch.arange(12 * 3).view(12, 3)
    for world in (1, 2, 3, 4):
        rows = [distributed.rank_rows(batch, distributed.DistInfo("ddp", r, world)) for r in range(world)]
        assert torch.equal(torch.cat(rows), batch) and all(len(x) == 12 // world for x in rows)


def test_parallel_config_errors_name_the_key():
    env2 = {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}
    assert distributed.resolve("auto", False, 8, env={}).mode == "none"
    assert distributed.resolve("auto", False, 8, env=env2).mode == "ddp"
    assert distributed.resolve("auto", False, 8, env={**env2, "WORLD_SIZE": "1"}).mode == "none"
    assert distributed.resolve("fsdp", True, 8, env=env2).mode == "fsdp"
    for args, env, message in (
            (("auto", False, 9), {**env2, "WORLD_SIZE": "4"},
             "train.batch_size=9 is the global batch .* divisible by the world size 4"),
            (("none", False, 8), env2, "train.parallel=none under torchrun with WORLD_SIZE=2"),
            (("fsdp", False, 8), env2,
             "train.parallel=fsdp shards a frozen target: set train.freeze_base=true"),
            (("ddp", False, 8), {}, "train.parallel=ddp needs torchrun"),
            (("zero3", False, 8), {}, "train.parallel='zero3': use one of auto, none, ddp, fsdp")):
        with pytest.raises(ValueError, match=message):
            distributed.resolve(*args, env=env)
