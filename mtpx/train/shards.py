"""Hidden-state shards: the frozen target's outputs on a training corpus, written once by
`mode=extract` (mtpx/train/extract.py) and read by head training (`train.hidden_states_path`), so
that training MTP heads never runs, nor loads, the target's decoder layers.

A folder holds `manifest.json` and shards `shard-00000-of-00004.safetensors`, each with the rows
[i * shard_size, (i + 1) * shard_size) of the packed corpus (train rows first, then validation
rows, as mode=train packs them from the same train keys):

    input_ids      [n, seq_len] int64     the packed block
    hidden_states  [n, seq_len, hidden]   the target's final hidden states h (after its last norm)
    topk_logprobs  [n, seq_len, top_k]    log softmax(lm_head(h)) at temperature 1, the K largest
    topk_indices   [n, seq_len, top_k]    int32, their token ids
    source_id      [n] int64              index into manifest["sources"]

The manifest records the format, the target's hash (`checkpoint_target_sha256`: every tensor of
model.path outside the draft modules, as stored), the tokenizer's hash, the corpus's hash (its
token ids), seq_len, top_k, the dtype, the shard size and the row counts; a shard is written
atomically (a temporary file renamed), so a shard on disk is complete. Training refuses a folder
whose target or tokenizer hash is not model.path's, with one line naming the key.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file

FORMAT = "mtpx-hidden-states-v1"
MANIFEST_FILE = "manifest.json"
# the keys a resumed extraction must share with the folder's manifest, in the order they are named
RESUME_KEYS = ("format", "target_sha256", "tokenizer_sha256", "seq_len", "top_k", "dtype", "shard_size",
               "corpus_sha256", "num_train_rows", "num_val_rows")


def shard_name(i: int, n: int) -> str:
    return f"shard-{i:05d}-of-{n:05d}.safetensors"


def weight_files(path: Path) -> list[Path]:
    """The checkpoint's safetensors files, in name order. Raises FileNotFoundError."""
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"model.path={path} has no .safetensors weights")
    return files


def checkpoint_target_sha256(path: str | Path) -> str:
    """SHA-256 of the target's tensors in checkpoint folder `path` as stored (name, dtype, shape and
    bytes of every tensor whose name does not start with "mtp.", in name order), read one tensor at a
    time: no model is built."""
    h = hashlib.sha256()
    for f in weight_files(Path(path)):
        with safe_open(str(f), framework="pt") as st:
            for name in sorted(k for k in st.keys() if not k.startswith("mtp.")):
                t = st.get_tensor(name).contiguous().reshape(-1)
                h.update(f"{name}:{t.dtype}:{tuple(t.shape)};".encode())
                h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def corpus_sha256(blocks: torch.Tensor) -> str:
    """SHA-256 of the packed corpus's token ids ([N, seq_len] int64)."""
    return hashlib.sha256(blocks.to(torch.int64).contiguous().numpy().tobytes()).hexdigest()


def read_manifest(path: str | Path, key: str) -> dict:
    """The manifest of shard folder `path`. Raises ValueError naming `key` when the folder is not one."""
    path = Path(path)
    if not (path / MANIFEST_FILE).is_file():
        raise ValueError(f"{key}={path} is not a hidden-state shard folder (no {MANIFEST_FILE}): write one "
                         "with mode=extract")
    try:
        manifest = json.loads((path / MANIFEST_FILE).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"{key}={path}: its {MANIFEST_FILE} is unreadable ({e}): "
                         "run mode=extract again") from e
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ValueError(f"{key}={path}: {MANIFEST_FILE} is not of format {FORMAT}: run mode=extract again")
    return manifest


def missing_shards(path: Path, manifest: dict) -> list[int]:
    n = manifest["num_shards"]
    return [i for i in range(n) if not (path / shard_name(i, n)).is_file()]


class HiddenStateShards:
    """A complete shard folder, checked against the model it trains heads for, read into memory.

    check(model_path, tokenizer_sha): ValueError naming train.hidden_states_path when the
    shards were extracted from another target or tokenizer, or shards are missing.
    rows(idx [n] int64) -> (input_ids [n, T], hidden [n, T, H] float32, topk values [n, T, K]
    float32, topk indices [n, T, K] int64).
    """

    KEY = "train.hidden_states_path"

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.manifest = read_manifest(self.path, self.KEY)
        missing = missing_shards(self.path, self.manifest)
        if missing:
            raise ValueError(f"{self.KEY}={self.path} lacks {len(missing)} of its "
                             f"{self.manifest['num_shards']} shards: finish the extraction (rerun the same "
                             "mode=extract command)")
        n = self.manifest["num_shards"]
        parts = [load_file(str(self.path / shard_name(i, n))) for i in range(n)]
        cat = {k: torch.cat([p[k] for p in parts]) for k in parts[0]}
        self.input_ids, self.hidden = cat["input_ids"], cat["hidden_states"]
        self.topk_values, self.topk_indices = cat["topk_logprobs"], cat["topk_indices"]
        self.source_id = cat["source_id"]

    @property
    def num_train_rows(self) -> int:
        return int(self.manifest["num_train_rows"])

    def check(self, model_path: str | Path, tokenizer_sha: str) -> None:
        m = self.manifest
        if m["tokenizer_sha256"] != tokenizer_sha:
            raise ValueError(f"{self.KEY}={self.path} was extracted with another tokenizer (tokenizer_sha256 "
                             f"{m['tokenizer_sha256'][:12]}.., model.path's {tokenizer_sha[:12]}..): extract "
                             "again with this model.path")
        target = checkpoint_target_sha256(model_path)
        if m["target_sha256"] != target:
            raise ValueError(f"{self.KEY}={self.path} holds another target's hidden states (target_sha256 "
                             f"{m['target_sha256'][:12]}.., model.path's {target[:12]}..): extract "
                             "again with this model.path")

    def rows(self, idx: torch.Tensor):
        return (self.input_ids[idx], self.hidden[idx].float(), self.topk_values[idx].float(),
                self.topk_indices[idx].long())
