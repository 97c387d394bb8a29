import json, sys, shutil
from pathlib import Path
import torch
sys.path.insert(0, "/work/main")
from mtpx.models.config import ModelConfig
from mtpx.models.model import MTPForCausalLM
from mtpx.train.checkpoint import save_checkpoint
from mtpx.train.tokenizer import load_tokenizer
base = json.load(open("/work/main/checkpoints/demo/config.json"))
tok = load_tokenizer("/work/main/checkpoints/demo/tokenizer.json") if False else None
def make(name, **kw):
    d = dict(base); d.update(kw)
    n = d["num_hidden_layers"]; fi = d["full_attention_interval"]
    d["layer_types"] = ["full_attention" if (i + 1) % fi == 0 else "linear_attention" for i in range(n)]
    cfg = ModelConfig.from_dict(d) if hasattr(ModelConfig, "from_dict") else ModelConfig(**d)
    torch.manual_seed(0)
    m = MTPForCausalLM(cfg)
    out = Path("/tmp/shapes") / name
    out.mkdir(exist_ok=True)
    (out / "config.json").write_text(json.dumps(cfg.to_dict(), indent=2))
    import safetensors.torch
    from mtpx.train.checkpoint import _stored_state
    safetensors.torch.save_file({k: v.detach().to(torch.bfloat16).contiguous() for k, v in _stored_state(m).items()}, str(out / "model.safetensors"))
    shutil.copy("/work/main/checkpoints/demo/tokenizer.json", out / "tokenizer.json")
    nparam = sum(p.numel() for p in m.parameters())
    print(name, nparam, (out / "model.safetensors").stat().st_size / 1e6, "MB")
for spec in sys.argv[1:]:
    name, L, h, i = spec.split(":")
    make(name, num_hidden_layers=int(L), hidden_size=int(h), intermediate_size=int(i))
