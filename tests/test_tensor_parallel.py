"""Tensor-parallel inference (mtpx/parallel, mtpx/engine/tensor_parallel.py) on the CPU: gloo, 2
ranks, 1 thread each.

Tolerance of the sharded forwards: the models are float64 and a sharded forward differs from the
unsharded one only in the order of its sums (each row-parallel product is two half sums added by
the all-reduce; the vocab-parallel embedding adds exact zeros and the logits are gathered, not
summed); measured max |difference| 5.6e-16 on logits of order 1, asserted <= 1e-12. The engine's
greedy and seeded tokens are compared with ==.
"""
from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from mtpx import LLM, SamplingParams
from mtpx.engine.config import EngineConfig
from mtpx.engine.engine import Engine
from mtpx.hf import loader
from mtpx.hf.export import export_model
from mtpx.parallel import TPGroup, check_shardable, shard_model
from mtpx.parallel.load import load_shard
from mtpx.parallel.spmd import free_port
from tests.helpers import LLAMA_FLAGS, peaked_model, tiny_config

ROOT = Path(__file__).resolve().parents[1]
TOL = 1e-12

MODELS = {  # name -> tiny_config overrides
    "hybrid": {},
    "dense": LLAMA_FLAGS,
    "moe": dict(num_experts=4, mtp_style="deepseek_v3"),        # DeepSeek-style MTP heads
    "kv_replicated": dict(num_key_value_heads=1),               # 1 KV head on 2 ranks
}


def _forward_rank(rank: int, port: int, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    tp, results = TPGroup(rank, 2), {}
    for name, overrides in MODELS.items():
        model = peaked_model(tiny_config(**overrides))
        ids = torch.randint(0, model.cfg.vocab_size, (2, 20), generator=torch.Generator().manual_seed(1))
        sharded = copy.deepcopy(model)
        shard_model(sharded, tp)
        with torch.no_grad():
            diffs = {}
            for part, m in (("full", model), ("shard", sharded)):
                h = m.model(ids)
                chain = m.mtp_chain(ids, h, len(m.mtp))
                diffs[part] = [m.lm_head(h)] + [m.draft_logits(k, a) for k, a in enumerate(chain)]
        target, draft = sharded.cache_specs(len(sharded.mtp))
        results[name] = {
            "target": (diffs["shard"][0] - diffs["full"][0]).abs().max().item(),
            "mtp": max((a - b).abs().max().item() for a, b in zip(diffs["shard"][1:], diffs["full"][1:])),
            "num_modules": len(diffs["full"]) - 1,
            "specs": [repr(s) for s in target + draft],
            "full_specs": [repr(s) for s in sum(model.cache_specs(len(model.mtp)), [])],
        }
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(results))
    dist.destroy_process_group()


def test_sharded_forward_equals_unsharded(tmp_path):
    """Target logits and every MTP module's draft logits of a 2-rank shard equal the unsharded
    model's (dense, hybrid, MoE, replicated KV heads), and each rank's cache specs hold half the
    heads (the one KV head replicated)."""
    mp.spawn(_forward_rank, args=(free_port(), str(tmp_path)), nprocs=2)
    for rank in range(2):
        results = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert set(results) == set(MODELS)
        for name, r in results.items():
            assert r["num_modules"] == 4
            assert r["target"] <= TOL and r["mtp"] <= TOL, (name, r)
        assert results["hybrid"]["full_specs"][:2] == [
            "RecurrentStateSpec(conv_dim=128, kernel=4, heads=4, key_dim=16, value_dim=16)",
            "KVCacheSpec(num_heads=4, num_kv_heads=2, head_dim=16)"]
        assert results["hybrid"]["specs"][:2] == [
            "RecurrentStateSpec(conv_dim=64, kernel=4, heads=2, key_dim=16, value_dim=16)",
            "KVCacheSpec(num_heads=2, num_kv_heads=1, head_dim=16)"]
        assert results["kv_replicated"]["specs"][1] == "KVCacheSpec(num_heads=2, num_kv_heads=1, head_dim=16)"
        assert results["dense"]["specs"] == ["KVCacheSpec(num_heads=2, num_kv_heads=1, head_dim=16)"] * 8


