"""Training package: tokenizer, corpora, batching, LR schedule and the loop (learning, resume,
exact restart after a crash, frozen target). Tiny models on a synthetic GSM8K-style corpus."""
from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from mtpx.data.prompts import STDLIB_HELDOUT_MODULES
from mtpx.train import checkpoint as ckpt
from mtpx.train.data import (
    BatchSampler,
    PackedCorpus,
    load_documents,
    pack_corpus,
    pack_documents,
    parse_data_sources,
    read_gsm8k,
    split_documents,
    stdlib_dir,
    stdlib_files,
    val_batches,
)
from mtpx.train.loop import lr_at, train
from mtpx.train.tokenizer import (
    decode,
    encode,
    eos_token_id,
    load_tokenizer,
    pad_token_id,
    save_tokenizer,
    train_tokenizer,
)

TINY_MODEL = dict(
    hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
    head_dim=16, linear_num_key_heads=1, linear_num_value_heads=2, linear_key_head_dim=16,
    linear_value_head_dim=16, num_nextn_predict_layers=2, max_position_embeddings=64,
)


def write_synthetic_gsm8k(path: Path, n: int = 300) -> Path:
    """GSM8K-shaped JSONL of simple sums: learnable structure, so every depth's loss can drop fast."""
    rng = random.Random(0)
    with path.open("w") as f:
        for _ in range(n):
            a, b = rng.randint(1, 50), rng.randint(1, 50)
            q = f"Tom has {a} apples and buys {b} more. How many apples does Tom have?"
            ans = f"Tom has {a} + {b} = <<{a}+{b}={a + b}>>{a + b} apples.\n#### {a + b}"
            f.write(json.dumps({"question": q, "answer": ans}) + "\n")
    return path


def run_cfg(tmp: Path, out: str, **train_overrides) -> dict:
    t = dict(
        out_dir=str(tmp / out), steps=12, batch_size=8, seq_len=32, lr=3e-3, min_lr=3e-4, warmup_steps=3,
        weight_decay=0.1, grad_clip=1.0, mtp_loss_weight=0.3, freeze_base=False, eval_every=6, eval_batches=2,
        save_every=0, resume=True, seed=0, tokenizer_vocab_size=320, data_sources=["gsm8k"],
        gsm8k_path=str(tmp / "gsm8k.jsonl"), log_every=2, threads=1,
    )
    t.update(train_overrides)
    return {"model": dict(TINY_MODEL), "train": t, "data": {}}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("train")
    write_synthetic_gsm8k(tmp / "gsm8k.jsonl")
    return tmp


@pytest.fixture(scope="module")
def learned_run(workdir) -> tuple[Path, list[tuple[dict, int]]]:
    """A 40-step run with its log_fn calls recorded (shared by several tests)."""
    calls: list[tuple[dict, int]] = []
    out = train(run_cfg(workdir, "learn", steps=40, eval_every=20), log_fn=lambda d, s: calls.append((d, s)))
    return out, calls


# ---- tokenizer ----------------------------------------------------------------------------------


def test_tokenizer_special_ids_roundtrip_and_save(tmp_path):
    texts = ["def f(x):\n    return x + 1\n", "Question: 2+2?\nAnswer: 4", "héllo wörld ∑ 🙂"] * 20
    tok = train_tokenizer(texts, 300)
    assert eos_token_id(tok) == 0 and pad_token_id(tok) == 1
    assert tok.get_vocab_size() <= 300
    for s in texts[:3] + ["never seen: ∂x/∂t 中文"]:  # byte-level: anything encodes, decoding is exact
        assert decode(tok, encode(tok, s)) == s
    assert decode(tok, encode(tok, "a") + [0]) == "a"  # special tokens dropped by default
    file = save_tokenizer(tok, tmp_path)
    assert file.name == "tokenizer.json"
    assert load_tokenizer(tmp_path).to_str() == tok.to_str()
    with pytest.raises(ValueError, match="tokenizer_vocab_size"):
        train_tokenizer(texts, 100)
    with pytest.raises(FileNotFoundError, match="no tokenizer"):
        load_tokenizer(tmp_path / "nope")


# ---- data -----------------------------------------------------------------------------------------


