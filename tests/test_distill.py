"""mode=distill (mtpx/distill.py) and the data source that reads it (train.data_sources=[distill]):
the shards hold exactly what LLM.generate returns for the same prompts, a rerun resumes (written
shards kept, finished records of a cut shard re-read, not regenerated), other settings are
refused, ranks split the shards, Ctrl-C keeps what finished, and training reads the target's own
token ids."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from mtpx import LLM, SamplingParams
from mtpx.cli import run
from mtpx.data.distilled import read_distilled, shard_name
from mtpx.data.gsm8k import format_prompt
from mtpx.distill import target_sha256
from mtpx.train import checkpoint as ckpt
from mtpx.train.data import TokenizedDocument, encode_documents, read_distill
from mtpx.train.loop import train
from mtpx.train.tokenizer import encode, tokenizer_sha256, train_tokenizer
from tests.test_train import write_synthetic_gsm8k

ROOT = Path(__file__).resolve().parents[1]
CONF = str(ROOT / "conf")
NUM_PROMPTS, SHARD, MAX_TOKENS = 7, 3, 8


def _overrides(tiny_ckpt, data: Path, out: Path, *extra: str) -> list[str]:
    return ["mode=distill", f"model.path={tiny_ckpt}", "data=gsm8k", f"data.path={data}",
            f"distill.out_dir={out}", f"distill.num_prompts={NUM_PROMPTS}", f"distill.shard_size={SHARD}",
            f"distill.max_tokens={MAX_TOKENS}", "distill.threads=1", "logger=none", *extra]


def _cfg(tiny_ckpt, data: Path, out: Path, *extra: str):
    with initialize_config_dir(config_dir=CONF, version_base=None):
        return compose("config", overrides=_overrides(tiny_ckpt, data, out, *extra))


@pytest.fixture(scope="module")
def gsm8k(tmp_path_factory) -> Path:
    return write_synthetic_gsm8k(tmp_path_factory.mktemp("distill") / "train.jsonl", n=20)


@pytest.fixture(scope="module")
def reference(tiny_ckpt, gsm8k) -> list:
    """Plain greedy decoding of the same prompts through LLM.generate."""
    qs = [json.loads(line)["question"] for line in gsm8k.read_text().splitlines()[:NUM_PROMPTS]]
    llm = LLM(model=tiny_ckpt)
    return [(format_prompt(q), o) for q, o in
            zip(qs, llm.generate([format_prompt(q) for q in qs], SamplingParams(max_tokens=MAX_TOKENS)))]


@pytest.fixture(scope="module")
def distilled(tiny_ckpt, gsm8k, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("distilled") / "run"
    assert run(_cfg(tiny_ckpt, gsm8k, out, "+spec=mtp8", "spec.num_speculative_tokens=2")) == 0
    return out


def _shards(out: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(out.glob("shard-*"))}


def test_shards_hold_the_targets_greedy_outputs(distilled, reference, tiny_ckpt):
    manifest, records = read_distilled(distilled)
    assert sorted(_shards(distilled)) == [shard_name(i, 3) for i in range(3)]
    assert [r.index for r in records] == list(range(NUM_PROMPTS))
    for r, (prompt, o) in zip(records, reference):       # mtp8 speculation: token-identical to plain
        assert r.prompt == prompt and r.prompt_token_ids == o.prompt_token_ids
        assert r.completion_token_ids == o.output_token_ids and r.completion == o.text
        assert r.finish_reason == o.finish_reason and r.error is None
    model, tok = ckpt.load_model(tiny_ckpt)
    assert manifest["model"]["target_sha256"] == target_sha256(model)
    assert manifest["tokenizer_sha256"] == tokenizer_sha256(tok)
    assert manifest["num_prompts"] == NUM_PROMPTS and manifest["num_shards"] == 3
    assert manifest["sampling"]["temperature"] == 0 and manifest["sampling"]["max_tokens"] == MAX_TOKENS
    assert manifest["speculator"] == {"method": "mtp8", "num_speculative_tokens": 2}


def test_target_hash_ignores_draft_modules_and_sees_target_weights(tiny_ckpt):
    model, _ = ckpt.load_model(tiny_ckpt)
    h = target_sha256(model)
    with torch.no_grad():
        model.mtp[0].fc.weight.add_(1.0)
    assert target_sha256(model) == h
    with torch.no_grad():
        model.lm_head.weight[0, 0] += 1e-3
    assert target_sha256(model) != h


def test_rerun_resumes_from_part_files_and_keeps_written_shards(distilled, tiny_ckpt, gsm8k, tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    for f in distilled.iterdir():
        (out / f.name).write_bytes(f.read_bytes())
    before = _shards(out)
    name1 = shard_name(1, 3)
    rows = [json.loads(line) for line in before[name1].splitlines()]
    (out / name1).unlink()
    kept = dict(rows[0], completion="kept from the .part file")  # a record the rerun must not regenerate
    (out / (name1 + ".part")).write_text(json.dumps(kept) + "\n" + json.dumps(rows[1])[:20])  # + a cut line
    # written: not touched
    (out / shard_name(0, 3)).write_text(before[shard_name(0, 3)].replace("Tom", "Tim"))
    assert run(_cfg(tiny_ckpt, gsm8k, out)) == 0
    after = _shards(out)
    assert after[shard_name(0, 3)] == before[shard_name(0, 3)].replace("Tom", "Tim")
    assert after[shard_name(2, 3)] == before[shard_name(2, 3)]
    assert [json.loads(line) for line in after[name1].splitlines()] == [kept, *rows[1:]]
    assert not list(out.glob("*.part"))


@pytest.mark.parametrize("override, key", [("distill.max_tokens=9", "sampling"),
                                           ("distill.shard_size=2", "shard_size"),
                                           ("distill.num_prompts=6", "prompts_sha256")])
def test_rerun_with_other_settings_is_refused(distilled, tiny_ckpt, gsm8k, capsys, override, key):
    before = _shards(distilled)
    assert run(_cfg(tiny_ckpt, gsm8k, distilled, override)) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert (err.startswith("error: distill.out_dir=") and f"another {key}" in err
            and "new distill.out_dir" in err)
    assert _shards(distilled) == before


def test_ranks_split_the_shards(distilled, tiny_ckpt, gsm8k, tmp_path, monkeypatch):
    out = tmp_path / "ranks"
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    assert run(_cfg(tiny_ckpt, gsm8k, out)) == 0
    assert sorted(_shards(out)) == [shard_name(1, 3)]
    with pytest.raises(ValueError, match="2 of 3 shards are not written yet.*rerun the same mode=distill"):
        read_distilled(out)
    monkeypatch.setenv("RANK", "0")
    assert run(_cfg(tiny_ckpt, gsm8k, out)) == 0
    assert _shards(out) == _shards(distilled)


def test_ctrl_c_keeps_finished_records(distilled, tiny_ckpt, gsm8k, tmp_path, monkeypatch):
    """Ctrl-C after a few engine steps: exit 130, every finished request is in a shard or a .part
    file, and the same command then completes the data exactly."""
    import mtpx.distill as distill

    class StopAfter:
        steps = 0

        def __init__(self):
            pass

        @property
        def requested(self):
            StopAfter.steps += 1
            return StopAfter.steps > 12

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return None

    monkeypatch.setattr(distill, "GracefulInterrupt", StopAfter)
    out = tmp_path / "cut"
    assert run(_cfg(tiny_ckpt, gsm8k, out, "distill.concurrency=2")) == 130
    finished = [json.loads(line) for p in out.glob("shard-*") for line in p.read_text().splitlines() if line]
    assert 0 < len(finished) < NUM_PROMPTS
    monkeypatch.undo()
    assert run(_cfg(tiny_ckpt, gsm8k, out)) == 0
    assert _shards(out) == _shards(distilled)


def test_stop_strings_end_completions_and_are_recorded(tiny_ckpt, gsm8k, tmp_path):
    llm = LLM(model=tiny_ckpt)
    _, ref = read_distilled(_plain_run(tiny_ckpt, gsm8k, tmp_path / "plain"))
    stop = next(c for r in ref for c in r.completion[1:] if c.isalnum())   # a letter some completion writes
    out = tmp_path / "stopped"
    assert run(_cfg(tiny_ckpt, gsm8k, out, f"distill.stop=['{stop}']")) == 0
    manifest, records = read_distilled(out)
    assert manifest["sampling"]["stop"] == [stop]
    for r in records:
        want = llm.generate([r.prompt], SamplingParams(max_tokens=MAX_TOKENS, stop=[stop]))[0]
        assert r.completion == want.text and stop not in r.completion
        assert r.completion_token_ids == want.output_token_ids
    assert any(r.finish_reason == "stop" and len(r.completion) < len(o.completion)
               for r, o in zip(records, ref))


def _plain_run(tiny_ckpt, gsm8k, out: Path) -> Path:
    assert run(_cfg(tiny_ckpt, gsm8k, out)) == 0
    return out


def test_bad_distill_settings_get_one_line(tiny_ckpt, gsm8k, tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    for out, extra, want in [
        (tmp_path / "file", [], "is a file: choose a folder"),
        (tmp_path / "other", [], "was not written by mode=distill"),
        (tmp_path / "new", ["distill.shard_size=0"], "distill.shard_size=0: must be an integer >= 1"),
        (tmp_path / "new", ["distill.temperature=-1"], "distill.temperature=-1"),
        (tmp_path / "new", ["distill.stop=['']"], "distill.stop="),
    ]:
        assert run(_cfg(tiny_ckpt, gsm8k, out, *extra)) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and want in err[0], err
    assert (tmp_path / "other" / "notes.txt").read_text() == "mine"


# ---- the training side ------------------------------------------------------------------------------


def test_training_uses_the_generated_token_ids(distilled, tiny_ckpt):
    """With the generating tokenizer the documents are the target's own tokens (prompt +
    completion, the final eos dropped: packing adds one); with another tokenizer, the text re-encoded."""
    manifest, records = read_distilled(distilled)
    docs = read_distill(distilled)
    eos = set(manifest["eos_token_ids"])
    for d, r in zip(docs, records):
        ids = r.prompt_token_ids + r.completion_token_ids
        assert list(d.token_ids) == (ids[:-1] if ids[-1] in eos else ids)
        assert d.text == r.prompt + r.completion
    _, tok = ckpt.load_model(tiny_ckpt)
    odd = TokenizedDocument("ab", (5, 6, 7), tokenizer_sha256(tok))    # not what "ab" encodes to
    assert encode_documents(tok, [odd, "ab"]) == [(5, 6, 7), encode(tok, "ab")]
    other = train_tokenizer(["something else entirely " * 20], 270)
    assert encode_documents(other, [odd]) == [encode(other, "ab")]


def test_frozen_target_trains_heads_on_distilled_data(distilled, tiny_ckpt, tmp_path):
    cfg = {"model": {"path": str(tiny_ckpt)}, "data": {}, "train": dict(
        out_dir=str(tmp_path / "heads"), steps=3, batch_size=2, seq_len=16, lr=1e-3, min_lr=1e-4,
        warmup_steps=1, weight_decay=0.0, grad_clip=1.0, mtp_loss_weight=1.0, freeze_base=True, eval_every=0,
        eval_batches=1, save_every=0, resume=True, seed=0, tokenizer_vocab_size=300, data_sources=["distill"],
        distill_path=str(distilled), log_every=1, threads=1, val_fraction=0.2)}
    out = train(cfg)
    before, _ = ckpt.load_model(tiny_ckpt)
    after, _ = ckpt.load_model(out)
    b, a = before.state_dict(), after.state_dict()
    assert all(torch.equal(b[k], a[k]) for k in b if not k.startswith("mtp."))
    assert any(not torch.equal(b[k], a[k]) for k in b if k.startswith("mtp."))


def test_distill_path_takes_a_list_of_folders(distilled):
    """train.distill_path=[A,B] concatenates the folders' documents in order (a data mix)."""
    from mtpx.train.data import load_documents, parse_data_sources
    specs = parse_data_sources(["distill"])
    one = load_documents(specs, distill_path=str(distilled))["distill"]
    assert one == read_distill(distilled) and len(one) == NUM_PROMPTS
    assert load_documents(specs, distill_path=[str(distilled), distilled])["distill"] == one + one
    assert load_documents(specs, distill_path=OmegaConf.create([str(distilled)]))["distill"] == one
    for bad in (5, [str(distilled), 3]):
        with pytest.raises(ValueError, match="train.distill_path=.*give a mode=distill folder or a list"):
            load_documents(specs, distill_path=bad)


