"""Hidden-state shards (mode=extract, train.hidden_states_path; mtpx/train/shards.py): shards equal
the target's live hidden states and top-k log-probs, an interrupted extraction resumes to the same
bytes, heads trained from shards equal heads trained on the live target (float32 summation order:
1e-5), and shards of another target or tokenizer, or a folder that is not one, are refused in one
line naming the key."""
from __future__ import annotations

import os
import shutil

import pytest
import torch
from omegaconf import OmegaConf
from safetensors.torch import load_file

from mtpx.io import Interrupted
from mtpx.train import checkpoint as ckpt
from mtpx.train import extract as extract_mod
from mtpx.train.loop import train
from mtpx.train.shards import MANIFEST_FILE, shard_name
from mtpx.train.tokenizer import train_tokenizer
from tests.test_train import run_cfg, write_synthetic_gsm8k


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    """(work folder, a 2-step trained tiny target with 2 MTP modules)."""
    tmp = tmp_path_factory.mktemp("shards")
    write_synthetic_gsm8k(tmp / "gsm8k.jsonl", n=120)
    return tmp, train(run_cfg(tmp, "target", steps=2, eval_every=0))


def _extract_cfg(tmp, src, out, **kw):
    cfg = run_cfg(tmp, "unused", **{"hidden_states_path": str(out), "hidden_states_shard_size": 16,
                                    "hidden_states_top_k": 8, **kw})
    cfg["model"]["path"] = str(src)
    return OmegaConf.create(cfg)


def _extract(tmp, src, out, **kw) -> list:
    assert extract_mod.run_extract(_extract_cfg(tmp, src, out, **kw)) == 0
    n = len(list(out.glob("shard-*.safetensors")))
    return [out / shard_name(i, n) for i in range(n)]


def test_shards_equal_the_live_hidden_states_and_an_interrupted_extraction_resumes(target, monkeypatch):
    tmp, src = target
    out = tmp / "hs"
    files = _extract(tmp, src, out)
    assert len(files) >= 3 and (out / MANIFEST_FILE).is_file()
    model, _ = ckpt.load_model(src)
    shard = load_file(files[1])
    with torch.no_grad():
        h = model.model(shard["input_ids"])
        top = torch.log_softmax(model.lm_head(h), -1).topk(8, -1)
    torch.testing.assert_close(shard["hidden_states"], h, rtol=0, atol=1e-5)
    torch.testing.assert_close(shard["topk_logprobs"], top.values, rtol=0, atol=1e-5)
    assert torch.equal(shard["topk_indices"].long(), top.indices)
    before = {f.name: f.read_bytes() for f in files}

    # interrupted after its first shard: that shard is kept, the rerun writes the others
    class StopAtOnce:
        requested = True

        def __enter__(self):
            return self

        def __exit__(self, *a):
            return False

    for f in files[1:]:
        f.unlink()
    monkeypatch.setattr(extract_mod, "GracefulInterrupt", StopAtOnce)
    with pytest.raises(Interrupted, match="extraction stopped after shard-00001"):
        extract_mod.run_extract(_extract_cfg(tmp, src, out))
    assert files[1].is_file() and not files[2].is_file()
    kept = os.stat(files[0]).st_mtime_ns
    monkeypatch.undo()
    _extract(tmp, src, out)
    assert {f.name: f.read_bytes() for f in files} == before and os.stat(files[0]).st_mtime_ns == kept
    with pytest.raises(ValueError, match="train.hidden_states_path=.* another seq_len"):
        extract_mod.run_extract(_extract_cfg(tmp, src, out, seq_len=24))