def test_parse_data_sources():
    specs = parse_data_sources(["gsm8k", "stdlib:0.5"])
    assert [(s.name, s.weight) for s in specs] == [("gsm8k", 1.0), ("stdlib", 0.5)]
    with pytest.raises(ValueError, match="unknown data source 'wiki'"):
        parse_data_sources(["wiki"])
    with pytest.raises(ValueError, match="must be a number"):
        parse_data_sources(["gsm8k:x"])
    with pytest.raises(ValueError, match="must be > 0"):
        parse_data_sources(["gsm8k:0"])
    with pytest.raises(ValueError, match="listed twice"):
        parse_data_sources(["gsm8k", "gsm8k:2"])
    with pytest.raises(ValueError, match="empty"):
        parse_data_sources([])


def test_read_gsm8k_formats_records_and_names_bad_lines(tmp_path):
    from mtpx.data.gsm8k import format_example

    good = {"question": "What is 1+1?", "answer": "1+1=2\n#### 2"}
    f = tmp_path / "g.jsonl"
    f.write_text(json.dumps(good) + "\n\n" + json.dumps(good) + "\n")
    assert read_gsm8k(f) == [format_example(good["question"], good["answer"])] * 2
    assert read_gsm8k(f)[0].startswith("Question: What is 1+1?\nAnswer: 1+1=2")

    f.write_text(json.dumps(good) + "\n" + json.dumps(good) + "\n{not json\n")
    with pytest.raises(ValueError, match=r"g\.jsonl:3: malformed JSON"):
        read_gsm8k(f)
    f.write_text(json.dumps({"question": "q"}) + "\n")
    with pytest.raises(ValueError, match=r"g\.jsonl:1: key 'answer' is missing"):
        read_gsm8k(f)
    with pytest.raises(FileNotFoundError, match="train.gsm8k_path"):
        read_gsm8k(tmp_path / "missing.jsonl")
    f.write_text(json.dumps({"question": "q", "answer": "no marker"}) + "\n")
    with pytest.raises(ValueError, match=r"g\.jsonl:1: the answer has no '####' line"):
        read_gsm8k(f)
    f.write_text("\n")
    with pytest.raises(ValueError, match="holds no records"):
        read_gsm8k(f)
    f.write_bytes(b"\xff\xfe")
    with pytest.raises(ValueError, match="not UTF-8"):
        read_gsm8k(f)


def test_stdlib_subset_is_deterministic_budgeted_and_excludes_heldout():
    files = stdlib_files(max_bytes=300_000)
    assert files == stdlib_files(max_bytes=300_000)
    assert 0 < sum(p.stat().st_size for p in files) <= 300_000
    rels = {p.relative_to(stdlib_dir()).as_posix() for p in files}
    all_rels = {p.relative_to(stdlib_dir()).as_posix() for p in stdlib_files()}
    assert not set(STDLIB_HELDOUT_MODULES) & all_rels  # held-out eval files never train
    assert all(r.endswith(".py") and not r.startswith(("test/", "site-packages/")) for r in all_rels)
    assert rels < all_rels


def test_split_pack_and_deterministic_batches():
    docs = [f"doc {i}" for i in range(40)]
    train_docs, val_docs = split_documents(docs, 0.1, seed=0)
    assert len(val_docs) == 4 and sorted(train_docs + val_docs) == sorted(docs)
    assert split_documents(docs, 0.1, seed=0) == (train_docs, val_docs)

    blocks = pack_documents([[5, 6, 7], [8, 9], [10]], eos_id=0, seq_len=4)  # 5 6 7 0 | 8 9 0 10 | (0)
    assert blocks.tolist() == [[5, 6, 7, 0], [8, 9, 0, 10]] and blocks.dtype == torch.long

    # two sources of very different size, mixed 3:1 regardless of size
    corpus = PackedCorpus(
        blocks=torch.arange(100 * 4).view(100, 4), source_id=torch.tensor([0] * 90 + [1] * 10),
        sources=["a", "b"], weights=[1.0, 3.0],
    )
    s1, s2 = BatchSampler(corpus, 16, seed=3), BatchSampler(corpus, 16, seed=3)
    assert torch.equal(s1.batch(7), s2.batch(7))  # pure function of (seed, step)
    assert not torch.equal(s1.batch(7), s1.batch(8))
    it = s1.iterate(start_step=5)
    assert [next(it)[0] for _ in range(3)] == [5, 6, 7]
    assert torch.equal(next(s2.iterate(start_step=9))[1], s1.batch(9))
    rows = torch.cat([s1.batch(i) for i in range(200)])
    frac_b = (rows[:, 0] >= 90 * 4).float().mean().item()
    assert abs(frac_b - 0.75) < 0.03

    vb = val_batches(corpus, batch_size=8, num_batches=3)
    assert len(vb) == 3 and vb[0].shape == (8, 4) and torch.equal(vb[0], val_batches(corpus, 8, 3)[0])
    empty = PackedCorpus(torch.empty(0, 4, dtype=torch.long), torch.empty(0, dtype=torch.long), ["a"], [1.0])
    with pytest.raises(ValueError, match="lower train.seq_len"):
        BatchSampler(empty, 4, 0)


