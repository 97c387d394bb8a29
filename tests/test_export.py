"""mtpx.hf.export / tools/export_checkpoint.py: exported checkpoints load back exactly.

Every round trip (export, then `mtpx.hf.loader.load_pretrained`) must give the very same target
logits and draft logits (`mtp_chain` + `draft_logits`), compared with torch.equal: tiny models in
float64, the demo checkpoint in float32. Layouts that cannot hold a model exactly must be refused
with a message naming the fix.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import safetensors
import safetensors.torch
import torch
import torch.nn as nn

from mtpx import LLM, SamplingParams
from mtpx.engine.llm import DEFAULT_MODEL
from mtpx.hf.export import ExportError, export_checkpoint, export_model
from mtpx.hf.layout import QWEN3_NEXT_SHARED
from mtpx.hf.loader import load_pretrained
from mtpx.models import MTPForCausalLM
from tests.helpers import _synthetic_batch, peaked_model, tiny_config

ROOT = Path(__file__).resolve().parents[1]
CLI = ROOT / "tools" / "export_checkpoint.py"


def _perturb(model: nn.Module, seed: int = 1) -> nn.Module:
    """Seeded noise on every parameter (tied ones once), so that norm weights are not all 0 / 1 and
    a module read with another module's weights would give different logits."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g, dtype=p.dtype) * (0.1 if p.dim() == 1 else 0.02))
    return model


@torch.no_grad()
def _outputs(model, ids: torch.Tensor, n: int | None = None):
    """(target logits [B, T, V], [draft logits of module k: [B, T-k-1, V] for k < n])."""
    h = model.model(ids)
    n = len(model.mtp) if n is None else n
    chain = model.mtp_chain(ids, h, n)
    return model.lm_head(h), [model.draft_logits(k, a) for k, a in enumerate(chain)]


def _assert_identical(a, b, n: int | None = None, vocab: int = 64, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (2, 24), generator=g)
    (la, da), (lb, db) = _outputs(a, ids, n), _outputs(b, ids, n)
    assert la.dtype == lb.dtype
    assert torch.equal(la, lb), f"target logits differ by {(la - lb).abs().max()}"
    assert len(da) == len(db)
    for k, (x, y) in enumerate(zip(da, db)):
        assert torch.equal(x, y), f"draft module {k}: logits differ by {(x - y).abs().max()}"


def _names(folder: Path) -> set[str]:
    with safetensors.safe_open(str(folder / "model.safetensors"), "pt") as f:
        return set(f.keys())


def _no_leftovers(parent: Path):
    assert not [p.name for p in parent.iterdir() if p.name.startswith(".")], "temporary files left"


# --------------------------------------------------------------------------------------------------
# 1-2. Qwen3-Next layout


def test_qwen3_next_one_module_round_trip(tmp_path):
    model = _perturb(peaked_model(tiny_config(num_nextn_predict_layers=1)))
    out = export_model(model, tmp_path / "q", "qwen3_next")
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["Qwen3NextForCausalLM"]
    assert config["mtp_num_hidden_layers"] == config["num_nextn_predict_layers"] == 1
    assert config["dtype"] == "float64"
    names = _names(out)
    assert {"mtp.fc.weight", "mtp.norm.weight", "mtp.pre_fc_norm_embedding.weight",
            "mtp.layers.0.self_attn.q_proj.weight", "lm_head.weight"} <= names
    assert not any(n.startswith("mtp.0.") for n in names)
    loaded, tok = load_pretrained(out, dtype=torch.float64)
    assert tok is None and loaded.cfg.num_nextn_predict_layers == 1
    _assert_identical(model, loaded)

    # sharded: index + shards, same result; re-exporting replaces the folder atomically
    sharded = export_model(model, tmp_path / "q", "qwen3_next", max_shard_bytes=64_000)
    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1 and not (sharded / "model.safetensors").exists()
    _assert_identical(model, load_pretrained(sharded, dtype=torch.float64)[0])
    _no_leftovers(tmp_path)


def _tie_shared(model):
    for m in model.mtp[1:]:
        for part in QWEN3_NEXT_SHARED:
            setattr(m, part, model.mtp[0].get_submodule(part))
    return model


def test_qwen3_next_shared_modules_round_trip_and_distinct_refused(tmp_path):
    cfg = tiny_config(num_nextn_predict_layers=3)
    model = _perturb(_tie_shared(peaked_model(cfg)))
    out = export_model(model, tmp_path / "q3", "qwen3_next")
    config = json.loads((out / "config.json").read_text())
    assert config["mtp_num_hidden_layers"] == config["num_nextn_predict_layers"] == 3
    names = _names(out)
    assert sum(n.startswith("mtp.fc.") for n in names) == 1
    assert {f"mtp.layers.{k}.mlp.down_proj.weight" for k in range(3)} <= names
    loaded, _ = load_pretrained(out, dtype=torch.float64)
    assert loaded.mtp[2].fc.weight is loaded.mtp[0].fc.weight
    _assert_identical(model, loaded)

    distinct = _perturb(peaked_model(cfg))      # every module has its own fc and norms
    with pytest.raises(ExportError) as err:
        export_model(distinct, tmp_path / "bad", "qwen3_next")
    assert "--num-modules 1" in str(err.value) and "--layout draft" in str(err.value)
    assert "[1, 2]" in str(err.value)
    assert not (tmp_path / "bad").exists()
    one = export_model(distinct, tmp_path / "one", "qwen3_next", num_modules=1)
    _assert_identical(distinct, load_pretrained(one, dtype=torch.float64)[0], n=1)
    _no_leftovers(tmp_path)


