"""mtpx.hf.loader: Hugging Face-format folders (single file and shards, three MTP layouts, draft
files, dtype conversion) load exactly, and every kind of bad checkpoint gives one clear error."""
import json
import warnings

import pytest
import torch
from safetensors.torch import save_file

from mtpx.hf.config import UnsupportedConfigError, config_from_hf, config_to_hf
from mtpx.hf.layout import LayoutError, detect_layout, from_mtpx
from mtpx.hf.loader import load_pretrained
from mtpx.models import MTPForCausalLM
from mtpx.train.checkpoint import CheckpointError
from tests.helpers import LLAMA_FLAGS as LLAMA
from tests.helpers import tiny_config


def _model(seed=0, **overrides) -> MTPForCausalLM:
    """A float64 tiny model whose every parameter (norm weights, A_log, biases) is random."""
    torch.manual_seed(seed)
    m = MTPForCausalLM(tiny_config(**overrides)).double().eval()
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return m


def _write(m: MTPForCausalLM, folder, layout="mtpx", shards=1, config=None):
    """m as a Hugging Face folder: config_to_hf's config.json, tensors named by `layout`, split
    round-robin over `shards` files with an index when shards > 1."""
    folder.mkdir(parents=True, exist_ok=True)
    cfg = m.cfg
    hf_layout = None if layout == "mtpx" or not len(m.mtp) else layout
    d = config if config is not None else config_to_hf(cfg, hf_layout)
    if layout == "mtpx" and len(m.mtp):
        d["num_nextn_predict_layers"] = len(m.mtp)
    (folder / "config.json").write_text(json.dumps(d))
    tensors, seen = {}, set()
    for name, t in m.state_dict().items():
        if name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        out = from_mtpx(name, layout, cfg.num_hidden_layers)
        if out is None or out in seen:
            continue
        seen.add(out)
        tensors[out] = t.detach().clone().contiguous()
    names = sorted(tensors)
    if shards == 1:
        save_file(tensors, str(folder / "model.safetensors"))
        return folder
    weight_map = {}
    for i in range(shards):
        file = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: tensors[n] for n in names[i::shards]}
        save_file(part, str(folder / file))
        weight_map.update({n: file for n in part})
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {},
                                                                     "weight_map": weight_map}))
    return folder