# target_sha256 of the unsharded models of GATHER_MODELS as mode=distill computed it before tensor
# parallelism (one process's state_dict in name order): the TP=2 hash must be this very value, so
# distill folders written before keep resuming.
GATHER_MODELS = {  # name -> (tiny_config overrides, dtype, target_sha256 of the unsharded model)
    "hybrid": ({}, torch.float64, "ba393818c8eda5b3e4755214306d99d303073d5f7bb5cf689d43078c8d92b2c8"),
    "dense": (LLAMA_FLAGS, torch.float64, "c681d11f5c118e98e51f0b0823ef938a11c895a2336bc685222f8f8df123b248"),
    "moe": (MODELS["moe"], torch.float32, "4f42cdb160806adc82fd1cda9649cb379d912f10a5473e682cc347879fced294"),
    "kv_replicated": (MODELS["kv_replicated"], torch.float64,
                      "78d9d06852d731754810df2c06323adba715361b25c502e106b3b226651abdd8"),
    "moe_tied": (dict(num_experts=4, tie_word_embeddings=True), torch.float32,
                 "e068340277ba476a9b171068c4d3e9f9ef1942d1c6ad1cc816c1b568f9add1c4"),
    "hybrid_bf16": ({}, torch.bfloat16, None),
}


class _Rank0Driver:
    """Rank 0's tp_driver in _gather_rank: rank 1 calls gather_state itself, so nothing to broadcast."""

    procs = None

    def broadcast(self, method, *args):
        assert method == "gather_state" and args == (("mtp.",),)


def _gather_rank(rank: int, port: int, out_dir: str) -> None:
    from mtpx.distill import target_sha256
    from mtpx.parallel import gather_state
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    tp, results = TPGroup(rank, 2), {}
    for name, (overrides, dtype, _) in GATHER_MODELS.items():
        full = peaked_model(tiny_config(**overrides)).to(dtype)
        sharded = copy.deepcopy(full)
        shard_model(sharded, tp)
        gathered = list(gather_state(sharded))                  # every tensor, mtp.* included
        if rank == 0:
            sharded.tp_driver = _Rank0Driver()
            state = full.state_dict()
            results[name] = {
                "names": [n for n, _ in gathered] == sorted(state),
                "equal": [n for n, t in gathered
                          if not (t.dtype == state[n].dtype and torch.equal(t, state[n]))],
                "hash": target_sha256(sharded), "full_hash": target_sha256(full),
                "shard_smaller": sharded.model.embed_tokens.weight.shape[0] * 2 == full.cfg.vocab_size}
        else:
            for _ in gather_state(sharded, ("mtp.",)):         # target_sha256's gather on rank 0
                pass
            results[name] = {"yielded": gathered}
        if name == "hybrid":        # closed after one tensor: the rest is still received (no hang)
            it = gather_state(sharded)
            next(it, None)
            it.close()
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(results))
    dist.destroy_process_group()


def test_gather_state_rebuilds_the_unsharded_model_and_its_target_hash(tmp_path):
    """gather_state over 2 gloo ranks yields on rank 0 every tensor of the unsharded model's state
    dict, equal bit for bit and in name order (dense, hybrid, MoE with whole experts per rank,
    one KV head replicated on both ranks, tied embeddings, bfloat16), and nothing on rank 1; so
    mode=distill's target_sha256 of rank 0's shard is the unsharded model's, which is the hash
    distill recorded before tensor parallelism."""
    mp.spawn(_gather_rank, args=(free_port(), str(tmp_path)), nprocs=2)
    r0 = json.loads((tmp_path / "rank0.json").read_text())
    r1 = json.loads((tmp_path / "rank1.json").read_text())
    assert set(r0) == set(r1) == set(GATHER_MODELS)
    for name, (_, _, want) in GATHER_MODELS.items():
        assert r0[name]["names"] and r0[name]["equal"] == [] and r0[name]["shard_smaller"], (name, r0[name])
        assert r0[name]["hash"] == r0[name]["full_hash"], name
        if want is not None:
            assert r0[name]["hash"] == want, name
        assert r1[name] == {"yielded": []}


