"""Head training from hidden-state shards (`train.hidden_states_path`, mtpx/train/shards.py): what
mode=train changes when the target's outputs are read instead of computed.

- The model is built from model.path WITHOUT the target's decoder layers (`light_model`): only
  the embedding, the final norm, lm_head and the draft modules are read from the checkpoint (the
  embedding feeds the modules, lm_head scores them). A resumed run loads its checkpoint whole.
- Batches are the rows mode=train would sample from the same corpus (the same BatchSampler over
  the same packed blocks), each row carrying its shard row index in an extra last column
  (`ShardSampler`), which `ShardObjective` turns into the row's hidden states and top-k log-probs.
- A checkpoint is complete: the target's layer tensors are copied from model.path's files at each
  save (`merged_state`), so it loads, evaluates and resumes like any other.
"""
from __future__ import annotations

from pathlib import Path

import torch
import torch.nn as nn
from omegaconf import DictConfig
from rich.console import Console
from safetensors import safe_open

from mtpx.hf.loader import is_hf_folder, load_folder_tokenizer
from mtpx.models.config import ModelConfig
from mtpx.models.model import MTPForCausalLM
from mtpx.train import checkpoint as ckpt
from mtpx.train import distributed
from mtpx.train.data import BatchSampler, PackedCorpus, parse_data_sources
from mtpx.train.losses import Objective
from mtpx.train.shards import HiddenStateShards, weight_files
from mtpx.train.tokenizer import tokenizer_sha256

LAYERS = "model.layers."


def light_model(path: str, want: dict, seed: int, console: Console) -> tuple[MTPForCausalLM, object]:
    """(model without target decoder layers, tokenizer) from mtpx checkpoint `path`, with
    want["num_nextn_predict_layers"] draft modules when given (new ones randomly initialised with
    `seed`). model.cfg stays the checkpoint's. Raises ValueError for a Hugging Face folder."""
    if is_hf_folder(Path(path)):
        raise ValueError("train.hidden_states_path trains from an mtpx checkpoint at model.path; convert the "
                         "Hugging Face folder first (or train without shards)")
    saved = ckpt.load_config(path)
    full = ModelConfig.from_dict({**saved.to_dict(), "num_nextn_predict_layers":
                                  want.get("num_nextn_predict_layers", saved.num_nextn_predict_layers)})
    torch.manual_seed(seed)
    model = MTPForCausalLM(ModelConfig.from_dict({**full.to_dict(), "num_hidden_layers": 1,
                                                  "layer_types": [full.layer_types[0]]}))
    model.model.layers = nn.ModuleList()
    model.cfg = model.model.cfg = full
    state = {}
    for f in weight_files(Path(path)):
        with safe_open(str(f), framework="pt") as st:
            for name in st.keys():
                extra = name.startswith("mtp.") and int(name.split(".")[1]) >= full.num_nextn_predict_layers
                if not name.startswith(LAYERS) and not extra:
                    state[name] = st.get_tensor(name).float()
    # a tensor tied to a loaded one (lm_head to the embedding, a deepseek_v3 head to lm_head) is loaded
    params = model.state_dict(keep_vars=True)
    loaded = {params[k].data_ptr() for k in state if k in params}
    missing = [k for k in model.load_state_dict(state, strict=False).missing_keys
               if not (k.startswith("mtp.") and int(k.split(".")[1]) >= saved.num_nextn_predict_layers)
               and params[k].data_ptr() not in loaded]
    if missing:
        raise ValueError(f"model.path={path} lacks {len(missing)} tensors the heads need ({missing[:3]}): "
                         "point model.path at a complete mtpx checkpoint")
    tok = load_folder_tokenizer(Path(path))
    console.print(f"model.path={path}: the target's {saved.num_hidden_layers} decoder layers are not loaded "
                  "(train.hidden_states_path)")
    return model.train(), tok


