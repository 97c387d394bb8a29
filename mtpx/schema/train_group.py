"""mode=train's structured config (the training group; the other groups are in mtpx.schema.groups)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Optional

from mtpx.schema.groups import _Group
from mtpx.models.config import literal_choices


@dataclass
class TrainConfig(_Group):
    """mode=train: joint next-token + MTP training (or MTP modules alone with freeze_base=true)."""
    out_dir: str = "checkpoints/run"
    """Checkpoint folder (config.json, model.safetensors, tokenizer.json)."""
    steps: int = 2000
    """Optimizer steps in all (a rerun with more resumes)."""
    batch_size: int = 16
    """The GLOBAL batch: rows per optimizer step over all torchrun ranks."""
    seq_len: int = 256
    """Tokens per training row."""
    lr: float = 3.0e-3
    """Peak learning rate (AdamW), after warmup_steps of linear warm-up."""
    min_lr: float = 3.0e-4
    """The cosine schedule's final learning rate."""
    warmup_steps: int = 100
    """Linear warm-up steps."""
    weight_decay: float = 0.1
    """AdamW's decoupled weight decay."""
    grad_clip: float = 1.0
    """Gradient norm clip (<= 0 = no clipping)."""
    mtp_loss_weight: float = 0.3
    """loss = main + mtp_loss_weight * sum over MTP depths."""
    freeze_base: bool = False
    """true: train the MTP modules only, on a frozen target (needs model.path)."""
    eval_every: int = 200
    """Validation loss every this many steps (0 = off)."""
    eval_batches: int = 8
    """Batches per validation."""
    save_every: int = 200
    """A checkpoint every this many steps (and at the end; 0 = at the end only)."""
    resume: bool = True
    """Continue from out_dir's checkpoint when there is one."""
    seed: int = 0
    """Initialisation and data order."""
    tokenizer_vocab_size: int = 2048
    """The byte-level BPE tokenizer trained for a fresh model."""
    data_sources: list[str] = field(default_factory=lambda: ["gsm8k", "stdlib"])
    """gsm8k | stdlib | distill, each optionally name:weight."""
    gsm8k_path: str = "${data_dir}/gsm8k/train.jsonl"
    """Data source 'gsm8k': GSM8K's train split."""
    stdlib_max_bytes: Optional[int] = 4000000
    """Data source 'stdlib': bytes of the Python standard library's source at most."""
    val_fraction: float = 0.05
    """Documents of each source held out for validation."""
    log_every: int = 10
    """A progress line / W&B point every this many steps."""
    threads: Optional[int] = None
    """Torch threads (null = measured at start-up as eval's: the fastest count the CPUs allow;
    OMP_NUM_THREADS wins; a resume keeps the run's count)."""
    device: str = "cpu"
    """cpu | cuda, or any torch device of those types, e.g. cuda:1 (checked by
    mtpx.train.setup)."""
    save_dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Dtype of the saved weights."""
    parallel: Literal["auto", "none", "ddp", "fsdp"] = "auto"
    """auto (ddp under torchrun with > 1 rank) | none | ddp | fsdp (freeze_base=true: the target
    sharded); mtpx/train/distributed.py."""
    dist_timeout_s: float = 120.0
    """Bound on every collective: a dead or hung rank ends the job."""
    mtp_loss_decay: float = 1.0
    """Depth k weighs mtp_loss_weight * decay^(k-1), in (0, 1] (FastMTP; 1 = equal)."""
    mtp_unroll: int = 0
    """> 0: module 0 applied this many times on its own outputs (single-module MTP; needs
    model.num_nextn_predict_layers=1)."""
    mtp_unroll_ttt: bool = False
    """With mtp_unroll: EAGLE-3's training-time test (each step at inference's positions and
    attention context; mtpx/train/chains.py)."""
    mtp_loss: Literal["ce", "kl", "tv", "lk_hybrid", "lk_nll"] = "ce"
    """Per-depth loss: ce on the data's tokens | kl | tv | lk_hybrid | lk_nll to the target's
    distribution (mtpx/train/acceptance_losses.py)."""
    mtp_loss_temperature: float = 1.0
    """Temperature (> 0) of the target's and the draft's distributions in every loss but ce."""
    lk_loss_eta: float = 3.0
    """lk_hybrid's eta (>= 0): KL weighs exp(-eta * acceptance) (arXiv 2602.23881)."""
    mtp_hidden_input: Literal["chain", "target"] = "chain"
    """Module k reads module k-1's output (chain, as at inference) or the target's hidden state
    h_{j+k-1} (target: teacher forcing)."""
    mtp_freeze_modules: int = 0
    """The first this many draft modules stay frozen (train modules added to a checkpoint)."""
    hidden_states_path: Optional[str] = None
    """A folder of the target's hidden states written by mode=extract (which writes it): heads
    train on them without the target's layers (needs freeze_base=true; mtpx/train/shards.py)."""
    hidden_states_top_k: int = 64
    """mode=extract: the target's top-k log-probs kept per token (for the distribution losses)."""
    hidden_states_shard_size: int = 256
    """mode=extract: rows (packed blocks) per shard."""
    mtp_share_fc: bool = False
    """Modules share module 0's fc and norms (Qwen3-Next layout; mtp_style=qwen3_next)."""
    distill_path: Any = None
    """Data source 'distill': a folder written by mode=distill (distill.out_dir), or a list of such
    folders whose records are concatenated (e.g. [gsm8k_answers,code_answers])."""
    autocast: Optional[Literal["bfloat16"]] = None
    """bfloat16: forward + loss in torch.autocast (weights, grads, AdamW state stay float32);
    null = float32 (float16 would need a gradient scaler)."""

    _choose = "use one of"
    _checked_elsewhere = ("autocast",)          # its own line below
    REQUIRED = ("out_dir", "steps", "batch_size", "seq_len", "lr", "min_lr", "warmup_steps", "weight_decay",
                "grad_clip", "mtp_loss_weight", "freeze_base", "eval_every", "eval_batches", "save_every",
                "seed", "tokenizer_vocab_size", "data_sources", "log_every")

    @classmethod
    def check(cls, section: str, t) -> None:
        """The train section's own checks (those across sections, and those that read the output
        folder, are mtpx.train.loop's)."""
        missing = [k for k in cls.REQUIRED if k not in t or t[k] is None]
        if missing:
            raise ValueError(f"train config lacks {missing}: add them to the train section")

        def check(key, ok, requirement):
            value = t[key]
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not ok(value):
                raise ValueError(f"{section}.{key}={value!r}: must be {requirement}")

        for key in ("steps", "batch_size", "seq_len", "eval_batches", "log_every", "tokenizer_vocab_size"):
            check(key, lambda v: isinstance(v, int) and v >= 1, "an integer >= 1")
        if t.get("threads") is not None:
            check("threads", lambda v: isinstance(v, int) and v >= 1,
                  "an integer >= 1, or null (measured at start-up)")
        for key in ("warmup_steps", "eval_every", "save_every", "seed"):
            check(key, lambda v: isinstance(v, int) and v >= 0, "an integer >= 0 (0 = off)"
                  if key != "seed" else "an integer >= 0")
        check("lr", lambda v: v > 0, "a learning rate > 0")
        check("min_lr", lambda v: 0 <= v <= t.lr, f"a number in [0, {section}.lr={t.lr}]")
        for key in ("weight_decay", "mtp_loss_weight"):
            check(key, lambda v: v >= 0, "a number >= 0")
        check("grad_clip", lambda v: True, "a number (<= 0 = no clipping)")
        if "val_fraction" in t:
            check("val_fraction", lambda v: 0 < v < 1, "a fraction in (0, 1)")
        if t.get("mtp_loss_decay") is not None:
            check("mtp_loss_decay", lambda v: 0 < v <= 1, "a number in (0, 1] (1 = equal weights)")
        if t.get("mtp_unroll") is not None:
            check("mtp_unroll", lambda v: isinstance(v, int) and v >= 0, "an integer >= 0 (0 = off)")
        if t.get("mtp_loss_temperature") is not None:
            check("mtp_loss_temperature", lambda v: v > 0, "a temperature > 0")
        if t.get("lk_loss_eta") is not None:
            check("lk_loss_eta", lambda v: v >= 0, "a number >= 0")
        for key in ("hidden_states_top_k", "hidden_states_shard_size"):
            if t.get(key) is not None:
                check(key, lambda v: isinstance(v, int) and v >= 1, "an integer >= 1")
        if t.get("mtp_freeze_modules") is not None:
            check("mtp_freeze_modules", lambda v: isinstance(v, int) and v >= 0, "an integer >= 0")
        if t.get("dist_timeout_s") is not None:
            check("dist_timeout_s", lambda v: v > 0, "a number of seconds > 0")
        if t.get("autocast") not in literal_choices(cls)["autocast"]:
            raise ValueError(f"{section}.autocast={t.autocast!r}: use bfloat16 (mixed precision) "
                             "or null (float32)")
        super().check(section, t)
