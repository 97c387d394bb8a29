"""Random-weight checkpoint folders of candidate demo shapes, for tools/bench_step.py
(experiments/demo_checkpoint/README.md):

    python experiments/demo_checkpoint/make_random_shapes.py OUT_DIR L16h128:16:128:384 L32h128:32:128:384

Each spec is NAME:LAYERS:HIDDEN:INTERMEDIATE; the other fields are checkpoints/demo's, the layer
pattern is 3 Gated DeltaNet : 1 gated attention, weights are stored in bf16, the tokenizer is
the demo's.
"""
import json
import shutil
import sys
from pathlib import Path

import safetensors.torch
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from mtpx.models.config import ModelConfig  # noqa: E402
from mtpx.models.model import MTPForCausalLM  # noqa: E402

DEMO = ROOT / "checkpoints" / "demo"


def make(out: Path, layers: int, hidden: int, intermediate: int) -> None:
    d = json.loads((DEMO / "config.json").read_text())
    d.update(num_hidden_layers=layers, hidden_size=hidden, intermediate_size=intermediate, layer_types=None)
    cfg = ModelConfig.from_dict(d)
    torch.manual_seed(0)
    model = MTPForCausalLM(cfg)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(cfg.to_dict(), indent=2))
    seen, tensors = set(), {}
    for name, t in model.state_dict(keep_vars=True).items():   # tied weights are stored once
        if id(t) not in seen:
            seen.add(id(t))
            tensors[name] = t.detach().to(torch.bfloat16).contiguous()
    safetensors.torch.save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    shutil.copy(DEMO / "tokenizer.json", out / "tokenizer.json")
    params = sum(p.numel() for p in model.parameters())
    print(f"{out.name}: {params:,} parameters, {(out / 'model.safetensors').stat().st_size / 1e6:.1f} MB")


if __name__ == "__main__":
    root = Path(sys.argv[1])
    for spec in sys.argv[2:]:
        name, layers, hidden, intermediate = spec.split(":")
        make(root / name, int(layers), int(hidden), int(intermediate))
