"""The lossless reference of a lossy eval, stored once and reused (docs/acceptance_rules.md).

A sweep over a rule's settings decodes the same prompts with the same lossless rule in every job.
What the quality metrics read from that reference (its tokens, the target's log-likelihood of
them, their GSM8K correctness and, at temperature > 0, the two TV sample sets) depends on the
model, the source, the speculator, the engine, the prompts, the sampling and the client, not on
the lossy rule's settings. It is stored as one JSON file per key in eval.reference_cache (or, in
a Hydra multirun, the sweep folder's lossless_references/), keyed by a sha256 over all of those
(`reference_key`), and every job still runs its own timed lossless pass: a stored reference is
used only when its tokens equal that pass's (`load_reference`), so a key that missed something
cannot slip a stale reference in.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch

from mtpx.io import atomic_write_json

RULE_KEYS = ("acceptance", "posterior_threshold", "posterior_alpha", "relaxed_topk", "relaxed_delta",
             "lenient_lambda", "cascade_alpha", "synthetic_acceptance_rates")
"""The spec keys a lossy rule reads; the lossless reference does not depend on them."""

_SOURCE = Path(__file__).resolve().parents[1]       # the mtpx package


def _source_hash() -> str:
    """sha256 over every .py file of the mtpx package (path and bytes): the code that decoded."""
    h = hashlib.sha256()
    for f in sorted(_SOURCE.rglob("*.py")):
        h.update(str(f.relative_to(_SOURCE)).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


def _model_identity(path) -> list:
    """The checkpoint folder's files as (name, size, mtime in ns); the path itself when not a folder."""
    folder = Path(str(path))
    if not folder.is_dir():
        return [str(path)]
    return [str(folder.resolve())] + [(f.name, f.stat().st_size, f.stat().st_mtime_ns)
                                      for f in sorted(folder.iterdir()) if f.is_file()]


def reference_key(run) -> str:
    """sha256 (hex) of everything that determines the lossless reference of `run` (an evaluate
    _Run): model files, source, torch, dtype, threads, speculator and its lossless keys, engine,
    prompts (text or token ids, answers), per-request sampling, the client, the TV settings."""
    from mtpx.evaluate.args import model_path
    c = run.c
    material = {
        "model": _model_identity(model_path(run.cfg)), "source": _source_hash(), "torch": torch.__version__,
        "dtype": run.dtype, "threads": run.threads.threads, "method": run.method,
        "k": run.cfg.spec.num_speculative_tokens, "cost_model_file": run.cfg.spec.get("cost_model_file"),
        "spec": {k: v for k, v in sorted(run.spec_kw.items()) if k not in RULE_KEYS},
        "engine": dict(sorted(run.engine.items())),
        "prompts": [[p.engine_input, p.answer] for p in run.prompts],
        "params": [repr(p) for p in run.params], "client": run.client,
        "tv": [c.get("tv_num_prompts"), c.get("tv_num_samples"), c.get("tv_max_tokens")],
    }
    text = json.dumps(material, sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()


def cache_folder(c) -> Path | None:
    """eval.reference_cache, else the running Hydra multirun's sweep folder / lossless_references,
    else None (a single run computes its reference and keeps nothing)."""
    if c.get("reference_cache"):
        return Path(str(c.reference_cache))
    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode
        hc = HydraConfig.get()
    except (ImportError, ValueError):
        return None
    return Path(str(hc.sweep.dir)) / "lossless_references" if hc.mode == RunMode.MULTIRUN else None


def load_reference(folder: Path | None, key: str, tokens: list[list[int]]) -> dict | None:
    """The stored reference of `key` when its tokens equal `tokens` (this job's lossless pass), else
    None (nothing stored, unreadable, or stale: a line says which)."""
    if folder is None:
        return None
    file = folder / f"{key}.json"
    if not file.is_file():
        return None
    try:
        stored = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        print(f"lossless reference {file}: unreadable ({e}); computing it again")
        return None
    if stored.get("key") != key or stored.get("tokens") != tokens:
        print(f"lossless reference {file}: its tokens differ from this run's lossless pass; "
              "computing it again")
        return None
    print(f"lossless reference: reused {file} (its tokens equal this run's lossless pass)")
    return stored


def save_reference(folder: Path | None, key: str, record: dict) -> Path | None:
    """Store `record` (tokens, log_likelihoods, correct, tv) as folder/KEY.json; None without a folder."""
    if folder is None:
        return None
    folder.mkdir(parents=True, exist_ok=True)
    return atomic_write_json(folder / f"{key}.json", {"key": key, **record}, indent=None)