def test_two_sources_mix_by_weight_not_size(tmp_path):
    gsm = write_synthetic_gsm8k(tmp_path / "g.jsonl", n=100)
    specs = parse_data_sources(["gsm8k:3", "stdlib"])
    docs = load_documents(specs, gsm8k_path=gsm, stdlib_max_bytes=60_000)
    assert docs["gsm8k"][0].startswith("Question: Tom has") and len(docs["stdlib"]) >= 1
    tok = train_tokenizer((d for ds in docs.values() for d in ds), 300)
    corpus = pack_corpus(docs, {s.name: s.weight for s in specs}, tok, seq_len=32)
    assert corpus.sources == ["gsm8k", "stdlib"] and all(n > 0 for n in corpus.num_tokens().values())
    p = corpus.block_probs()
    assert p[corpus.source_id == 0].sum().item() == pytest.approx(0.75)
    assert p[corpus.source_id == 1].sum().item() == pytest.approx(0.25)
    eos_rows = (corpus.blocks == eos_token_id(tok)).any(1)
    assert eos_rows.any()  # documents are separated by <|endoftext|>


def test_lr_schedule_warmup_then_cosine():
    kw = dict(lr=1.0, min_lr=0.1, warmup_steps=10, steps=110)
    assert lr_at(0, **kw) == pytest.approx(0.1) and lr_at(9, **kw) == pytest.approx(1.0)
    assert lr_at(10, **kw) == pytest.approx(1.0)
    assert lr_at(60, **kw) == pytest.approx(0.55)
    assert lr_at(110, **kw) == pytest.approx(0.1) and lr_at(500, **kw) == pytest.approx(0.1)
    lrs = [lr_at(s, **kw) for s in range(10, 111)]
    assert all(a >= b for a, b in zip(lrs, lrs[1:]))


# ---- the loop --------------------------------------------------------------------------------------