class _CountingHandle:
    """A safe_open handle that adds the bytes of every tensor it hands out to `counter`."""

    def __init__(self, handle, counter: dict):
        self.h, self.counter = handle, counter

    def __enter__(self):
        self.h.__enter__()
        return self

    def __exit__(self, *exc):
        return self.h.__exit__(*exc)

    def get_tensor(self, name):
        t = self.h.get_tensor(name)
        self.counter["bytes"] += t.numel() * t.element_size()
        return t

    def get_slice(self, name):
        sl, counter = self.h.get_slice(name), self.counter

        class Slice:
            def get_shape(self):
                return sl.get_shape()

            def __getitem__(self, index):
                t = sl[index]
                counter["bytes"] += t.numel() * t.element_size()
                return t
        return Slice()

    def __getattr__(self, name):
        return getattr(self.h, name)


def _unique_bytes(model) -> int:
    return sum(p.numel() * p.element_size() for p in {id(p): p for p in model.parameters()}.values())


@pytest.mark.parametrize("layout", ["mtpx", "qwen3_next"])
def test_sharded_loading_reads_only_the_ranks_bytes(tmp_path, monkeypatch, layout):
    """load_shard reads, per rank, exactly the bytes of that rank's parameters (safetensors
    get_slice), and they equal the rank's slice of the fully loaded model: an mtpx folder
    (hybrid, 4 MTP modules) and a Hugging Face Qwen3-Next folder in 3 or more files (MoE, tied
    embeddings, its one mtp.* module)."""
    if layout == "mtpx":
        model = peaked_model(tiny_config()).float()
        from mtpx.train.checkpoint import save_checkpoint
        from mtpx.train.tokenizer import train_tokenizer
        folder = tmp_path / "mtpx"
        save_checkpoint(folder, model, train_tokenizer(["ab" * 50], 300))
    else:
        model = peaked_model(tiny_config(num_experts=4, tie_word_embeddings=True)).float()
        folder = export_model(model, tmp_path / "hf", "qwen3_next", num_modules=1, max_shard_bytes=400_000)
        assert len(list(folder.glob("*.safetensors"))) >= 3
    full, _ = loader.load_pretrained(folder)
    counter = {"bytes": 0}
    real_open = loader._safe_open
    monkeypatch.setattr(loader, "_safe_open", lambda f: _CountingHandle(real_open(f), counter))
    for rank in range(2):
        counter["bytes"] = 0
        shard, _ = load_shard(folder, TPGroup(rank, 2))
        assert counter["bytes"] == _unique_bytes(shard)
        assert counter["bytes"] < 0.6 * _unique_bytes(full)
        reference = copy.deepcopy(full)
        plan = shard_model(reference, TPGroup(rank, 2))
        assert plan.shards, "nothing was sharded"
        ref = reference.state_dict()
        for name, t in shard.state_dict().items():
            assert torch.equal(t, ref[name]), name


# ---- the engine ------------------------------------------------------------------------------------

PROMPTS = [[5, 17, 42, 9, 9, 100], [7] * 20, list(range(30, 70)), [250, 3, 4]]
RUNS = (("plain", {}), ("mtp1+prefix", {"enable_prefix_caching": True}), ("mtp8", {}),
        ("mtp8+preempt", {"num_blocks": 8}))    # a pool of 8 blocks: requests are preempted


def generate_all(folder, tp: int) -> dict:
    """{run: output tokens of PROMPTS (greedy) and of PROMPTS[0] sampled with seed 7} for each of
    RUNS, with tensor_parallel_size=tp, float64, one thread per rank."""
    params = [SamplingParams(max_tokens=24, ignore_eos=True)] * len(PROMPTS) + [
        SamplingParams(max_tokens=24, ignore_eos=True, temperature=1.0, seed=7)]
    threads, out = torch.get_num_threads(), {}
    try:
        for name, kw in RUNS:
            spec = name.split("+")[0]
            llm = LLM(model=folder, spec=None if spec == "plain" else spec, dtype="float64", threads=1,
                      tensor_parallel_size=tp, max_num_seqs=4, **kw)
            out[name] = [o.output_token_ids for o in llm.generate(PROMPTS + PROMPTS[:1], params)]
            if name == "mtp8+preempt":
                assert llm.engine.num_preemptions > 0, "the small pool preempted nothing"
            if name == "mtp8":      # a second engine over the same model (and ranks): eval's lossless check
                plain = LLM(model=llm.model, dtype="float64", tensor_parallel_size=tp, max_num_seqs=4)
                out["plain, same model"] = [o.output_token_ids
                                            for o in plain.generate(PROMPTS + PROMPTS[:1], params)]
                plain.shutdown()
            llm.shutdown()
    finally:
        torch.set_num_threads(threads)
    return out