def test_distill_n_is_one_folder_with_its_own_weight(distilled):
    """'distill.N' is folder N of the train.distill_path list, a source of its own (own weight);
    training from shards takes train.data_sources' weights when it names the shards' sources."""
    from mtpx.train.data import load_documents, parse_data_sources
    from mtpx.train.shard_training import source_weights
    specs = parse_data_sources(["distill.0:3", "distill.1"])
    assert [(s.name, s.weight) for s in specs] == [("distill.0", 3.0), ("distill.1", 1.0)]
    docs = load_documents(specs, distill_path=[str(distilled), str(distilled)])
    assert list(docs) == ["distill.0", "distill.1"] and docs["distill.0"] == read_distill(distilled)
    with pytest.raises(ValueError, match="'distill.2' is folder 2 of train.distill_path, which lists 2"):
        load_documents(parse_data_sources(["distill.2"]), distill_path=[str(distilled), str(distilled)])
    with pytest.raises(ValueError, match="unknown data source 'distill.x'"):
        parse_data_sources(["distill.x"])
    manifest = {"sources": ["distill.0", "distill.1"], "weights": [1.0, 1.0]}
    t = OmegaConf.create({"data_sources": ["distill.0:3", "distill.1"]})
    assert source_weights(t, manifest) == [3.0, 1.0]
    assert source_weights(OmegaConf.create({"data_sources": ["distill"]}), manifest) == [1.0, 1.0]