def test_training_lowers_the_loss_of_every_depth(learned_run):
    out, calls = learned_run
    state = ckpt.load_trainer_state(out)
    hist = state["loss_history"]
    depths = ["main", "mtp1", "mtp2"]
    train_h = [h for h in hist if h["split"] == "train"]
    val_h = [h for h in hist if h["split"] == "val"]
    assert [h["step"] for h in train_h] == list(range(1, 41))
    assert [h["step"] for h in val_h] == [0, 20, 40]
    for d in depths:
        first = sum(h[d] for h in train_h[:5]) / 5
        last = sum(h[d] for h in train_h[-5:]) / 5
        assert last < first - 0.5, (d, first, last)
        assert val_h[-1][d] < val_h[0][d] - 0.5, (d, val_h[0][d], val_h[-1][d])
    # artifacts: csv (header + one row per history entry), png, resumable state
    lines = (out / "losses.csv").read_text().splitlines()
    assert lines[0] == "step,split,lr,loss,grad_norm,main,mtp1,mtp2" and len(lines) == 1 + len(hist)
    assert (out / "loss_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert state["step"] == 40 and state["config"]["train"]["steps"] == 40
    # log_fn: train metrics every log_every=2 steps, val metrics at each eval
    train_calls = [s for d, s in calls if "train/main" in d]
    assert train_calls == list(range(2, 41, 2))
    assert ({"train/loss", "train/mtp1", "train/mtp2", "train/lr", "train/grad_norm"}
            <= set(calls[-2][0]) | set(calls[-1][0]))
    assert [s for d, s in calls if "val/mtp2" in d] == [0, 20, 40]
    # vocab comes from the trained tokenizer
    model, tok = ckpt.load_model(out)
    assert model.cfg.vocab_size == tok.get_vocab_size() <= 320


def test_resume_extends_a_finished_run(workdir):
    out = train(run_cfg(workdir, "extend", steps=8, eval_every=4))
    first = ckpt.load_trainer_state(out)
    assert first["step"] == 8
    calls = []
    out = train(run_cfg(workdir, "extend", steps=14, eval_every=4, log_every=1),
                log_fn=lambda d, s: calls.append(s))
    assert calls[0] == 9  # this call ran steps 9..14 only (no step-0 eval, no step 1..8)
    state = ckpt.load_trainer_state(out)
    assert state["loss_history"][: len(first["loss_history"])] == first["loss_history"]
    assert state["step"] == 14 and state["config"]["train"]["steps"] == 14
    train_steps = [h["step"] for h in state["loss_history"] if h["split"] == "train"]
    assert train_steps == list(range(1, 15))  # continued at 9, nothing repeated or lost
    assert [h["step"] for h in state["loss_history"] if h["split"] == "val"] == [0, 4, 8, 12, 14]
    # a resume keeps the checkpoint's architecture, and trainer_state records that one
    cfg = run_cfg(workdir, "extend", steps=15, eval_every=4)
    cfg["model"]["hidden_size"] = 48
    state = ckpt.load_trainer_state(train(cfg))
    assert state["config"]["model"]["hidden_size"] == TINY_MODEL["hidden_size"]
    # resume=false starts over
    out = train(run_cfg(workdir, "extend", steps=3, eval_every=0, resume=False))
    assert ckpt.load_trainer_state(out)["step"] == 3


def test_crash_then_resume_gives_the_same_weights_as_an_uninterrupted_run(workdir):
    full = train(run_cfg(workdir, "full", steps=12))

    def crash_after_8(metrics, step):
        if step > 8:
            raise RuntimeError("simulated crash")

    cfg = run_cfg(workdir, "crashy", steps=12, save_every=4, log_every=1)
    with pytest.raises(RuntimeError, match="simulated crash"):
        train(cfg, log_fn=crash_after_8)
    assert ckpt.load_trainer_state(workdir / "crashy")["step"] == 8  # last periodic save
    calls = []
    resumed = train(cfg, log_fn=lambda d, s: calls.append(s))
    assert calls[0] == 9  # really resumed (a rerun from scratch would also match the weights)

    a, b = load_file(full / "model.safetensors"), load_file(resumed / "model.safetensors")
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    la = [h["main"] for h in ckpt.load_trainer_state(full)["loss_history"] if h["split"] == "train"]
    lb = [h["main"] for h in ckpt.load_trainer_state(resumed)["loss_history"] if h["split"] == "train"]
    assert la == lb


def test_freeze_base_trains_only_the_mtp_modules(workdir, learned_run):
    target, _ = learned_run
    cfg = run_cfg(workdir, "frozen", steps=6, eval_every=0, freeze_base=True)
    cfg["model"]["path"] = str(target)
    cfg["model"]["num_nextn_predict_layers"] = 3  # one more draft module than the target carries
    out = train(cfg)
    before, after = load_file(target / "model.safetensors"), load_file(out / "model.safetensors")
    base = [k for k in before if not k.startswith("mtp.")]
    assert base and all(torch.equal(before[k], after[k]) for k in base)
    changed = [k for k in before if k.startswith("mtp.") and not torch.equal(before[k], after[k])]
    assert any(k.startswith("mtp.0.") for k in changed) and any(k.startswith("mtp.1.") for k in changed)
    assert any(k.startswith("mtp.2.") for k in after)  # the new module was added and saved
    assert load_tokenizer(out).to_str() == load_tokenizer(target).to_str()
    hist = ckpt.load_trainer_state(out)["loss_history"]
    assert {"mtp1", "mtp2", "mtp3"} <= set(hist[-1])


def test_bf16_autocast_trains_in_mixed_precision(workdir):
    """train.autocast=bfloat16: the step-0 losses are the float32 run's within bf16 rounding
    (relative 2e-2: a bf16 mantissa holds 8 bits, and the logits go through a few matrix
    products), every depth's loss drops, and weights, gradients and optimizer state stay float32."""
    ref = train(run_cfg(workdir, "amp_ref", steps=8, eval_every=0))
    out = train(run_cfg(workdir, "amp", steps=8, eval_every=0, autocast="bfloat16"))
    h_ref, h = (ckpt.load_trainer_state(d)["loss_history"] for d in (ref, out))
    v_ref, v = h_ref[0], h[0]                          # step 0 validation: the same initial weights
    assert (v["split"] == "val"
            and all(abs(v[k] - v_ref[k]) <= 2e-2 * v_ref[k] for k in ("main", "mtp1", "mtp2")))
    assert v != v_ref                                  # autocast did run in bf16
    last = [x for x in h if x["split"] == "val"][-1]
    assert all(last[k] < v[k] for k in ("main", "mtp1", "mtp2"))
    assert all(t.dtype == torch.float32 for t in load_file(out / "model.safetensors").values())
    assert all(t.dtype == torch.float32 for t in load_file(out / "optimizer.safetensors").values()
               if t.is_floating_point())
    with pytest.raises(ValueError, match="train.autocast='float16': use bfloat16"):
        train(run_cfg(workdir, "amp_bad", autocast="float16"))


def test_config_errors_name_the_fix(workdir):
    cfg = run_cfg(workdir, "bad", freeze_base=True)
    with pytest.raises(ValueError, match="freeze_base=true needs model.path"):
        train(cfg)
    cfg = run_cfg(workdir, "bad")
    del cfg["train"]["lr"]
    with pytest.raises(ValueError, match=r"train config lacks \['lr'\]"):
        train(cfg)
    cfg = run_cfg(workdir, "bad")
    cfg["model"]["hidden_sizee"] = 8
    with pytest.raises(ValueError, match="hidden_sizee"):
        train(cfg)
    cfg = run_cfg(workdir, "bad", gsm8k_path=str(workdir / "missing.jsonl"))
    with pytest.raises(FileNotFoundError, match="train.gsm8k_path"):
        train(cfg)
    # each range names its key, before any data is read
    for key, value, message in (("steps", 0, "train.steps=0: must be an integer >= 1"),
                                ("batch_size", -2, "train.batch_size=-2: must be an integer >= 1"),
                                ("lr", -1.0, "train.lr=-1.0: must be a learning rate > 0"),
                                ("min_lr", 1.0, r"train.min_lr=1.0: must be a number in \[0, train.lr="),
                                ("seq_len", 5000, "train.seq_len=5000 is longer than the model's "
                                                  "max_position_embeddings=")):
        cfg = run_cfg(workdir, "bad", **{key: value, "gsm8k_path": str(workdir / "missing.jsonl")})
        with pytest.raises(ValueError, match=message):
            train(cfg)
    assert not (workdir / "bad").exists()


def test_out_dir_safety(workdir):
    """A folder that is not a training run is refused untouched; an interrupted save (only the
    .old copy left, a stale .tmp folder) is repaired and the run resumes where it was; a place that
    cannot be written fails before the data is read; files get the usual permissions."""
    import os
    keep = workdir / "notes"
    keep.mkdir()
    (keep / "thesis.tex").write_text("do not lose me")
    with pytest.raises(ValueError, match=r"train.out_dir=.*notes exists and is not an mtpx training run"):
        train(run_cfg(workdir, "notes", steps=2))
    assert (keep / "thesis.tex").read_text() == "do not lose me" and len(list(keep.iterdir())) == 1

    out = train(run_cfg(workdir, "swap", steps=4, eval_every=0))
    assert ckpt.load_trainer_state(out)["step"] == 4
    assert os.stat(out / "model.safetensors").st_mode & 0o777 == 0o666 & ~_umask()
    os.replace(out, workdir / ".swap.old-1a2b3c4d")           # a crash between the two renames
    (workdir / ".swap.tmp-99999999").mkdir()                    # and a save cut short
    (workdir / ".swap.tmp-99999999" / "model.safetensors").write_bytes(b"partial")
    train(run_cfg(workdir, "swap", steps=6, eval_every=0))
    state = ckpt.load_trainer_state(out)
    assert (state["step"] == 6
            and [h["step"] for h in state["loss_history"] if h["split"] == "train"] == [1, 2, 3, 4, 5, 6])
    assert not list(workdir.glob(".swap.*"))

    blocker = workdir / "a_file"
    blocker.write_text("x")
    with pytest.raises(ValueError, match=r"train.out_dir=.*a_file/run: cannot write to"):
        train(run_cfg(workdir, "a_file/run", steps=2))


def _umask() -> int:
    import os
    mask = os.umask(0)
    os.umask(mask)
    return mask
