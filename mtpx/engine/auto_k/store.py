"""Where automatic k's step costs are kept between runs: the cache path under $MTPX_CACHE_DIR,
the metadata that says which engine a file was measured on, load and save, and
`load_or_calibrate` (the start-up path LLM takes, `startup_step_costs`: a matching file, else a
calibration written for the next run)."""
from __future__ import annotations

import hashlib
import json
import math
import os
import platform
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import torch

from mtpx.engine.auto_k.costs import calibrate_prefill_cost, calibrate_step_costs
from mtpx.engine.decode_step import depth_buckets
from mtpx.io import atomic_write_json

__all__ = ["COST_META_KEYS", "DRAFT_KEY", "PREFILL_KEY", "save_step_costs", "load_step_costs", "step_cost_cache_path",
           "check_step_cost_meta", "cost_meta", "load_or_calibrate", "startup_step_costs", "fingerprint",
           "code_hash"]


# the file's ms per prompt token and module of a prefill's speculator part (calibrate_prefill_cost)
PREFILL_KEY = "prefill_module_ms_per_token"
DRAFT_KEY = "draft_costs"      # the calibrated steps' draft rounds: [{k, batch_size, draft_ms}]


def _rows(costs: dict, name: str) -> list[dict]:
    return [{"k": k, "batch_size": b, name: ms} for (k, b), ms in sorted(costs.items())]


def save_step_costs(path: str | Path, step_costs: dict, meta: dict) -> None:
    """Write {(k, B): ms} and `meta` (model, threads, compile, device; PREFILL_KEY, DRAFT_KEY) as
    JSON, atomically."""
    atomic_write_json(path, {**meta, "step_costs": _rows(step_costs, "step_ms")}, indent=1)