def test_train_distill_source_errors_name_the_key(tmp_path):
    from mtpx.train.data import load_documents, parse_data_sources
    specs = parse_data_sources(["distill"])
    with pytest.raises(ValueError, match="needs train.distill_path"):
        load_documents(specs)
    with pytest.raises(FileNotFoundError, match="train.distill_path=.*no manifest.json"):
        load_documents(specs, distill_path=tmp_path)


def test_sigterm_keeps_finished_records_and_exits_143(distilled, tiny_ckpt, gsm8k, tmp_path, monkeypatch,
                                                      capsys):
    """A real SIGTERM after a few engine steps (sent to this process through the real handler):
    as Ctrl-C, exit 143 with one line, and the same command completes the data exactly."""
    import mtpx.distill as distill
    from tests.helpers import sigterm_after

    monkeypatch.setattr(distill, "GracefulInterrupt", sigterm_after(12))
    out = tmp_path / "cut"
    assert run(_cfg(tiny_ckpt, gsm8k, out, "distill.concurrency=2")) == 143
    assert "interrupted by SIGTERM: " in capsys.readouterr().err
    finished = [json.loads(line) for p in out.glob("shard-*") for line in p.read_text().splitlines() if line]
    assert 0 < len(finished) < NUM_PROMPTS
    monkeypatch.undo()
    assert run(_cfg(tiny_ckpt, gsm8k, out)) == 0
    assert _shards(out) == _shards(distilled)