# --------------------------------------------------------------------------------------------------
# 3. DeepSeek layout


def test_deepseek_round_trip_with_own_head(tmp_path):
    cfg = tiny_config(mtp_style="deepseek_v3", num_nextn_predict_layers=2, tie_word_embeddings=True)
    model = _perturb(peaked_model(cfg))
    g = torch.Generator().manual_seed(3)
    model.mtp[1].head.weight = nn.Parameter(torch.randn(64, 64, generator=g, dtype=torch.float64))
    assert model.mtp[0].head.weight is model.lm_head.weight is model.model.embed_tokens.weight
    out = export_model(model, tmp_path / "ds", "deepseek_v3")
    config = json.loads((out / "config.json").read_text())
    assert config["num_nextn_predict_layers"] == 2 and "mtp_num_hidden_layers" not in config
    names = _names(out)
    for k in (4, 5):
        assert {f"model.layers.{k}.{n}.weight" for n in ("enorm", "hnorm", "eh_proj", "shared_head.norm",
                                                           "shared_head.head", "input_layernorm")} <= names
    assert "model.layers.4.embed_tokens.weight" in names and "lm_head.weight" not in names
    loaded, _ = load_pretrained(out, dtype=torch.float64)
    assert loaded.cfg.mtp_style == "deepseek_v3"
    assert loaded.mtp[0].head.weight is loaded.lm_head.weight          # tied again
    assert loaded.mtp[1].head.weight is not loaded.lm_head.weight
    _assert_identical(model, loaded)

    with pytest.raises(ExportError, match="model.mtp_style=deepseek_v3"):
        export_model(peaked_model(tiny_config(num_nextn_predict_layers=1)), tmp_path / "x", "deepseek_v3")
    with pytest.raises(ExportError, match="--layout deepseek_v3"):
        export_model(model, tmp_path / "x", "qwen3_next")
    assert not (tmp_path / "x").exists()
    _no_leftovers(tmp_path)


# --------------------------------------------------------------------------------------------------
# 4. Draft file on a dense (Llama) target