def test_heads_trained_from_shards_equal_heads_trained_on_the_live_target(target):
    tmp, src = target
    out = tmp / "hs_train"
    _extract(tmp, src, out, hidden_states_top_k=320)      # K = V: KL to the whole distribution
    live = run_cfg(tmp, "live", steps=3, eval_every=0, freeze_base=True, mtp_loss="kl")
    live["model"]["path"] = str(src)
    shard = run_cfg(tmp, "from_shards", steps=3, eval_every=0, freeze_base=True, mtp_loss="kl",
                    hidden_states_path=str(out))
    shard["model"]["path"] = str(src)
    a, b = load_file(train(live) / "model.safetensors"), load_file(train(shard) / "model.safetensors")
    assert a.keys() == b.keys()
    for name in a:   # target layers copied from model.path; heads within float32 summation order
        torch.testing.assert_close(b[name], a[name], rtol=0, atol=1e-5, msg=name)
    start = load_file(src / "model.safetensors")
    assert any(not torch.equal(a[n], start[n]) for n in a if n.startswith("mtp."))
    ha = ckpt.load_trainer_state(tmp / "live")["loss_history"][-1]
    hb = ckpt.load_trainer_state(tmp / "from_shards")["loss_history"][-1]
    assert hb["mtp2"] == pytest.approx(ha["mtp2"], abs=1e-5)


def test_shards_of_another_target_or_tokenizer_or_no_shard_folder_are_refused(target):
    tmp, src = target
    out = tmp / "hs_refuse"
    _extract(tmp, src, out)
    other = train(run_cfg(tmp, "other_target", steps=2, eval_every=0, seed=1))
    model, tok = ckpt.load_model(src)
    retok = ckpt.save_checkpoint(tmp / "other_tok", model,
                                 train_tokenizer([(tmp / "gsm8k.jsonl").read_text()[::-1]], 320))

    def cfg(path, hs):
        c = run_cfg(tmp, f"refused_{path.name}_{hs.name}", steps=1, freeze_base=True,
                    hidden_states_path=str(hs))
        c["model"]["path"] = str(path)
        return c

    with pytest.raises(ValueError, match=r"^train.hidden_states_path=\S+ holds another target's hidden"):
        train(cfg(other, out))
    with pytest.raises(ValueError, match=r"^train.hidden_states_path=\S+ was extracted with another token"):
        train(cfg(retok, out))
    empty = tmp / "not_shards"
    empty.mkdir()
    with pytest.raises(ValueError, match=r"^train.hidden_states_path=\S+ is not a hidden-state shard folder"):
        train(cfg(src, empty))
    half = tmp / "half"
    shutil.copytree(out, half)
    next(half.glob("shard-*")).unlink()
    with pytest.raises(ValueError, match=r"^train.hidden_states_path=\S+ lacks 1 of its"):
        train(cfg(src, half))


def test_two_ranks_write_the_shards_of_one_process_between_them(target, monkeypatch):
    """Under torchrun (RANK, WORLD_SIZE; no process group) rank r writes the shards i % 2 == r:
    together the same bytes as one process."""
    tmp, src = target
    one = _extract(tmp, src, tmp / "hs_one")
    for rank in (0, 1):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        extract_mod.run_extract(_extract_cfg(tmp, src, tmp / "hs_two"))
        written = sorted(p.name for p in (tmp / "hs_two").glob("shard-*"))
        assert written == sorted(f.name for i, f in enumerate(one) if i % 2 <= rank)
    assert all((tmp / "hs_two" / f.name).read_bytes() == f.read_bytes() for f in one)


def test_light_model_loads_a_deepseek_checkpoint_whose_heads_are_tied_to_lm_head(tmp_path):
    """mtp_style=deepseek_v3 with tied embeddings (the demo's layout): the checkpoint stores neither
    lm_head nor the modules' heads (they are the embedding), and shard training must load it."""
    from rich.console import Console

    from mtpx.models import ModelConfig, MTPForCausalLM
    from mtpx.train.shard_training import light_model
    from tests.test_train_recipes import TINY_MODEL
    tok = train_tokenizer(["a tiny corpus for a tiny tokenizer " * 20], 300)
    torch.manual_seed(0)
    target = MTPForCausalLM(ModelConfig(**{**TINY_MODEL, "vocab_size": tok.get_vocab_size(),
                                            "mtp_style": "deepseek_v3", "tie_word_embeddings": True}))
    src = ckpt.save_checkpoint(tmp_path / "ds", target, tok)
    assert not any(k.endswith("head.weight") for k in load_file(src / "model.safetensors"))
    model, _ = light_model(str(src), {}, 0, Console(quiet=True))
    assert all(m.head.weight is model.lm_head.weight for m in model.mtp)
    assert torch.equal(model.lm_head.weight, target.lm_head.weight)
    assert torch.equal(model.mtp[1].fc.weight, target.mtp[1].fc.weight)