def load_step_costs(path: str | Path) -> tuple[dict, dict]:
    """-> ({(k, B): ms}, the file's other keys). Raises ValueError naming the file when it is not
    a step-cost file (FileNotFoundError when missing)."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
        costs = {(int(r["k"]), int(r["batch_size"])): float(r["step_ms"]) for r in data.pop("step_costs")}
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
        raise ValueError(f"spec.cost_model_file={path}: not a step-cost file ({e}); write one with "
                         "calibrate_step_costs (LLM does at start-up) or delete it") from None
    if not costs or any(not math.isfinite(v) or v <= 0 for v in costs.values()):
        raise ValueError(f"spec.cost_model_file={path}: step costs must be positive numbers")
    return costs, data


# What a calibration's costs depend on: a cost file whose value of one of these differs from the
# engine's measured another engine (step_cost_cache_path, check_step_cost_meta).
COST_META_KEYS = ("fingerprint", "spec", "max_k", "dtype", "threads", "compile", "compile_backend",
                  "compile_depths", "attention_backend", "gdn_backend", "block_size", "device", "device_name",
                  "tensor_parallel_size")


def step_cost_cache_path(meta: dict) -> Path:
    """Where the start-up calibration of an engine described by `meta` (COST_META_KEYS,
    max_num_seqs, the mtpx and torch versions, and `code`: a hash of the engine's source) is kept
    between runs: $MTPX_CACHE_DIR/step_costs/<hash of those>.json (MTPX_CACHE_DIR defaults to
    $XDG_CACHE_HOME/mtpx, else ~/.cache/mtpx), as vLLM keeps its compile cache under
    VLLM_CACHE_ROOT. Any change of what the costs depend on is another file."""
    root = os.environ.get("MTPX_CACHE_DIR") or Path(
        os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "mtpx"
    key = {k: meta.get(k) for k in (*COST_META_KEYS, "max_num_seqs", "mtpx_version", "torch_version", "code")}
    digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:20]
    return Path(root) / "step_costs" / f"{digest}.json"


def check_step_cost_meta(path: str | Path, file_meta: dict, meta: dict) -> None:
    """Raises ValueError naming spec.cost_model_file when the file was calibrated for another
    engine: a COST_META_KEYS value both give differs, or the file's max_num_seqs is below this
    engine's (a key the file lacks, as in a hand-written file, is not checked)."""
    diff = [f"{k}={file_meta[k]!r} (this run: {meta[k]!r})" for k in COST_META_KEYS
            if k in file_meta and k in meta and file_meta[k] != meta[k]]
    if file_meta.get("max_num_seqs", math.inf) < meta.get("max_num_seqs", 0):
        diff.append(f"max_num_seqs={file_meta['max_num_seqs']} (this run: {meta['max_num_seqs']})")
    if diff:
        raise ValueError(f"spec.cost_model_file={path}: calibrated for another engine: {', '.join(diff[:3])}; "
                         "delete the file to calibrate again, or give another path")


def cost_meta(engine, model_path: Path | None, draft_path: Path | None, spec: str | None, device) -> dict:
    """What `engine`'s step costs depend on (COST_META_KEYS), its max_num_seqs, and the model,
    mtpx and torch versions and code hash that name its cache file. model_path: the checkpoint
    folder (None: an in-memory model, not cached); draft_path: an attached draft file."""
    try:
        mtpx_version = version("mtpx")
    except PackageNotFoundError:
        mtpx_version = None
    cfg = engine.config
    if str(device).startswith("cuda"):
        device_name = torch.cuda.get_device_name()
    else:
        device_name = platform.processor() or platform.machine()
        try:
            with open("/proc/cpuinfo") as f:
                device_name = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
        except (OSError, StopIteration):
            pass
    return {"model": str(model_path or "in-memory model"),
            "fingerprint": fingerprint(model_path, draft_path),
            "spec": spec, "max_k": engine.draft_length.max_k,
            "dtype": str(next(engine.model.parameters()).dtype).removeprefix("torch."),
            "threads": torch.get_num_threads(), "compile": cfg.compile,
            "compile_backend": cfg.compile_backend,
            # compiled, a k costs its depth bucket's step (auto_k.costs.calibrate_step_costs)
            "compile_depths": depth_buckets(engine.draft_length.max_k, cfg.compile_depths) if cfg.compile else None,
            "attention_backend": cfg.attention_backend,
            "gdn_backend": cfg.gdn_backend, "block_size": cfg.block_size, "device": str(device),
            "tensor_parallel_size": cfg.tensor_parallel_size,
            "device_name": device_name, "max_num_seqs": cfg.max_num_seqs,
            "mtpx_version": mtpx_version, "torch_version": torch.__version__, "code": code_hash()}


def load_or_calibrate(engine, path: str | Path | None, meta: dict, cached: bool) -> dict:
    """Give engine.draft_length its step costs and prefill cost: from `path` when it exists
    (checked against `meta`: check_step_cost_meta; a file without the prefill cost has it
    measured now), else measured now (calibrate_step_costs, calibrate_prefill_cost) and written
    to `path` (None: not written). cached: `path` is the cache file (step_cost_cache_path), so a damaged or
    mismatched file is measured again instead of refused. Returns {"source", "seconds", and the
    file's or this engine's metadata}. Raises ValueError for a given file that is not a step-cost
    file or was measured on another engine."""
    policy = engine.draft_length
    if path is not None and Path(path).exists():
        try:
            costs, file_meta = load_step_costs(path)
            check_step_cost_meta(path, file_meta, meta)
        except ValueError:
            if not cached:
                raise
        else:                                  # a damaged cache file is measured again below
            policy.set_step_costs(costs)
            if file_meta.get(DRAFT_KEY):         # a file written without them: t(k) - t(0) (draft_cost)
                policy.set_draft_costs({(int(r["k"]), int(r["batch_size"])): float(r["draft_ms"])
                                        for r in file_meta[DRAFT_KEY]})
            t0 = time.perf_counter()
            prefill = file_meta.get(PREFILL_KEY)
            if prefill is None:                # a file written without it: measured now (a few prefills)
                prefill = file_meta[PREFILL_KEY] = calibrate_prefill_cost(engine)
            if prefill is not None:
                policy.set_prefill_cost(float(prefill))
            return {**file_meta, "source": f"loaded from {path}", "seconds": round(time.perf_counter() - t0, 2)}
    t0 = time.perf_counter()
    draft: dict = {}
    costs = calibrate_step_costs(engine, draft_costs=draft)
    policy.set_step_costs(costs)
    policy.set_draft_costs(draft)
    prefill = calibrate_prefill_cost(engine)
    if prefill is not None:
        policy.set_prefill_cost(prefill)
    meta = {**meta, PREFILL_KEY: prefill, DRAFT_KEY: _rows(draft, "draft_ms")}
    if path is not None:
        save_step_costs(path, costs, meta)
    return {"source": "calibrated" if path is None else f"calibrated, saved to {path}",
            "seconds": round(time.perf_counter() - t0, 2), **meta}


def startup_step_costs(engine, model_path: Path | None, draft_path: Path | None, spec: str | None, device,
                       cost_model_file: str | Path | None) -> dict:
    """LLM's start-up with num_speculative_tokens=auto: step costs from `cost_model_file`, else
    (a checkpoint folder) the step-cost cache (step_cost_cache_path), else calibrated now without
    saving (an in-memory model); load_or_calibrate does the loading and returns its dict."""
    meta = cost_meta(engine, model_path, draft_path, spec, device)
    cached = cost_model_file is None and model_path is not None
    path = step_cost_cache_path(meta) if cached else cost_model_file
    return load_or_calibrate(engine, path, meta, cached)

def fingerprint(model_path: Path | None, draft_path: Path | None) -> str | None:
    """Identifies a checkpoint's weights without reading them: the config's bytes and every file's
    name, size and modification time (a rewritten or copied file is another fingerprint)."""
    if model_path is None:
        return None
    h = hashlib.sha256()
    files = sorted(model_path.iterdir()) if model_path.is_dir() else [model_path]
    for f in files + ([draft_path] if draft_path is not None else []):
        if f.is_file() and (f.name == "config.json" or f.suffix in (".safetensors", ".bin", ".pt", ".pth")):
            st = f.stat()
            h.update(f"{f.name}:{st.st_size}:{st.st_mtime_ns};".encode())
            if f.name == "config.json":
                h.update(f.read_bytes())
    return h.hexdigest()[:20]


def code_hash() -> str:
    """A hash of the source of the packages a decode step runs, the C kernels' included (an edit
    there may change the step costs, so the step-cost cache measures again)."""
    root = Path(__file__).resolve().parents[2]        # mtpx/
    h = hashlib.sha256()
    for package in ("engine", "models", "spec_decode", "cache", "attention", "kernels"):
        for f in sorted(f for ext in ("*.py", "*.c", "*.h") for f in (root / package).rglob(ext)):
            h.update(f.relative_to(root).as_posix().encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:20]