def test_draft_file_on_llama_target(tmp_path):
    cfg = tiny_config(layer_types=["full_attention"] * 4, model_type="llama", attn_output_gate=False,
                      use_qk_norm=False, rms_norm_unit_offset=False, partial_rotary_factor=1.0)
    torch.manual_seed(0)
    model = MTPForCausalLM(cfg)          # a few training steps: drafts are sometimes accepted
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(0)
    for _ in range(15):
        loss, _ = model.training_losses(_synthetic_batch(g, 16, 48), mtp_loss_weight=0.5)
        loss.backward()
        opt.step()
        opt.zero_grad()
    model = model.double().eval()
    target = export_model(model, tmp_path / "llama", None, target_only=True)
    config = json.loads((target / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert "mtp_num_hidden_layers" not in config and "num_nextn_predict_layers" not in config
    assert not any(n.startswith("mtp.") for n in _names(target))
    head = export_model(model, tmp_path / "head.safetensors", "draft")
    with safetensors.safe_open(str(head), "pt") as f:
        assert f.metadata() == {"format": "pt", "mtp_style": "qwen3_next", "num_nextn_predict_layers": "4"}
        assert all(k.startswith("mtp.") for k in f.keys()) and "mtp.3.fc.weight" in f.keys()
    assert load_pretrained(target, dtype=torch.float64)[0].cfg.num_nextn_predict_layers == 0
    loaded, _ = load_pretrained(target, dtype=torch.float64, draft_path=head)
    _assert_identical(model, loaded)

    g = torch.Generator().manual_seed(1)
    prompts = [_synthetic_batch(g, 1, n)[0].tolist() for n in (5, 9, 14)]
    sp = SamplingParams(max_tokens=16, ignore_eos=True)
    plain = [o.output_token_ids for o in LLM(model=target, dtype="float64").generate(prompts, sp)]
    spec = LLM(model=target, spec="mtp8", draft_path=head, dtype="float64")
    assert spec.num_speculative_tokens == 4
    outs = spec.generate(prompts, sp)
    assert [o.output_token_ids for o in outs] == plain
    assert sum(o.spec.num_accepted_tokens for o in outs) > 0


# --------------------------------------------------------------------------------------------------
# 5. The demo checkpoint (8 qwen3_next-style modules with their own fc and norms)


@pytest.fixture(scope="module")
def demo():
    model, tok = load_pretrained(DEFAULT_MODEL)
    return model, tok


def test_demo_exports(demo, tmp_path):
    model, tok = demo
    vocab = model.cfg.vocab_size
    # target-only folder + draft file == the demo
    target = export_checkpoint(DEFAULT_MODEL, tmp_path / "target", None, target_only=True)
    head = export_checkpoint(DEFAULT_MODEL, tmp_path / "head.safetensors", "draft")
    assert {p.name for p in target.iterdir()} == {"config.json", "model.safetensors", "tokenizer.json",
                                                  "tokenizer_config.json"}
    loaded, loaded_tok = load_pretrained(target, draft_path=head)
    assert loaded.cfg.num_nextn_predict_layers == 8
    _assert_identical(model, loaded, vocab=vocab)
    text = "def add(a, b):\n    return a + b"
    assert loaded_tok.encode(text).ids == tok.encode(text).ids
    assert loaded_tok.eos_token_ids == [0]

    # the demo's modules (mtp_style=deepseek_v3) in DeepSeek-V3's layout, all eight
    ds = export_checkpoint(DEFAULT_MODEL, tmp_path / "ds", "deepseek_v3")
    assert json.loads((ds / "config.json").read_text())["num_nextn_predict_layers"] == 8
    _assert_identical(model, load_pretrained(ds)[0], vocab=vocab)

    # bfloat16: the demo's weights are stored in bfloat16, so an export in it is exact
    bf = export_checkpoint(DEFAULT_MODEL, tmp_path / "bf16", "deepseek_v3", num_modules=1,
                           dtype=torch.bfloat16)
    assert json.loads((bf / "config.json").read_text())["dtype"] == "bfloat16"
    sd = model.state_dict()
    for name, t in load_pretrained(bf, dtype=torch.bfloat16)[0].state_dict().items():
        assert torch.equal(t, sd[name].to(torch.bfloat16)), name
    again = export_checkpoint(bf, tmp_path / "bf16.safetensors", "draft")
    assert {t.dtype for t in safetensors.torch.load_file(str(again)).values()} == {torch.bfloat16}

    # the Qwen3-Next layout serves qwen3_next-style modules only: refused before anything is written
    with pytest.raises(ExportError, match="--layout deepseek_v3"):
        export_checkpoint(DEFAULT_MODEL, tmp_path / "q1", "qwen3_next", num_modules=1)
    assert not (tmp_path / "q1").exists()
    _no_leftovers(tmp_path)


def test_failed_write_leaves_previous_export(tmp_path, monkeypatch):
    model = peaked_model(tiny_config(num_nextn_predict_layers=1))
    out = export_model(model, tmp_path / "q", "qwen3_next")
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    def boom(*args, **kwargs):
        raise OSError("disk full")
    monkeypatch.setattr(safetensors.torch, "save_file", boom)   # folder shards
    monkeypatch.setattr(safetensors.torch, "save", boom)        # the draft file's bytes
    with pytest.raises(OSError, match="disk full"):
        export_model(_perturb(model), out, "qwen3_next")
    with pytest.raises(OSError, match="disk full"):
        export_model(model, tmp_path / "head.safetensors", "draft")
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert not (tmp_path / "head.safetensors").exists()
    _no_leftovers(tmp_path)


# --------------------------------------------------------------------------------------------------
# 6. transformers reads the exported Qwen3-Next folder


@pytest.mark.parity
def test_transformers_reads_qwen3_next_export(tmp_path):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = _perturb(MTPForCausalLM(tiny_config(num_nextn_predict_layers=1)).eval(), seed=4)
    with torch.no_grad():
        model.lm_head.weight.mul_(10)
    out = export_model(model, tmp_path / "q", "qwen3_next")
    hf = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    assert type(hf).__name__ == "Qwen3NextForCausalLM"
    ids = torch.randint(0, 64, (2, 32), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = hf(input_ids=ids).logits
        mine = model(ids)
    assert ref.std() > 0.1, "logits too flat for the comparison to mean anything"
    torch.testing.assert_close(mine, ref, atol=1e-4, rtol=0)


# --------------------------------------------------------------------------------------------------
# 7. The CLI


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, str(CLI), *args], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=120)


@pytest.mark.slow      # about 15 s: the entry point in a subprocess (test_demo_exports covers the export)
def test_cli(demo, tmp_path):
    head = tmp_path / "head.safetensors"
    r = _cli(str(DEFAULT_MODEL), str(head), "--layout", "draft", "--num-modules", "2")
    assert r.returncode == 0, r.stderr
    assert "wrote" in r.stdout
    tensors = safetensors.torch.load_file(str(head))
    sd = demo[0].state_dict()
    assert {n.split(".")[1] for n in tensors} == {"0", "1"}
    assert all(torch.equal(t, sd[n]) for n, t in tensors.items())

    for args, code in [((str(DEFAULT_MODEL), str(tmp_path / "x"), "--layout", "mtpx"), 2),
                       ((str(tmp_path / "missing"), str(head), "--layout", "draft"), 1)]:
        r = _cli(*args)
        assert r.returncode == code, r.stderr
        assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert "error:" in r.stderr
    assert torch.equal(safetensors.torch.load_file(str(head))["mtp.0.fc.weight"], sd["mtp.0.fc.weight"])
