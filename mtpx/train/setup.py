"""The checks and state a training run starts from: the config's train section (its own checks are
mtpx.schema's TrainConfig.check; here those across sections), the device, the thread count, the
output folder and whether the run resumes from it, the starting model (resumed, from model.path, or
fresh), and the fields a resumed run changed (mtpx.train.loop calls them)."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf
from rich.console import Console
from tokenizers import Tokenizer

from mtpx import schema
from mtpx.engine.threads import ThreadChoice, available_cpus, choose_threads
from mtpx.io import recover_folder
from mtpx.models.config import ModelConfig
from mtpx.models.model import MTPForCausalLM
from mtpx.train import checkpoint as ckpt
from mtpx.train import distributed
from mtpx.train.data import doc_text
from mtpx.train.tokenizer import train_tokenizer



def choose_train_threads(t: DictConfig, model: MTPForCausalLM, info: distributed.DistInfo,
                    resumed: int | None) -> ThreadChoice:
    """train.threads, chosen as eval's (mtpx.engine.threads.choose_threads): an explicit count,
    then OMP_NUM_THREADS, then the count a resumed run used (so the resume computes as the run
    did), then the fastest count measured on the model (on a GPU: every CPU, unmeasured); under
    torchrun with several ranks on a node, the node's CPUs shared between them instead of a
    measurement (the ranks run at once)."""
    requested = t.get("threads")
    env = os.environ.get("OMP_NUM_THREADS", "").strip()
    if requested is not None or (env.isdigit() and int(env) >= 1):
        return choose_threads(None, requested, "train.threads")     # set, nothing to measure
    if resumed is not None:
        torch.set_num_threads(int(resumed))
        return ThreadChoice(int(resumed), "the count the resumed run started with", available_cpus())
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
    if info.active and local > 1:
        n = max(1, available_cpus() // local)
        torch.set_num_threads(n)
        return ThreadChoice(n, f"the node's CPUs shared by its {local} ranks", available_cpus())
    # the CPU threads barely matter: no measurement
    on_gpu = next(model.parameters()).device.type != "cpu"
    return choose_threads(None if on_gpu else model, requested, "train.threads")


def check_cfg(cfg: DictConfig) -> DictConfig:
    """The run config's train section, checked: its own keys by mtpx.schema (TrainConfig.check),
    here those across sections (model.path, freeze_base, seq_len against the model)."""
    for section in ("model", "train"):
        if section not in cfg:
            raise ValueError(f"config has no '{section}' section: "
                             "pass the full run config (model, train, data)")
    schema.check("train", cfg.train)
    t = cfg.train
    if cfg.model.get("path") is not None and not str(cfg.model.get("path")).strip():
        raise ValueError("model.path is empty: give the checkpoint folder to start from (model.path=DIR), or "
                         "leave model.path out to train a fresh model")
    if (t.freeze_base and not cfg.model.get("path")
            and not (t.get("resume", True) and ckpt.has_trainer_state(t.out_dir))):
        raise ValueError("train.freeze_base=true needs model.path: "
                         "point it at the trained target's checkpoint folder")
    max_pos = cfg.model.get("max_position_embeddings")
    if not cfg.model.get("path") and isinstance(max_pos, int) and t.seq_len > max_pos:
        raise ValueError(f"train.seq_len={t.seq_len} is longer than the model's "
                         f"max_position_embeddings={max_pos}: lower train.seq_len or raise "
                         "model.max_position_embeddings")
    return t


def prepare_out_dir(out_dir: Path, resume: bool) -> list[str]:
    """Before any data is read: repair an interrupted save (mtpx.io.recover_folder), refuse a
    folder that is not a training run (it would be overwritten) and a place that cannot be written.
    Returns the lines to print."""
    notes = recover_folder(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise ValueError(f"train.out_dir={out_dir} is a file: choose a folder")
    if out_dir.is_dir() and any(out_dir.iterdir()) and not ckpt.has_trainer_state(out_dir):
        raise ValueError(f"train.out_dir={out_dir} exists and is not an mtpx training run (no "
                         f"{ckpt.TRAINER_STATE_FILE}); training would overwrite it: choose a new "
                         "train.out_dir (or remove the folder)")
    if out_dir.is_dir() and ckpt.has_trainer_state(out_dir) and not resume:
        notes.append(f"train.resume=false: the training run in {out_dir} is replaced at the first save")
    parent = out_dir.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
        probe = parent / f".{out_dir.name}.probe-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise ValueError(f"train.out_dir={out_dir}: cannot write to {parent} ({e.strerror}): choose a "
                         "writable folder") from None
    return notes


def model_fields(cfg: DictConfig) -> dict[str, Any]:
    """cfg.model as a ModelConfig dict: the fields it sets (null = ModelConfig's default,
    mtpx/schema/), without the loading keys `path`, `dtype`, `allow_pickle`."""
    d = OmegaConf.to_container(cfg.model, resolve=True)
    for key in ("path", "dtype", "allow_pickle"):
        d.pop(key, None)
    return {k: v for k, v in d.items() if v is not None}


def init_from(path: str, want: dict[str, Any], seed: int,
              console: Console) -> tuple[MTPForCausalLM, Tokenizer]:
    """Model and tokenizer from checkpoint `path`, with `num_nextn_predict_layers` taken from `want`
    when it differs (new draft modules are randomly initialised with `seed`, extra ones dropped).
    The other architecture keys of the model group are not used: the folder's config.json
    defines the model (docs/checkpoints.md)."""
    saved = ckpt.load_config(path)
    n_want = want.get("num_nextn_predict_layers", saved.num_nextn_predict_layers)
    if n_want == saved.num_nextn_predict_layers:
        model, tok = ckpt.load_model(path)
        return model.train(), tok
    # different number of draft modules: load the saved model, graft its weights into a new one
    src, tok = ckpt.load_model(path)
    new_cfg = ModelConfig.from_dict({**saved.to_dict(), "num_nextn_predict_layers": n_want})
    torch.manual_seed(seed)
    model = MTPForCausalLM(new_cfg)
    kept = {k: v for k, v in src.state_dict().items()
            if not k.startswith("mtp.") or int(k.split(".")[1]) < n_want}
    model.load_state_dict(kept, strict=False)
    console.print(f"model.path={path} has {saved.num_nextn_predict_layers} MTP modules; training {n_want} "
                  f"({max(0, n_want - saved.num_nextn_predict_layers)} freshly initialised)")
    return model.train(), tok


# fields a resumed run may change without altering what it trains on
_RESUME_FREE_KEYS = {"steps", "out_dir", "resume", "eval_every", "eval_batches", "save_every", "log_every",
                     "threads", "device", "save_dtype", "parallel", "dist_timeout_s"}


def warn_changed(section: str, saved: dict[str, Any], now: dict[str, Any], console: Console) -> None:
    """Print which fields of `section` differ from the run being resumed. Allowed (the checkpoint's
    model config wins; new train fields apply), but the run is then not an uninterrupted one."""
    # a key the run sets to null takes the saved value; a key the saved run lacks is newer than it
    changed = sorted(k for k in set(saved) & set(now)
                     if k not in _RESUME_FREE_KEYS and now[k] is not None and saved[k] != now[k])
    if changed:
        console.print(f"[yellow]resuming {section} with changed fields {changed}: the checkpoint's model "
                      "config is kept, new train fields apply; the run differs from an uninterrupted one")


def check_device(device: str) -> None:
    """Raises ValueError naming train.device when torch cannot place tensors there (an unknown
    name, CUDA on a build or machine without it)."""
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise ValueError(f"train.device={device!r} is not a device torch knows: use cpu or cuda") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        why = "this torch build has no CUDA" if torch.version.cuda is None else "no CUDA GPU is visible"
        raise ValueError(f"train.device={device}: {why} (torch {torch.__version__}): use train.device=cpu, "
                         "or run on a GPU machine with a CUDA build of torch")
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"train.device={device!r}: mtpx trains on cpu or cuda")


def resume_decision(t: DictConfig, info: distributed.DistInfo, console: Console) -> tuple[Path, bool]:
    """(train.out_dir, whether the run resumes from it): rank 0 repairs and checks the folder;
    every rank then follows rank 0's resume decision. Raises ValueError when this rank cannot
    read the folder rank 0 resumes."""
    out_dir = Path(t.out_dir)
    want_resume = bool(t.get("resume", True))
    for note in distributed.on_main(lambda: prepare_out_dir(out_dir, want_resume), info):
        console.print(note)
    resume = distributed.on_main(lambda: want_resume and ckpt.has_trainer_state(out_dir), info)
    if resume and not ckpt.has_trainer_state(out_dir):
        raise ValueError(f"rank {info.rank}: train.out_dir={out_dir} holds the run that rank 0 resumes, but "
                         "this process cannot read it: put train.out_dir on storage that every node reads")
    return out_dir, resume


def start_state(cfg: DictConfig, t: DictConfig, info: distributed.DistInfo, out_dir: Path, resume: bool,
                split: dict, console: Console) -> tuple[MTPForCausalLM, Tokenizer, int, list[dict[str, Any]]]:
    """(model, tokenizer, first step, loss history) of the run: resumed from out_dir, initialised
    from model.path, or fresh (a tokenizer trained on the training documents, a seeded init)."""
    seed = int(t.seed)
    history: list[dict[str, Any]] = []
    start = 0
    if resume:
        state = ckpt.load_trainer_state(out_dir)
        start, history = int(state["step"]), list(state.get("loss_history", []))
        model, tok = ckpt.load_model(out_dir)
        model.train()
        console.print(f"resuming {out_dir} at step {start}")
        saved_cfg = state.get("config", {})
        for section in ("model", "train"):
            warn_changed(section, saved_cfg.get(section, {}),
                         OmegaConf.to_container(cfg[section], resolve=True), console)
    elif cfg.model.get("path"):
        if t.get("hidden_states_path"):   # heads on hidden-state shards: no target decoder layers
            from mtpx.train.shard_training import light_model
            model, tok = light_model(str(cfg.model.path), model_fields(cfg), seed, console)
        else:
            model, tok = init_from(str(cfg.model.path), model_fields(cfg), seed, console)
    else:
        def fit_tokenizer() -> Tokenizer:
            return train_tokenizer((doc_text(d) for tr, _ in split.values() for d in tr),
                                   int(t.tokenizer_vocab_size))
        # under torchrun rank 0 trains it and every rank uses rank 0's (no reliance on the
        # trainer being deterministic across processes)
        tok = fit_tokenizer() if not info.active else Tokenizer.from_str(
            distributed.on_main(lambda: fit_tokenizer().to_str(), info))
        mcfg = ModelConfig.from_dict({**model_fields(cfg), "vocab_size": tok.get_vocab_size()})
        torch.manual_seed(seed)  # the init is part of the run's determinism
        model = MTPForCausalLM(mcfg)
    return model, tok, start, history
