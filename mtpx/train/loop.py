"""The training loop: joint next-token + MTP objective (DeepSeek-V3 §2.2), nanoGPT / torchtitan style.

    train(cfg)
      ├─ state      fresh (train a tokenizer, random init) | init from model.path | resume out_dir
      ├─ data       documents -> train/val split -> packed blocks -> BatchSampler (pure fn of step)
      ├─ optimizer  AdamW (decay on matrices only), cosine LR with linear warmup, grad clipping
      └─ for step:  train_step -> history/log -> evaluate every eval_every -> save every save_every

A run is a pure function of (config, step): the batch of step s, the LR of step s and the RNG seed
of step s depend on nothing else, and the optimizer moments are saved with the weights. So a run
killed after its checkpoint at step N and restarted reaches the same weights as one never stopped.

Under torchrun the same loop runs data-parallel (mtpx/train/distributed.py): each rank trains its
slice of the step's global batch, losses are averaged over ranks, and rank 0 alone logs, draws
the progress bar and writes checkpoints, after gathering a sharded state. The checkpoint format
does not depend on the world size, so a run resumes at any world size.

Config: the `model` and `train` groups (an OmegaConf DictConfig or a plain dict; every key with its
default: mtpx/schema, docs/configuration.md). model.path is a checkpoint folder to start from
(required by freeze_base): its config.json fixes the architecture, and only num_nextn_predict_layers
may differ (missing draft modules start from random init, extra ones are dropped); vocab_size is
set from the tokenizer.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf
from rich.console import Console
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                           TimeRemainingColumn)
from tokenizers import Tokenizer

from mtpx.engine.threads import ThreadChoice
from mtpx.io import GracefulInterrupt, Interrupted
from mtpx.metrics.progress import ProgressLines
from mtpx.models.model import MTPForCausalLM
from mtpx.hf.layout import QWEN3_NEXT_SHARED
from mtpx.train import checkpoint as ckpt
from mtpx.train import distributed
from mtpx.train.data import (
    BatchSampler,
    PackedCorpus,
    load_documents,
    pack_corpus,
    parse_data_sources,
    split_documents,
    val_batches,
)
from mtpx.train.losses import Objective
from mtpx.train.recipes import freeze_modules, loss_options
from mtpx.train.shard_training import ShardObjective, merged_state, open_shards, shard_corpora
from mtpx.train.records import (depth_names, format_losses, format_losses_compact, loss_curve_identity,
                                plot_loss_curve, write_losses_csv)
from mtpx.train.setup import check_cfg, check_device, choose_train_threads, resume_decision, start_state
from mtpx.train.tokenizer import tokenizer_sha256

LogFn = Callable[[dict[str, float], int], None]

ADAM_BETAS = (0.9, 0.95)  # nanoGPT / GPT-3: a shorter second-moment memory is more stable at small batch
ADAM_EPS = 1e-8
SPLIT_SEED = 0  # seed of the document-level train/val split

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# train.autocast: float16 would need a gradient scaler, so bfloat16 is the one mixed precision
_AUTOCAST = {None: None, "bfloat16": torch.bfloat16}


# --------------------------------------------------------------------------------------------------
# pieces


def lr_at(step: int, *, lr: float, min_lr: float, warmup_steps: int, steps: int) -> float:
    """Learning rate of optimizer step `step` (0-based): linear warmup from lr/warmup_steps to lr over
    `warmup_steps` steps, then cosine decay to `min_lr` at step `steps`; `min_lr` after that."""
    if step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    if step >= steps:
        return min_lr
    ratio = (step - warmup_steps) / max(1, steps - warmup_steps)  # 0 -> 1
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (lr - min_lr)


def build_optimizer(model: MTPForCausalLM, *, lr: float, weight_decay: float,
                    freeze_base: bool) -> torch.optim.AdamW:
    """AdamW over the trainable parameters, in model.named_parameters() order (stable across runs,
    which optimizer.safetensors relies on). Matrices (dim >= 2: linears, embeddings) get weight
    decay; norms and biases do not (nanoGPT). With freeze_base only the MTP parameters are given to
    the optimizer and every target parameter gets requires_grad=False (`freeze_target`)."""
    if freeze_base:
        target_ids = freeze_target(model)
        mtp_ids = {id(p) for p in model.mtp_parameters()} - target_ids
    params = [p for _, p in model.named_parameters()
              if p.requires_grad and (not freeze_base or id(p) in mtp_ids)]
    if not params:
        raise ValueError("no trainable parameters: with train.freeze_base=true the model needs "
                         "num_nextn_predict_layers >= 1")
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=lr, betas=ADAM_BETAS, eps=ADAM_EPS)


def freeze_target(model: MTPForCausalLM) -> set[int]:
    """requires_grad=False on every target parameter (embedding, decoder layers, final norm,
    lm_head), including one a draft module shares (a "deepseek_v3" head tied to lm_head stays the
    target's: training it would change the target). Returns their ids."""
    ids = set()
    for p in [*model.model.parameters(), *model.lm_head.parameters()]:
        p.requires_grad_(False)
        ids.add(id(p))
    return ids


def share_mtp_inputs(model: MTPForCausalLM) -> None:
    """train.mtp_share_fc: draft modules 1..N-1 use module 0's fc, pre_fc_norm_embedding,
    pre_fc_norm_hidden and norm (the same Parameters), as Qwen3-Next stores one of each for all
    modules (vLLM's qwen3_next_mtp.py), so that `tools/export_checkpoint.py --layout qwen3_next`
    can write the trained modules. Modules k >= 1 take module 0's values.

    Raises:
        ValueError: the model's mtp_style is not "qwen3_next".
    """
    if model.cfg.mtp_style != "qwen3_next":
        raise ValueError(f"train.mtp_share_fc=true shares the Qwen3-Next layout's fc and norms, but the "
                         f"model's mtp_style is {model.cfg.mtp_style}: set model.mtp_style=qwen3_next (a "
                         "fresh model) or drop train.mtp_share_fc")
    for m in model.mtp[1:]:
        for part in QWEN3_NEXT_SHARED:
            setattr(m, part, model.mtp[0].get_submodule(part))


def train_step(
    model: MTPForCausalLM,
    optimizer: torch.optim.Optimizer,
    batch: torch.Tensor,
    *,
    lr: float,
    grad_clip: float,
    mtp_loss_weight: float,
    train_base: bool = True,
    objective: torch.nn.Module | None = None,
    autocast: torch.dtype | None = None,
) -> dict[str, float]:
    """One optimizer step on `batch` (LongTensor [B, T]).

    objective: called as objective(batch, train_base) -> (loss, parts) (an Objective, possibly
    wrapped by DDP or sharded by FSDP2: mtpx/train/distributed.py); None = model.training_losses
    with mtp_loss_weight. autocast: run the forward and loss in torch.autocast of this dtype on
    the batch's device (mixed precision: weights, gradients and optimizer state stay as they are);
    None = no autocast.

    Returns {"loss": weighted total, "grad_norm": pre-clip L2 norm, "main": CE, "mtp1".."mtpN": CE}
    (cross-entropies in nats per token; this rank's rows). grad_clip <= 0 disables clipping (the
    norm is still reported).
    """
    for g in optimizer.param_groups:
        g["lr"] = lr
    with torch.autocast(batch.device.type, dtype=autocast, enabled=autocast is not None):
        if objective is None:
            loss, parts = model.training_losses(batch, mtp_loss_weight=mtp_loss_weight, train_base=train_base)
        else:
            loss, parts = objective(batch, train_base)
    loss.backward()
    params = [p for g in optimizer.param_groups for p in g["params"]]
    max_norm = grad_clip if grad_clip > 0 else float("inf")
    grad_norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
    if hasattr(grad_norm, "full_tensor"):  # a DTensor (FSDP2 shards): the norm over all of them
        grad_norm = grad_norm.full_tensor()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return {"loss": loss.item(), "grad_norm": float(grad_norm), **parts}


@torch.no_grad()
def evaluate(model: MTPForCausalLM, batches: list[torch.Tensor], mtp_loss_weight: float,
             objective: torch.nn.Module | None = None,
             autocast: torch.dtype | None = None) -> dict[str, float]:
    """Mean validation losses over `batches` (each LongTensor [B, T]): {"loss", "main", "mtp1".."mtpN"}
    in nats per token. objective, autocast: as in train_step (None = model.training_losses). The
    model is put in eval mode and restored to its previous mode."""
    was_training = model.training
    model.eval()
    sums: dict[str, float] = {}
    for b in batches:
        with torch.autocast(b.device.type, dtype=autocast, enabled=autocast is not None):
            if objective is None:
                loss, parts = model.training_losses(b, mtp_loss_weight=mtp_loss_weight, train_base=True)
            else:
                loss, parts = objective(b, True)
        for k, v in {"loss": loss.item(), **parts}.items():
            sums[k] = sums.get(k, 0.0) + v
    model.train(was_training)
    return {k: v / len(batches) for k, v in sums.items()}


# --------------------------------------------------------------------------------------------------
# the loop


def train(cfg: DictConfig | dict, log_fn: LogFn | None = None, extra_state: dict[str, Any] | None = None,
          on_config: Callable[[dict[str, Any]], None] | None = None) -> Path:
    """Train (or resume, or extend) a model with the joint next-token + MTP loss; see module doc.

    Args:
        cfg: run config with `model` and `train` sections (DictConfig or dict).
        log_fn: called as log_fn(metrics, step) every log_every steps with {"train/loss",
            "train/main", "train/mtp1", ..., "train/lr", "train/grad_norm", "train/tokens_per_s"}
            and at each evaluation with {"val/loss", "val/main", "val/mtp1", ...} (losses averaged
            over ranks; called on rank 0 only).
        extra_state: JSON values kept in every saved trainer_state.json (the W&B run id, so a
            resumed run logs to the same W&B run).
        on_config: called once the model is built (rank 0) with what the run config cannot say
            beforehand: {"model": the architecture trained (a checkpoint's, with model.path),
            "threads": the torch thread count, "threads_reason"} (the W&B run config's).

    Returns:
        Path of the final checkpoint folder (train.out_dir), holding the model, tokenizer,
        trainer_state.json, optimizer.safetensors, losses.csv and loss_curve.png (written by rank
        0; every rank returns after it is complete).

    Raises:
        ValueError: missing/invalid config fields (named), bad data_sources, corpora too small for
            seq_len; FileNotFoundError / CheckpointError from reading model.path or out_dir. Under
            torchrun, whatever one rank raises ends that rank (its process group destroyed) and
            the others fail at their next collective, within train.dist_timeout_s.
    """
    cfg = cfg if isinstance(cfg, DictConfig) else OmegaConf.create(cfg)
    t = check_cfg(cfg)
    check_device(str(t.get("device", "cpu")))
    info = distributed.resolve(str(t.get("parallel", "auto")), bool(t.freeze_base), int(t.batch_size))
    info, device = distributed.init(info, str(t.get("device", "cpu")), float(t.get("dist_timeout_s", 120)))
    try:
        return _train(cfg, t, info, device, log_fn if info.is_main else None, extra_state,
                      on_config if info.is_main else None)
    finally:
        distributed.shutdown(info)


def _train(cfg: DictConfig, t: DictConfig, info: distributed.DistInfo, device: torch.device,
           log_fn: LogFn | None, extra_state: dict[str, Any] | None,
           on_config: Callable[[dict[str, Any]], None] | None = None) -> Path:
    """train() once the process group is up: start-up (folder, data, model, corpora, optimizer),
    the step-0 evaluation of a fresh run, then the steps (see train for the arguments)."""
    console = Console(stderr=True, quiet=not info.is_main)
    if t.get("threads") is not None:
        torch.set_num_threads(int(t.threads))   # before the data and tokenizer are prepared
    out_dir, resume = resume_decision(t, info, console)
    specs, docs, split = _load_data(t) if not t.get("hidden_states_path") else ([], {}, {})
    model, tok, start, history = start_state(cfg, t, info, out_dir, resume, split, console)
    shards = open_shards(t, cfg.model.get("path"), tok)      # train.hidden_states_path, else None
    threads, objective = _prepare_model(cfg, t, info, device, model, out_dir, resume, console, on_config,
                                        shards)
    data = (_corpora(t, info, device, specs, docs, split, tok, model, console) if shards is None
            else shard_corpora(t, info, device, shards, console))

    # ---- parallel wrapper, then the optimizer (restored on resume) ----
    freeze = bool(t.freeze_base)
    if freeze:
        freeze_target(model)  # before wrapping: DDP and FSDP2 read requires_grad when they wrap
    freeze_modules(model, int(t.get("mtp_freeze_modules") or 0))
    wrapped = distributed.wrap(objective, info, device)
    opt = build_optimizer(model, lr=float(t.lr), weight_decay=float(t.weight_decay), freeze_base=freeze)
    if resume and info.mode == "fsdp":
        distributed.load_optimizer_full(objective, opt, ckpt.read_optimizer_state(out_dir, opt))
    elif resume:
        ckpt.load_optimizer_state(out_dir, opt)

    # what training reads (the eval, bench, engine and logger groups do not shape it)
    run_config = {k: OmegaConf.to_container(cfg[k], resolve=True) if isinstance(cfg[k], DictConfig)
                  else cfg[k]
                  for k in ("mode", "seed", "model", "train") if k in cfg}
    # record the architecture actually trained (a resume or model.path keeps the checkpoint's)
    run_config["model"] = {**model.cfg.to_dict(), "path": cfg.model.get("path")}
    run = _Trainer(t, info, device, out_dir, console, model, tok, objective, wrapped, opt, data, history,
                   threads, run_config, log_fn, extra_state, freeze, objective.num_depths,
                   _DTYPES[t.get("save_dtype", "float32")], _AUTOCAST[t.get("autocast")])

    steps = int(t.steps)
    if start >= steps:
        console.print(f"{out_dir} is already at step {start} >= train.steps={steps}: nothing to do")
        return out_dir
    if start == 0:
        v = run.validate(0)
        console.print(f"step 0 val: {format_losses(v, run.names)}")
    _train_steps(run, start)
    distributed.barrier(info)  # the final checkpoint is complete when any rank returns
    return out_dir


def _load_data(t: DictConfig) -> tuple[list, dict, dict]:
    """(data source specs, documents by source, (train, val) documents by source): the
    train/val split is per source, by document."""
    specs = parse_data_sources(list(t.data_sources))
    docs = load_documents(specs, gsm8k_path=t.get("gsm8k_path"), stdlib_max_bytes=t.get("stdlib_max_bytes"),
                          distill_path=t.get("distill_path"))
    val_fraction = float(t.get("val_fraction", 0.05))
    # fixed split seed: the val set does not move with train.seed, so runs of any seed compare
    split = {name: split_documents(d, val_fraction, SPLIT_SEED) for name, d in docs.items()}
    return specs, docs, split


def _prepare_model(cfg: DictConfig, t: DictConfig, info: distributed.DistInfo, device: torch.device,
                   model: MTPForCausalLM, out_dir: Path, resume: bool, console: Console,
                   on_config: Callable[[dict[str, Any]], None] | None,
                   shards=None) -> tuple[ThreadChoice, Objective]:
    """Share the MTP inputs (train.mtp_share_fc), move the model to `device`, choose the threads
    (printed; reported to on_config with the architecture) and build the objective. Raises
    ValueError naming the key for mtp_unroll with several modules, or seq_len past the model's
    max_position_embeddings."""
    if t.get("mtp_share_fc"):
        share_mtp_inputs(model)
    unroll = int(t.get("mtp_unroll") or 0)
    if unroll and model.cfg.num_nextn_predict_layers != 1:
        raise ValueError(f"train.mtp_unroll={unroll} trains module 0 applied {unroll} times (single-module "
                         f"MTP), but the model has {model.cfg.num_nextn_predict_layers} MTP modules: set "
                         "model.num_nextn_predict_layers=1, or train.mtp_unroll=0")
    model.to(device)
    threads = choose_train_threads(t, model, info,
                                   ckpt.load_trainer_state(out_dir).get("threads") if resume else None)
    console.print(threads.describe())
    if on_config is not None:
        on_config({"model": {**model.cfg.to_dict(), "path": cfg.model.get("path")},
                   "threads": threads.threads, "threads_reason": threads.reason})
    if int(t.seq_len) > model.cfg.max_position_embeddings:
        raise ValueError(f"train.seq_len={t.seq_len} is longer than the model's max_position_embeddings="
                         f"{model.cfg.max_position_embeddings}: lower train.seq_len")
    kw = dict(mtp_loss_weight=float(t.mtp_loss_weight), mtp_loss_decay=float(t.get("mtp_loss_decay") or 1.0),
              mtp_unroll=unroll, options=loss_options(t, model))
    objective = (Objective(model, **kw) if shards is None
                 else ShardObjective(model, shards, str(cfg.model.path), **kw))
    return threads, objective


@dataclass
class _Corpora:
    """The packed token streams of a run: the train corpus and its batch sampler, the val corpus
    and this rank's rows of every validation batch (on the device)."""

    train: PackedCorpus
    val: PackedCorpus
    sampler: BatchSampler
    val_batches: list[torch.Tensor]


def _corpora(t: DictConfig, info: distributed.DistInfo, device: torch.device, specs: list, docs: dict,
             split: dict, tok: Tokenizer, model: MTPForCausalLM, console: Console) -> _Corpora:
    """Pack the split documents with the model's tokenizer (source weights from the specs) and
    print their sizes (a warning first when the distilled data has another tokenizer)."""
    distilled = [d for name, ds in docs.items() if name.startswith("distill") for d in ds]
    if any(d.tokenizer_sha256 != tokenizer_sha256(tok) for d in distilled):
        console.print("[yellow]train.distill_path was generated with another tokenizer than the model's: "
                      "its text is re-encoded, so the token sequences are not exactly the ones the target "
                      "generated")
    weights = {s.name: s.weight for s in specs}
    train_corpus: PackedCorpus = pack_corpus({n: tr for n, (tr, _) in split.items()}, weights, tok,
                                             int(t.seq_len))
    val_corpus = pack_corpus({n: va for n, (_, va) in split.items()}, weights, tok, int(t.seq_len))
    sampler = BatchSampler(train_corpus, int(t.batch_size), int(t.seed))
    # this rank's rows of every validation batch (all of them without torchrun)
    val = [distributed.rank_rows(b, info).to(device)
           for b in val_batches(val_corpus, int(t.batch_size), int(t.eval_batches))]
    console.print(f"data: train {train_corpus.num_tokens()} tokens, val {val_corpus.num_tokens()} tokens; "
                  f"vocab {tok.get_vocab_size()}; {sum(p.numel() for p in model.parameters()):,} parameters")
    if info.active:
        console.print(f"{info.mode} over {info.world_size} ranks: {int(t.batch_size) // info.world_size} "
                      f"rows per rank of the global batch {t.batch_size}")
    return _Corpora(train_corpus, val_corpus, sampler, val)


@dataclass
class _Trainer:
    """A run after start-up: what the steps, the evaluations and the checkpoints share."""

    t: DictConfig
    info: distributed.DistInfo
    device: torch.device
    out_dir: Path
    console: Console
    model: MTPForCausalLM
    tok: Tokenizer
    objective: Objective
    wrapped: torch.nn.Module            # the objective as DDP or FSDP2 wrapped it (itself without torchrun)
    opt: torch.optim.Optimizer
    data: _Corpora
    history: list[dict[str, Any]]       # train and val records, saved in trainer_state.json
    threads: ThreadChoice
    run_config: dict[str, Any]
    log_fn: LogFn | None
    extra_state: dict[str, Any] | None
    freeze: bool
    num_mtp: int                        # loss depths: the modules, or the unrolled steps of module 0
    save_dtype: torch.dtype
    amp: torch.dtype | None

    def save(self, step: int) -> None:
        """Checkpoint out_dir at `step` (with losses.csv and loss_curve.png). fsdp: every rank takes
        part in gathering the shards onto rank 0; rank 0 alone writes."""
        model_state, opt_state = distributed.full_state(self.wrapped, self.objective, self.opt, self.info)
        if isinstance(self.objective, ShardObjective) and self.info.is_main:   # target layers from model.path
            model_state = merged_state(self.model, self.objective.model_path)
        if not self.info.is_main:
            return
        history, num_mtp, out_dir = self.history, self.num_mtp, self.out_dir
        state = {**(self.extra_state or {}), "step": step, "loss_history": history, "config": self.run_config,
                 "threads": self.threads.threads,
                 "data": {"train_tokens": self.data.train.num_tokens(),
                          "val_tokens": self.data.val.num_tokens()}}

        def extras(folder: Path) -> None:
            write_losses_csv(history, folder / "losses.csv", num_mtp)
            plot_loss_curve(history, folder / "loss_curve.png", num_mtp,
                            loss_curve_identity(out_dir, self.model.cfg, self.t, step))

        ckpt.save_checkpoint(out_dir, self.model, self.tok, optimizer=self.opt, trainer_state=state,
                             dtype=self.save_dtype, extra_files=extras, model_state=model_state,
                             optimizer_state=opt_state)

    @property
    def names(self) -> list[str]:
        """The loss names of the depths: "main", "mtp1", ... (depth_names)."""
        return depth_names(self.num_mtp)

    def validate(self, step: int) -> dict[str, float]:
        """The validation losses at `step`, averaged over ranks, added to the history and logged."""
        v = distributed.mean_over_ranks(evaluate(self.model, self.data.val_batches,
                                                 float(self.t.mtp_loss_weight), objective=self.wrapped,
                                                 autocast=self.amp), self.info, self.device)
        self.history.append({"step": step, "split": "val", **v})
        if self.log_fn is not None:
            self.log_fn({f"val/{k}": x for k, x in v.items()}, step)
        return v


def _train_steps(run: _Trainer, start: int) -> None:
    """Steps start .. train.steps - 1 with the progress bar (rank 0) or lines, logging every
    log_every steps, evaluating every eval_every and saving every save_every (and at the last
    step). Ctrl-C or SIGTERM on any rank: every rank stops after the same step, saves, and
    Interrupted is raised."""
    t, info, device, names = run.t, run.info, run.device, run.names
    seed, steps, eval_every, save_every = int(t.seed), int(t.steps), int(t.eval_every), int(t.save_every)
    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TimeElapsedColumn(), TimeRemainingColumn(), console=run.console,
                        disable=not info.is_main)
    tokens_per_step = int(t.batch_size) * int(t.seq_len)  # the global batch: the job's throughput
    with progress, GracefulInterrupt() as interrupt:
        task = progress.add_task("training", total=steps, completed=start)
        t0, n_timed = time.perf_counter(), 0
        lines = ProgressLines("train", steps, "steps", start=start, every=None if info.is_main else 0)
        for step, batch in run.data.sampler.iterate(start):
            if step >= steps:
                break
            # per-step seed: the model has no dropout today, but any stochastic op stays resumable
            torch.manual_seed((seed << 32) + step)
            lr = lr_at(step, lr=float(t.lr), min_lr=float(t.min_lr), warmup_steps=int(t.warmup_steps),
                       steps=steps)
            m = train_step(run.model, run.opt, distributed.rank_rows(batch, info).to(device), lr=lr,
                           grad_clip=float(t.grad_clip), mtp_loss_weight=float(t.mtp_loss_weight),
                           train_base=not run.freeze, objective=run.wrapped, autocast=run.amp)
            m = distributed.mean_over_ranks(m, info, device)
            done = step + 1  # optimizer steps completed
            run.history.append({"step": done, "split": "train", "lr": lr, **m})
            n_timed += 1
            progress.update(task, advance=1)
            lines.update(
                done,
                f"{(done - start) * tokens_per_step / max(time.perf_counter() - lines.t0, 1e-9):.0f} tok/s",
                f"lr {lr:.1e}", f"loss {format_losses_compact(m, names)}")
            if done % int(t.log_every) == 0 or done == steps:
                tok_s = n_timed * tokens_per_step / max(time.perf_counter() - t0, 1e-9)
                t0, n_timed = time.perf_counter(), 0
                progress.update(task,
                                description=f"step {done} lr {lr:.1e} {format_losses_compact(m, names)}")
                if run.log_fn is not None:
                    run.log_fn({**{f"train/{k}": v for k, v in m.items()}, "train/lr": lr,
                                "train/tokens_per_s": tok_s}, done)
            if (eval_every > 0 and done % eval_every == 0) or done == steps:
                v = run.validate(done)
                progress.console.print(f"step {done} val: {format_losses(v, names)}")
            # every rank stops at the same step
            stop = distributed.any_rank(interrupt.requested, info, device)
            if (save_every > 0 and done % save_every == 0) or done == steps:
                run.save(done)
            elif stop:
                run.save(done)
            if stop and done < steps:
                raise Interrupted(f"training stopped after step {done} of {steps}; checkpoint saved to "
                                  f"{run.out_dir} (run the same command to resume)")
