"""`mode=extract`: write the frozen target's hidden states and top-k log-probs on the training
corpus as safetensors shards (the format: mtpx/train/shards.py), for head training without the
target (`mode=train train.hidden_states_path=DIR`).

    python train_or_eval.py mode=extract model.path=checkpoints/demo 'train.data_sources=[distill]' \\
        train.distill_path=distill/gsm8k_train train.seq_len=256 train.hidden_states_path=hs/demo

The corpus is packed from the train keys exactly as mode=train packs it (data_sources, seq_len,
val_fraction, the checkpoint's tokenizer), train rows then validation rows. Resumable: a rerun
keeps the written shards (each written atomically) and refuses a folder whose manifest differs in
a key of shards.RESUME_KEYS (named). Under torchrun rank r writes the shards i with
i % WORLD_SIZE == r, as mode=distill does; no process group is needed.
"""
from __future__ import annotations

import os
from pathlib import Path

import torch
from omegaconf import DictConfig
from safetensors.torch import save

from mtpx.io import GracefulInterrupt, Interrupted, atomic_write_bytes, atomic_write_json, check_writable_dir
from mtpx.train import checkpoint as ckpt
from mtpx.train.data import pack_corpus
from mtpx.train.loop import _load_data
from mtpx.train.setup import check_cfg
from mtpx.train.shards import (FORMAT, MANIFEST_FILE, RESUME_KEYS, checkpoint_target_sha256, corpus_sha256,
                               missing_shards, read_manifest, shard_name)
from mtpx.train.tokenizer import tokenizer_sha256

KEY = "train.hidden_states_path"


def _settings(cfg: DictConfig) -> tuple[DictConfig, Path, Path]:
    """(train section, model.path, out folder), checked. Raises ValueError naming the key."""
    t = check_cfg(cfg)
    if not cfg.model.get("path"):
        raise ValueError("mode=extract needs model.path: the target checkpoint whose hidden states to write")
    if not t.get("hidden_states_path"):
        raise ValueError(f"mode=extract needs {KEY}: the folder to write the shards to")
    out = Path(str(t.hidden_states_path))
    if out.exists() and not out.is_dir():
        raise ValueError(f"{KEY}={out} is a file: choose a folder")
    if out.is_dir() and any(out.iterdir()) and not (out / MANIFEST_FILE).is_file():
        raise ValueError(f"{KEY}={out} exists and was not written by mode=extract (no {MANIFEST_FILE}): "
                         "choose a new folder")
    check_writable_dir(out, KEY)
    return t, Path(str(cfg.model.path)), out


def _corpus(t: DictConfig, tok) -> tuple[torch.Tensor, torch.Tensor, list[str], list[float], int]:
    """(blocks [N, seq_len], source ids [N], sources, weights, number of train rows)."""
    specs, _, split = _load_data(t)
    weights = {s.name: s.weight for s in specs}
    train = pack_corpus({n: tr for n, (tr, _) in split.items()}, weights, tok, int(t.seq_len))
    val = pack_corpus({n: va for n, (_, va) in split.items()}, weights, tok, int(t.seq_len))
    return (torch.cat([train.blocks, val.blocks]), torch.cat([train.source_id, val.source_id]),
            train.sources, train.weights, len(train))


@torch.no_grad()
def target_outputs(model, ids: torch.Tensor, top_k: int) -> dict[str, torch.Tensor]:
    """The shard tensors of rows ids [n, T]: hidden states and the top-k of log softmax(lm_head(h))."""
    h = model.model(ids)
    logp = torch.log_softmax(model.lm_head(h).float(), dim=-1)
    top = logp.topk(top_k, dim=-1)
    return {"input_ids": ids.contiguous(), "hidden_states": h.float().contiguous(),
            "topk_logprobs": top.values.contiguous(),
            "topk_indices": top.indices.to(torch.int32).contiguous()}


def run_extract(cfg: DictConfig) -> int:
    """mode=extract (module doc). Returns 0 once this rank's shards are written. Raises ValueError
    naming the key for bad settings or a folder of other settings; Interrupted after Ctrl-C or
    SIGTERM (the written shards are kept)."""
    t, model_path, out = _settings(cfg)
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    if t.get("threads") is not None:
        torch.set_num_threads(int(t.threads))
    model, tok = ckpt.load_model(model_path)
    model.eval()
    blocks, source_id, sources, weights, n_train = _corpus(t, tok)
    top_k = min(int(t.get("hidden_states_top_k") or 64), model.cfg.vocab_size)
    size = int(t.get("hidden_states_shard_size") or 256)
    manifest = {"format": FORMAT, "target_sha256": checkpoint_target_sha256(model_path),
                "tokenizer_sha256": tokenizer_sha256(tok), "corpus_sha256": corpus_sha256(blocks),
                "seq_len": int(t.seq_len), "top_k": top_k, "dtype": "float32", "shard_size": size,
                "num_train_rows": n_train, "num_val_rows": len(blocks) - n_train,
                "num_shards": -(-len(blocks) // size), "hidden_size": model.cfg.hidden_size,
                "vocab_size": model.cfg.vocab_size, "sources": sources, "weights": weights,
                "model_path": str(model_path), "data_sources": list(t.data_sources)}
    if (out / MANIFEST_FILE).is_file():
        saved = read_manifest(out, KEY)
        for key in RESUME_KEYS:
            if saved.get(key) != manifest[key]:
                raise ValueError(f"{KEY}={out} holds shards extracted with another {key} "
                                 f"({saved.get(key)!r}, now {manifest[key]!r}): use a new {KEY}, or rerun "
                                 "with the folder's settings")
    else:
        atomic_write_json(out / MANIFEST_FILE, manifest)
    todo = [i for i in missing_shards(out, manifest) if i % world == rank]
    print(f"extract: {len(blocks)} rows of {t.seq_len} tokens ({n_train} train) in {manifest['num_shards']} "
          f"shards of {size} into {out}; {len(todo)} to write")
    batch, n = int(t.batch_size), manifest["num_shards"]
    with GracefulInterrupt() as interrupt:
        for i in todo:
            rows = range(i * size, min((i + 1) * size, len(blocks)))
            parts = [target_outputs(model, blocks[j: min(j + batch, rows.stop)], top_k)
                     for j in range(rows.start, rows.stop, batch)]
            tensors = {k: torch.cat([p[k] for p in parts]) for k in parts[0]}
            tensors["source_id"] = source_id[rows.start: rows.stop].contiguous()
            atomic_write_bytes(out / shard_name(i, n), save(tensors))
            if interrupt.requested and i != todo[-1]:
                raise Interrupted(f"extraction stopped after {shard_name(i, n)}; rerun the same command to "
                                  "write the rest")
    return 0
