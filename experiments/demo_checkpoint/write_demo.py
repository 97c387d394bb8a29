"""Write the demo checkpoint from a finished training run folder: its weights in bfloat16, its
config and tokenizer (with a tokenizer_config.json, so transformers' AutoTokenizer loads it as
mtpx's tokenizer), no optimizer state.

    python experiments/demo_checkpoint/write_demo.py checkpoints/demo_deep_run checkpoints/demo
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a checkout without installing

import torch  # noqa: E402

from mtpx.hf.tokenizer import write_tokenizer_config  # noqa: E402
from mtpx.train.checkpoint import load_model, save_checkpoint  # noqa: E402

if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    model, tokenizer = load_model(sys.argv[1])
    save_checkpoint(sys.argv[2], model, tokenizer, dtype=torch.bfloat16, extra_files=lambda tmp: (
        None if (tmp / "tokenizer_config.json").exists() else write_tokenizer_config(tmp, tokenizer)))
