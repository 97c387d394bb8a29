"""Training: tokenizer, corpora, checkpoints and the joint next-token + MTP training loop.

    from mtpx.train import train, load_model, save_checkpoint
    final_ckpt = train(cfg)                  # cfg: OmegaConf with model / train sections
    model, tokenizer = load_model(final_ckpt)
"""
from mtpx.train.checkpoint import (
    CheckpointError,
    load_config,
    load_model,
    load_optimizer_state,
    load_trainer_state,
    save_checkpoint,
)
from mtpx.train.loop import evaluate, lr_at, train, train_step
from mtpx.train.tokenizer import (decode, encode, eos_token_id, load_tokenizer, pad_token_id, save_tokenizer,
                                  train_tokenizer)

__all__ = [
    "CheckpointError",
    "decode",
    "encode",
    "eos_token_id",
    "evaluate",
    "load_config",
    "load_model",
    "load_optimizer_state",
    "load_tokenizer",
    "load_trainer_state",
    "lr_at",
    "pad_token_id",
    "save_checkpoint",
    "save_tokenizer",
    "train",
    "train_step",
    "train_tokenizer",
]