class ShardObjective(Objective):
    """Objective whose batches are [B, T + 1]: the tokens and the shard row index (module doc)."""

    def __init__(self, model: MTPForCausalLM, shards: HiddenStateShards, model_path: str, **kw):
        super().__init__(model, **kw)
        self.shards, self.model_path = shards, model_path

    def forward(self, batch: torch.Tensor, train_base: bool = True):
        ids, hidden, values, indices = self.shards.rows(batch[:, -1].cpu())
        dev = batch.device
        return super().forward(batch[:, :-1], False, hidden.to(dev), (values.to(dev), indices.to(dev)))


class ShardSampler(BatchSampler):
    """BatchSampler's rows (the same indices for the same seed and step) with their index appended."""

    def batch(self, step: int) -> torch.Tensor:
        g = torch.Generator().manual_seed((self.seed << 32) + step)
        idx = torch.multinomial(self.probs, self.batch_size, replacement=True, generator=g)
        return torch.cat([self.corpus.blocks[idx], idx[:, None]], 1)


def open_shards(t: DictConfig, model_path: str | None, tok) -> HiddenStateShards | None:
    """The checked shard folder of train.hidden_states_path, or None without one. Raises
    ValueError naming the key (no model.path, not a shard folder, another target or tokenizer,
    freeze_base false)."""
    if not t.get("hidden_states_path"):
        return None
    if not model_path or not t.freeze_base:
        raise ValueError("train.hidden_states_path trains heads on a frozen target: set "
                         "train.freeze_base=true and model.path to the target the shards were extracted from")
    shards = HiddenStateShards(str(t.hidden_states_path))
    shards.check(model_path, tokenizer_sha256(tok))
    if shards.manifest["seq_len"] != int(t.seq_len):
        raise ValueError(f"train.seq_len={t.seq_len} differs from the shards' {shards.manifest['seq_len']}: "
                         f"set train.seq_len={shards.manifest['seq_len']}")
    return shards


def source_weights(t: DictConfig, manifest: dict) -> list[float]:
    """The mixing weights of the shards' sources: train.data_sources' when it names the shards'
    sources in their order (one extraction serves several mixes), else the extraction's."""
    specs = parse_data_sources(list(t.get("data_sources") or []) or ["distill"])
    if [sp.name for sp in specs] == list(manifest["sources"]):
        return [sp.weight for sp in specs]
    return [float(w) for w in manifest["weights"]]


def shard_corpora(t: DictConfig, info, device: torch.device, shards: HiddenStateShards, console: Console):
    """mode=train's _Corpora over the shards' rows (the sampler and validation batches carry the
    row index column)."""
    from mtpx.train.loop import _Corpora
    m, n = shards.manifest, shards.num_train_rows
    weights = source_weights(t, m)
    train = PackedCorpus(shards.input_ids[:n], shards.source_id[:n], list(m["sources"]), weights)
    val = PackedCorpus(shards.input_ids[n:], shards.source_id[n:], list(m["sources"]), weights)
    if len(val) == 0:
        raise ValueError(f"train.hidden_states_path={shards.path} has no validation rows: extract with a "
                         "larger corpus or train.val_fraction")
    rows = n + torch.arange(int(t.eval_batches) * int(t.batch_size)) % len(val)
    batches = torch.cat([shards.input_ids[rows], rows[:, None]], 1).view(int(t.eval_batches),
                                                                          int(t.batch_size), -1)
    val_batches = [distributed.rank_rows(b, info).to(device) for b in batches.unbind(0)]
    mix = ", ".join(f"{name}:{w:g}" for name, w in zip(m["sources"], weights))
    console.print(f"data: {n} train and {len(val)} val rows of hidden states from {shards.path} "
                  f"(sources {mix})")
    return _Corpora(train, val, ShardSampler(train, int(t.batch_size), int(t.seed)), val_batches)


def merged_state(model: MTPForCausalLM, model_path: str) -> dict[str, torch.Tensor]:
    """The model's state with the target's layer tensors read from model.path (unchanged: frozen)."""
    state = {}
    for f in weight_files(Path(model_path)):
        with safe_open(str(f), framework="pt") as st:
            state.update({k: st.get_tensor(k) for k in st.keys() if k.startswith(LAYERS)})
    return {**state, **model.state_dict()}
