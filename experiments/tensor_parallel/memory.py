"""Per-rank memory of the demo checkpoint under tensor parallelism: parameter bytes (sharded and
replicated), KV-cache bytes and Gated DeltaNet recurrent-state bytes of an mtp8 engine with the
run's settings (64 batch slots, max_model_len 1024, block size 16, no prefix caching), for TP=1
and each rank of TP=2. Loading and building an engine need no process group (no collective
runs), so this runs in one process: `python experiments/tensor_parallel/memory.py`."""
from __future__ import annotations

import torch

from mtpx.engine.config import EngineConfig
from mtpx.engine.tensor_parallel import build_engine
from mtpx.hf.loader import load_pretrained
from mtpx.parallel import TPGroup, shard_model

PATH = "checkpoints/demo"


def tensor_bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))


def measure(world: int, rank: int) -> dict:
    plans = []

    def shard(model):
        plans.append(shard_model(model, TPGroup(rank, world)))
        return plans[-1]

    model, _ = load_pretrained(PATH, shard=shard if world > 1 else None)
    params = {id(p): (n, p) for n, p in model.named_parameters()}.values()
    sharded = set(plans[0].shards) if plans else set()
    replicated = [(n, p) for n, p in params if n not in sharded]
    _, engine = build_engine(model, "mtp8", None, False,
                             EngineConfig(max_num_seqs=64, tensor_parallel_size=world, compile=False))
    cache = engine.cache
    kv = sum(tensor_bytes([c.k, c.v]) for c in cache.kv_caches)
    rec = sum(tensor_bytes(vars(g).values()) for g in cache.recurrent_groups)
    return {"params": tensor_bytes(p for _, p in params),
            "replicated": tensor_bytes(p for _, p in replicated),
            "replicated_kinds": sorted({n.split(".")[-2] if n.count(".") else n for n, _ in replicated}),
            "kv": kv, "recurrent": rec}


def main() -> None:
    rows = [("TP=1", measure(1, 0))] + [(f"TP=2 rank {r}", measure(2, r)) for r in range(2)]
    base = rows[0][1]
    print("| | parameter bytes | of which replicated | KV cache bytes | recurrent-state bytes |")
    print("|---|---:|---:|---:|---:|")
    for name, m in rows:
        rep = "—" if name == "TP=1" else f"{m['replicated']:,}"
        print(f"| {name} | {m['params']:,} ({m['params'] / base['params']:.3f}) | {rep} | "
              f"{m['kv']:,} ({m['kv'] / base['kv']:.3f}) | {m['recurrent']:,} "
              f"({m['recurrent'] / base['recurrent']:.3f}) |")
    print()
    print("replicated parameters (TP=2), by module:", ", ".join(rows[1][1]["replicated_kinds"]))


if __name__ == "__main__":
    main()