def _generate_tp2(folder) -> dict:
    """generate_all(folder, 2) in a fresh process (its process group and worker stay out of pytest's)."""
    code = ("import json, sys; from tests.test_tensor_parallel import generate_all; "
            "print(json.dumps(generate_all(sys.argv[1], 2)))")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "-c", code, str(folder)], capture_output=True, text=True, env=env,
                          timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow      # 88 s on a 2-core AVX2 EPYC (the default suite took 39 min there)
def test_engine_tokens_tp2_equal_tp1(tiny_ckpt):
    """The engine's tokens with tensor_parallel_size=2 (a second process started by LLM) equal
    one process's: plain decoding, single-module MTP (prefix caching on), multi-module MTP (also
    with preemption), and
    plain decoding by a second LLM over the mtp8 LLM's model (the same worker processes); greedy
    prompts and one sampled (seeded) request."""
    one, two = generate_all(tiny_ckpt, 1), _generate_tp2(tiny_ckpt)
    assert set(two) == {name for name, _ in RUNS} | {"plain, same model"}
    for spec in two:
        assert all(len(t) == 24 for t in one[spec]), spec
        assert two[spec] == one[spec], spec
    assert one["plain"][:4] == one["mtp8"][:4] == one["mtp1+prefix"][:4]      # lossless greedy
    assert two["plain, same model"] == two["plain"]


_KILL_SCRIPT = """
import os, signal, sys
from mtpx import LLM, SamplingParams
from mtpx.parallel.spmd import TensorParallelError
llm = LLM(model=sys.argv[1], spec="mtp1", threads=1, tensor_parallel_size=2)
print(len(llm.generate([[5, 6, 7]], SamplingParams(max_tokens=4, ignore_eos=True))[0].output_token_ids))
worker = llm._tp_driver.procs[0]
os.kill(worker.pid, signal.SIGKILL)
worker.join(30)
try:
    llm.generate([[5, 6, 7]], SamplingParams(max_tokens=4, ignore_eos=True))
except TensorParallelError as err:
    print("ERROR", err)
    sys.exit(3)
print("no error")
"""