# ---- tensor parallelism ------------------------------------------------------------------------------

SPEC = ("+spec=mtp8", "spec.num_speculative_tokens=2")       # the `distilled` fixture's speculator


def _distill_tp2(tiny_ckpt, gsm8k, out: Path, run_dir: Path, *launcher: str) -> str:
    """`python train_or_eval.py mode=distill ... engine.tensor_parallel_size=2` (or under
    `launcher`, e.g. torchrun) in a subprocess with _cfg's settings; returns its stdout."""
    cmd = [*(launcher or [sys.executable]), str(ROOT / "train_or_eval.py"),
           *_overrides(tiny_ckpt, gsm8k, out, *SPEC, "engine.tensor_parallel_size=2",
                       f"hydra.run.dir={run_dir}")]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env=dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT)))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return done.stdout


# about 18 s: a tensor-parallel subprocess (tests/test_tensor_parallel.py covers the sharded forward)
@pytest.mark.slow
def test_tensor_parallel_distill_equals_one_process(distilled, tiny_ckpt, gsm8k, tmp_path):
    """engine.tensor_parallel_size=2 (a worker process started by rank 0) writes TP=1's shards
    byte for byte and the same manifest: the target hash is of the whole model gathered from
    both ranks, not of rank 0's shard, so either run resumes the other's folder."""
    out = tmp_path / "tp2"
    stdout = _distill_tp2(tiny_ckpt, gsm8k, out, tmp_path / "run")
    assert "rank 0 of 1: 3 shards to write" in stdout
    assert _shards(out) == _shards(distilled)
    tp1, tp2 = read_distilled(distilled)[0], read_distilled(out)[0]
    assert (tp2["model"]["target_sha256"] == tp1["model"]["target_sha256"]
            == target_sha256(ckpt.load_model(tiny_ckpt)[0]))
    assert tp2 == tp1
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json"] + sorted(_shards(distilled))