def _same(a: MTPForCausalLM, b: MTPForCausalLM, modules: int | None = None):
    x = torch.randint(0, a.cfg.vocab_size, (2, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(b(x), a(x), rtol=0, atol=0)
        n = len(a.mtp) if modules is None else modules
        if n:
            ha, hb = a.model(x), b.model(x)
            for k, (ca, cb) in enumerate(zip(a.mtp_chain(x, ha, n), b.mtp_chain(x, hb, n))):
                torch.testing.assert_close(b.draft_logits(k, cb), a.draft_logits(k, ca), rtol=0, atol=0)


@pytest.mark.parametrize("shards", [1, 3])
def test_llama_folder_round_trip(tmp_path, shards):
    m = _model(num_nextn_predict_layers=0, **LLAMA)
    loaded, tok = load_pretrained(_write(m, tmp_path / "llama", shards=shards), dtype=torch.float64)
    assert tok is None and loaded.cfg.model_type == "llama" and not loaded.cfg.use_qk_norm
    _same(m, loaded)


def test_qwen3_next_layout_shares_fc_and_norms(tmp_path):
    m = _model(num_nextn_predict_layers=3)
    for k in (1, 2):  # the layout stores these once: make the source model share them too
        for name in ("fc", "pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
            setattr(m.mtp[k], name, getattr(m.mtp[0], name))
    folder = _write(m, tmp_path / "q", layout="qwen3_next", shards=2)
    names = json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"]
    assert "mtp.fc.weight" in names and "mtp.layers.2.self_attn.q_proj.weight" in names
    loaded, _ = load_pretrained(folder, dtype=torch.float64)
    assert loaded.cfg.num_nextn_predict_layers == 3 and loaded.cfg.mtp_style == "qwen3_next"
    assert loaded.mtp[2].fc.weight is loaded.mtp[0].fc.weight        # one tensor, shared
    _same(m, loaded)


def test_deepseek_layout_with_own_heads(tmp_path):
    m = _model(num_nextn_predict_layers=2, mtp_style="deepseek_v3", **LLAMA)
    with torch.no_grad():  # module 1's head differs from lm_head; module 0's stays tied
        m.mtp[1].head.weight = torch.nn.Parameter(m.lm_head.weight + 0.1)
    folder = _write(m, tmp_path / "ds", layout="deepseek_v3")
    loaded, _ = load_pretrained(folder, dtype=torch.float64)
    assert loaded.cfg.mtp_style == "deepseek_v3"
    assert (loaded.mtp[0].head.weight is loaded.lm_head.weight
            and loaded.mtp[1].head.weight is not loaded.lm_head.weight)
    _same(m, loaded)


def test_deepseek_embed_copy_must_equal_target(tmp_path):
    m = _model(num_nextn_predict_layers=1, mtp_style="deepseek_v3", **LLAMA)
    folder = _write(m, tmp_path / "ds", layout="deepseek_v3")
    from safetensors.torch import load_file
    sd = load_file(str(folder / "model.safetensors"))
    sd["model.layers.4.embed_tokens.weight"] = sd["model.embed_tokens.weight"].clone()
    save_file(sd, str(folder / "model.safetensors"))
    _same(m, load_pretrained(folder, dtype=torch.float64)[0])
    sd["model.layers.4.embed_tokens.weight"] += 1
    save_file(sd, str(folder / "model.safetensors"))
    with pytest.raises(CheckpointError, match="dedicated MTP embeddings are not supported"):
        load_pretrained(folder)


def test_draft_file_attaches_modules_to_a_standard_target(tmp_path):
    m = _model(num_nextn_predict_layers=2, **LLAMA)
    target = MTPForCausalLM(tiny_config(num_nextn_predict_layers=0, **LLAMA)).double()
    target.load_state_dict({k: v for k, v in m.state_dict().items() if not k.startswith("mtp.")})
    folder = _write(target, tmp_path / "llama")
    draft = {k: v.contiguous() for k, v in m.state_dict().items() if k.startswith("mtp.")}
    save_file(draft, str(tmp_path / "head.safetensors"), metadata={"mtp_style": "qwen3_next"})
    loaded, _ = load_pretrained(folder, dtype=torch.float64, draft_path=tmp_path / "head.safetensors")
    assert loaded.cfg.num_nextn_predict_layers == 2
    _same(m, loaded)
    with pytest.raises(FileNotFoundError, match="spec.draft_path"):
        load_pretrained(folder, draft_path=tmp_path / "nope.safetensors")


def test_dtype_conversion_is_per_tensor_and_complete(tmp_path):
    m = _model(num_nextn_predict_layers=1)
    folder = _write(m.float(), tmp_path / "q", layout="qwen3_next")
    loaded, _ = load_pretrained(folder, dtype=torch.bfloat16)
    assert {p.dtype for p in loaded.parameters()} == {torch.bfloat16}
    assert not any(p.is_meta for p in loaded.parameters())
    for (n, p), (_, q) in zip(loaded.state_dict().items(), m.state_dict().items()):
        assert torch.equal(p, q.to(torch.bfloat16)), n


# ---- bad checkpoints: one clear error each ----------------------------------------------------


def test_corrupted_safetensors(tmp_path):
    folder = _write(_model(num_nextn_predict_layers=0, **LLAMA), tmp_path / "m")
    (folder / "model.safetensors").write_bytes(b"\xff" * 64)
    with pytest.raises(CheckpointError, match="not a readable safetensors file.*corrupted or truncated"):
        load_pretrained(folder)


def test_truncated_shard(tmp_path):
    folder = _write(_model(num_nextn_predict_layers=0, **LLAMA), tmp_path / "m", shards=2)
    shard = folder / "model-00002-of-00002.safetensors"
    shard.write_bytes(shard.read_bytes()[:-100])
    with pytest.raises(CheckpointError, match="model-00002-of-00002.safetensors is not a readable"):
        load_pretrained(folder)


def test_index_lists_missing_or_outside_shard(tmp_path):
    folder = _write(_model(num_nextn_predict_layers=0, **LLAMA), tmp_path / "m", shards=2)
    (folder / "model-00001-of-00002.safetensors").unlink()
    with pytest.raises(FileNotFoundError,
                       match="lists shard model-00001-of-00002.safetensors, which is missing"):
        load_pretrained(folder)
    index = folder / "model.safetensors.index.json"
    d = json.loads(index.read_text())
    d["weight_map"] = {k: "../elsewhere.safetensors" for k in d["weight_map"]}
    index.write_text(json.dumps(d))
    with pytest.raises(CheckpointError, match="outside the checkpoint folder"):
        load_pretrained(folder)


def test_config_sizes_disagree_with_tensors(tmp_path):
    m = _model(num_nextn_predict_layers=0, **LLAMA)
    d = config_to_hf(m.cfg, None)
    d["intermediate_size"] = 96
    folder = _write(m, tmp_path / "m", config=d)
    with pytest.raises(CheckpointError, match=r"model.layers.0.mlp.down_proj.weight has shape \[64, 128\] "
                                              r"but config.json implies \[64, 96\]"):
        load_pretrained(folder)


def test_missing_and_unexpected_names_are_listed(tmp_path):
    m = _model(num_nextn_predict_layers=0, **LLAMA)
    folder = _write(m, tmp_path / "m")
    from safetensors.torch import load_file
    sd = load_file(str(folder / "model.safetensors"))
    sd["model.layers.0.mlp.extra.weight"] = sd.pop("model.layers.0.mlp.up_proj.weight")
    save_file(sd, str(folder / "model.safetensors"))
    with pytest.raises(CheckpointError,
                       match=r"1 missing tensor\(s\) \[model.layers.0.mlp.up_proj.weight\]; "
                             r"1 unexpected tensor\(s\) \[model.layers.0.mlp.extra.weight\]"):
        load_pretrained(folder)


def test_declared_mtp_modules_missing_from_weights(tmp_path):
    m = _model(num_nextn_predict_layers=0)
    d = config_to_hf(m.cfg, None)
    d["mtp_num_hidden_layers"] = 1
    with pytest.raises(CheckpointError, match="declares 1 MTP module.*hold 0.*spec.draft_path"):
        load_pretrained(_write(m, tmp_path / "m", config=d))


def test_pickle_refused_unless_allowed(tmp_path):
    m = _model(num_nextn_predict_layers=0, **LLAMA)
    folder = _write(m, tmp_path / "m")
    from safetensors.torch import load_file
    torch.save(load_file(str(folder / "model.safetensors")), folder / "pytorch_model.bin")
    (folder / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="only pickle weights.*model.allow_pickle=true"):
        load_pretrained(folder)
    _same(m, load_pretrained(folder, dtype=torch.float64, allow_pickle=True)[0])


def test_pickle_with_code_is_not_executed(tmp_path):
    """torch.load(weights_only=True) refuses a pickle that would call a function."""
    folder = _write(_model(num_nextn_predict_layers=0, **LLAMA), tmp_path / "m")
    (folder / "model.safetensors").unlink()
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (open, (str(marker), "w"))
    torch.save({"x": Evil()}, folder / "pytorch_model.bin", _use_new_zipfile_serialization=True)
    with pytest.raises(CheckpointError, match=r"torch.load\(weights_only=True\)"):
        load_pretrained(folder, allow_pickle=True)
    assert not marker.exists()


def test_unsupported_configs_name_the_problem():
    base = config_to_hf(tiny_config(num_nextn_predict_layers=0, **LLAMA), None)
    with pytest.raises(UnsupportedConfigError, match="model_type 'deepseek_v3' is not supported"):
        config_from_hf({**base, "model_type": "deepseek_v3"})
    with pytest.raises(UnsupportedConfigError, match="quantized checkpoint \\(fp8\\)"):
        config_from_hf({**base, "quantization_config": {"quant_method": "fp8"}})
    with pytest.raises(UnsupportedConfigError, match="sliding-window"):
        config_from_hf({**base, "use_sliding_window": True})
    with pytest.raises(UnsupportedConfigError, match="rope_scaling type 'yarn'"):
        config_from_hf({**base, "rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0}})
    with pytest.warns(UserWarning, match=r"ignoring key\(s\) \['new_thing'\]"):
        config_from_hf({**base, "new_thing": 1})


def test_transformers4_and_5_rope_keys_agree():
    d5 = config_to_hf(tiny_config(num_nextn_predict_layers=0), None)
    d4 = {k: v for k, v in d5.items() if k != "rope_parameters"}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        a, b = config_from_hf(d5), config_from_hf(d4)
    assert ((a.rope_theta, a.partial_rotary_factor, a.rope_scaling)
            == (b.rope_theta, b.partial_rotary_factor, None))
    assert a.partial_rotary_factor == 0.25


def test_mixed_layouts_are_refused():
    names = ["mtp.fc.weight", "mtp.0.fc.weight"]
    with pytest.raises(LayoutError, match="mix MTP layouts"):
        detect_layout(names, 4)
    assert (detect_layout(["model.layers.5.eh_proj.weight", "model.layers.4.enorm.weight"], 4)
            == ("deepseek_v3", 2))


def test_deepseek_style_zeroes_the_embedding_at_position_0():
    """vLLM's DeepSeek MTP layer zeroes inputs_embeds where position == 0; Qwen3-Next's does not."""
    for style, depends in (("deepseek_v3", False), ("qwen3_next", True)):
        m = _model(num_nextn_predict_layers=1, mtp_style=style, **LLAMA)
        x = torch.randint(2, 60, (1, 8), generator=torch.Generator().manual_seed(0))
        y = x.clone()
        y[0, 1] = 1  # module 1 at position 0 reads x_1
        with torch.no_grad():
            a = m.mtp_chain(x, m.model(x), 1)[0][0, 0]
            b = m.mtp_chain(y, m.model(x), 1)[0][0, 0]
        assert (not torch.equal(a, b)) == depends, style


def test_extra_decoder_layers_are_unexpected_not_mtp(tmp_path):
    """num_hidden_layers smaller than the weights: the extra layers are reported as unexpected
    target tensors, not mistaken for DeepSeek MTP modules."""
    m = _model(num_nextn_predict_layers=0, **LLAMA)
    d = config_to_hf(m.cfg, None)
    d["num_hidden_layers"] = 3
    with pytest.raises(CheckpointError, match=r"0 missing tensor\(s\) \[\]; \d+ unexpected tensor\(s\) "
                                              r"\[model.layers.3.") as e:
        load_pretrained(_write(m, tmp_path / "m", config=d))
    assert "MTP layout: None" in str(e.value)


def test_missing_config_keys_take_the_family_defaults():
    d = config_to_hf(tiny_config(num_nextn_predict_layers=0, **LLAMA), None)
    for key in ("eos_token_id", "bos_token_id", "max_position_embeddings", "num_key_value_heads", "head_dim"):
        d.pop(key)
    cfg = config_from_hf(d)
    assert (cfg.eos_token_id, cfg.bos_token_id, cfg.max_position_embeddings) == (2, 1, 2048)  # LlamaConfig's
    assert cfg.num_key_value_heads == cfg.num_attention_heads and cfg.head_dim == 64 // 4
    q = config_to_hf(tiny_config(num_nextn_predict_layers=0, num_experts=4), None)
    q.pop("num_experts_per_tok")
    q.pop("eos_token_id")
    cfg = config_from_hf(q)
    assert cfg.num_experts_per_tok == 10 and cfg.eos_token_id is None       # Qwen3NextConfig's
    with pytest.raises(UnsupportedConfigError, match=r"lacks \['intermediate_size'\]"):
        config_from_hf({k: v for k, v in q.items() if k != "intermediate_size"})


def test_draft_errors_name_spec_draft_path(tmp_path):
    """A draft trained for another family, or a folder without weights, is blamed on spec.draft_path."""
    llama = _model(num_nextn_predict_layers=1, **LLAMA)
    draft = {k: v.contiguous() for k, v in llama.state_dict().items() if k.startswith("mtp.")}
    save_file(draft, str(tmp_path / "head.safetensors"))
    qwen3 = _model(num_nextn_predict_layers=0, **dict(LLAMA, model_type="qwen3", use_qk_norm=True))
    folder = _write(qwen3, tmp_path / "qwen3")
    with pytest.raises(CheckpointError,
                       match=r"spec.draft_path .*head.safetensors does not fit the target .*\(qwen3\): "
                             r"2 missing MTP tensor\(s\) \[mtp.0.layers.0.self_attn.k_norm.weight"):
        load_pretrained(folder, draft_path=tmp_path / "head.safetensors")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError,
                       match="spec.draft_path .*empty is a folder without model.safetensors"):
        load_pretrained(folder, draft_path=tmp_path / "empty")


def test_string_prompts_without_tokenizer_name_the_folder(tmp_path):
    from mtpx import LLM
    folder = _write(_model(num_nextn_predict_layers=0, **LLAMA).float(), tmp_path / "m")
    llm = LLM(model=str(folder))
    assert llm.generate([[3, 4, 5]])[0].output_token_ids  # token ids work without a tokenizer
    with pytest.raises(ValueError, match=r"checkpoint folder .*m has no tokenizer.json"):
        llm.generate(["hello"])