@pytest.mark.slow      # about 15 s: worker processes
def test_dead_worker_fails_rank0_with_a_clear_error(tiny_ckpt):
    """A killed worker makes rank 0's next step raise TensorParallelError naming the worker and its
    exit code (and the script exit), instead of waiting on the collective."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "-c", _KILL_SCRIPT, str(tiny_ckpt)], capture_output=True,
                          text=True, env=env, timeout=240)
    lines = done.stdout.strip().splitlines()
    assert done.returncode == 3, done.stdout + done.stderr[-3000:]
    assert lines[0] == "4"
    assert lines[-1].startswith("ERROR tensor-parallel worker rank 1 (pid ")
    assert ("exited with code -9: the engine cannot continue; restart it (engine.tensor_parallel_size=2)"
            in lines[-1])


# ---- bad input: one line naming the key -----------------------------------------------------------

def test_tensor_parallel_size_is_validated(tiny_model):
    with pytest.raises(ValueError, match=r"^engine.tensor_parallel_size=0: must be an integer >= 1$"):
        EngineConfig(tensor_parallel_size=0)
    with pytest.raises(ValueError, match=r"^model config vocab_size=63 is not divisible by 2 with "
                                         r"engine.tensor_parallel_size=2: choose a tensor_parallel_size that "
                                         r"divides it$"):
        check_shardable(tiny_config(vocab_size=63), 2)
    with pytest.raises(ValueError, match=r"num_key_value_heads=2 with engine.tensor_parallel_size=3"):
        check_shardable(tiny_config(num_attention_heads=6, vocab_size=66, linear_num_key_heads=3,
                                    linear_num_value_heads=6, intermediate_size=129), 3)
    with pytest.raises(ValueError, match=r"engine.tensor_parallel_size=2 but the model is split over 1 rank"):
        Engine(tiny_model, None, tensor_parallel_size=2)
    with pytest.raises(ValueError,
                       match=r"engine.tensor_parallel_size=2 needs a checkpoint folder \(model=PATH\)"):
        LLM(model=tiny_model, tensor_parallel_size=2)
    check_shardable(tiny_config(), 2)                  # the tiny model splits


# ---- mode=serve ------------------------------------------------------------------------------------

def _children(pid: int) -> list[int]:
    return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds the worker's pid in /proc")
@pytest.mark.slow      # about 8-11 s: subprocesses
def test_serve_tp2_answers_openai_like_tp1_and_exits_when_a_worker_dies(tiny_ckpt, tmp_path):
    """`mode=serve engine.tensor_parallel_size=2` answers the openai client with the text of
    TP=1's LLM.generate; after its worker is killed, the next request fails with the
    TensorParallelError line and the server exits with code 1 instead of hanging."""
    import signal
    import time

    import httpx
    openai = pytest.importorskip("openai")
    prompt = "def f(x):"
    (ref,) = LLM(model=tiny_ckpt, spec="mtp8", num_speculative_tokens=2).generate(
        [prompt], SamplingParams(max_tokens=12, ignore_eos=True))
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(ROOT / "train_or_eval.py"), "mode=serve",
                             f"serve.port={port}", f"model.path={tiny_ckpt}", "+spec=mtp8",
                             "spec.num_speculative_tokens=2", "logger=none", "engine.tensor_parallel_size=2",
                             f"hydra.run.dir={tmp_path}"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        t0 = time.time()
        while True:
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            assert time.time() - t0 < 180, "the server did not start"
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.3)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0)
        r = client.completions.create(model=tiny_ckpt.name, prompt=prompt, max_tokens=12, temperature=0,
                                      extra_body={"ignore_eos": True})
        assert r.choices[0].text == ref.text
        (worker,) = _children(proc.pid)
        os.kill(worker, signal.SIGKILL)
        r = httpx.post(f"http://127.0.0.1:{port}/v1/completions", timeout=60,
                       json={"model": tiny_ckpt.name, "prompt": prompt, "max_tokens": 4})
        assert r.status_code >= 400
        message = r.json()["error"]["message"]
        assert message.startswith(f"engine step failed: TensorParallelError: tensor-parallel worker rank 1 "
                                  f"(pid {worker}) exited with code -9: the engine cannot continue"), message
        assert proc.wait(timeout=60) == 1
        assert "mode=serve stopped: engine step failed: TensorParallelError" in proc.communicate()[1]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


_TORCHRUN_SCRIPT = """
import json, os, sys
from mtpx import LLM, SamplingParams
llm = LLM(model=sys.argv[1], spec="mtp8", dtype="float64", threads=1, tensor_parallel_size=2)
outs = llm.generate(json.loads(sys.argv[2]), SamplingParams(max_tokens=16, ignore_eos=True))
print("RANK", os.environ["RANK"], json.dumps([o.output_token_ids for o in outs]))
llm.shutdown()
"""


@pytest.mark.slow      # about 8-11 s: subprocesses
def test_torchrun_ranks_run_one_engine(tiny_ckpt, tmp_path):
    """Under `torchrun --nproc_per_node=2` rank 0 runs the script and rank 1 becomes the worker
    when it builds its LLM (and exits with 0 at rank 0's shutdown): only rank 0 prints, with
    TP=1's tokens."""
    ref = LLM(model=tiny_ckpt, spec="mtp8", dtype="float64").generate(
        PROMPTS[:2], SamplingParams(max_tokens=16, ignore_eos=True))
    script = tmp_path / "run.py"
    script.write_text(_TORCHRUN_SCRIPT)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
                           f"--master_port={free_port()}", str(script), str(tiny_ckpt),
                           json.dumps(PROMPTS[:2])],
                          capture_output=True, text=True, env=env, timeout=240, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [line for line in done.stdout.splitlines() if line.startswith("RANK")]
    assert lines == ["RANK 0 " + json.dumps([o.output_token_ids for o in ref])]