@pytest.mark.slow      # about 10 s: a tensor-parallel subprocess
def test_tensor_parallel_distill_resumes_an_interrupted_folder(distilled, tiny_ckpt, gsm8k, tmp_path):
    """TP=2 resumes a folder cut short (one shard written, one with a .part file holding one
    finished record and a cut line, one not started) as TP=1 does: the written shard and the
    .part record are kept, the rest is generated with TP=1's tokens."""
    out = tmp_path / "run"
    out.mkdir()
    for f in distilled.iterdir():
        (out / f.name).write_bytes(f.read_bytes())
    before = _shards(out)
    name0, name1, name2 = (shard_name(i, 3) for i in range(3))
    rows = [json.loads(line) for line in before[name1].splitlines()]
    (out / name1).unlink()
    (out / name2).unlink()
    kept = dict(rows[0], completion="kept from the .part file")
    (out / (name1 + ".part")).write_text(json.dumps(kept) + "\n" + json.dumps(rows[1])[:20])
    (out / name0).write_text(before[name0].replace("Tom", "Tim"))
    stdout = _distill_tp2(tiny_ckpt, gsm8k, out, tmp_path / "hydra")
    assert "2 shards to write" in stdout
    after = _shards(out)
    assert after[name0] == before[name0].replace("Tom", "Tim")
    assert [json.loads(line) for line in after[name1].splitlines()] == [kept, *rows[1:]]
    assert after[name2] == before[name2]
    assert not list(out.glob("*.part"))


@pytest.mark.slow      # about 12 s: torchrun
def test_tensor_parallel_distill_under_torchrun(distilled, tiny_ckpt, gsm8k, tmp_path):
    """`torchrun --nproc_per_node=2 ... engine.tensor_parallel_size=2`: the two processes are the
    ranks of one engine (not two distill ranks splitting the shards): rank 0 writes every shard,
    TP=1's, and rank 1 (the worker) writes nothing."""
    from mtpx.parallel.spmd import free_port
    out = tmp_path / "tp2"
    _distill_tp2(tiny_ckpt, gsm8k, out, tmp_path / "run", sys.executable, "-m", "torch.distributed.run",
                 "--nproc_per_node=2", f"--master_port={free_port()}")
    assert _shards(out) == _shards(distilled)
    assert read_distilled(out)[0] == read_distilled(distilled)[0]
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json"] + sorted(_shards(distilled))
