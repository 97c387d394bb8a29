"""Where automatic k's step costs are kept between runs: the cache path under $MTPX_CACHE_DIR,
the metadata that says which engine a file was measured on, load and save (calibration.calibrate
loads a matching file, else measures and writes one for the next run). No torch: the engine
gives the device and library facts (`cost_meta`'s environment)."""
from __future__ import annotations

import hashlib
import json
import math
import os
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from mtpx.io import atomic_write_json

__all__ = ["COST_META_KEYS", "DRAFT_KEY", "PREFILL_KEY", "save_step_costs", "load_step_costs",
           "step_cost_cache_path",
           "check_step_cost_meta", "cost_meta", "fingerprint",
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
        raise ValueError(f"spec.cost_model_file={path}: calibrated for another engine: "
                         f"{', '.join(diff[:3])}; "
                         "delete the file to calibrate again, or give another path")


def cost_meta(config, max_k: int, model_path: Path | None, draft_path: Path | None, spec: str | None,
              environment: dict) -> dict:
    """What the step costs of an engine with EngineConfig `config` and automatic k over 0..max_k
    depend on (COST_META_KEYS), its max_num_seqs, and the model, mtpx and torch versions and code
    hash that name its cache file. model_path: the checkpoint folder (None: an in-memory model,
    not cached); draft_path: an attached draft file; environment: the engine's "dtype",
    "threads", "device", "device_name", "torch_version" and "compile_depths" (its depth buckets
    when compiled, else None)."""
    try:
        mtpx_version = version("mtpx")
    except PackageNotFoundError:
        mtpx_version = None
    cfg = config
    return {"model": str(model_path or "in-memory model"),
            "fingerprint": fingerprint(model_path, draft_path),
            "spec": spec, "max_k": max_k, "dtype": environment["dtype"],
            "threads": environment["threads"], "compile": cfg.compile,
            "compile_backend": cfg.compile_backend,
            # compiled, a k costs its depth bucket's step (calibration.calibrate_step_costs)
            "compile_depths": environment["compile_depths"],
            "attention_backend": cfg.attention_backend,
            "gdn_backend": cfg.gdn_backend, "block_size": cfg.block_size, "device": environment["device"],
            "tensor_parallel_size": cfg.tensor_parallel_size,
            "device_name": environment["device_name"], "max_num_seqs": cfg.max_num_seqs,
            "mtpx_version": mtpx_version, "torch_version": environment["torch_version"], "code": code_hash()}


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
    root = Path(__file__).resolve().parents[1]        # mtpx/
    h = hashlib.sha256()
    for package in ("engine", "models", "spec_decode", "cache", "attention", "kernels"):
        for f in sorted(f for ext in ("*.py", "*.c", "*.h") for f in (root / package).rglob(ext)):
            h.update(f.relative_to(root).as_posix().encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:20]
