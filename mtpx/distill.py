"""`mode=distill`: regenerate a prompt set's answers with the target, for self-distillation.

    python train_or_eval.py mode=distill data=gsm8k data.path=/path/to/gsm8k/train.jsonl \\
        distill.out_dir=distill/gsm8k_train +spec=mtp8
    python train_or_eval.py mode=train train.freeze_base=true model.path=checkpoints/demo \\
        'train.data_sources=[distill]' train.distill_path=distill/gsm8k_train ...

Heads trained on the target's own outputs accept more than heads trained on human-written
answers, since the target does not write like the data set (Medusa-2's self-distillation, arXiv
2401.10774 §3.3; EAGLE's and SpecForge's regenerated data; FastMTP, arXiv 2509.18362 §3.1).

The prompts come from the `data` group (any prompt set of mode=eval), the model from the
`model` group, the engine from `engine`, an optional speculator from `+spec=...` (it only makes
generation faster: greedy output is identical, rejection sampling keeps the distribution). The
`distill` group holds the sampling settings and stop strings (greedy by default; prompt i is sampled with seed
distill.seed + i, so a shard's contents do not depend on batching, resume or the number of
ranks), the shard size and the output folder; the format is in mtpx/data/distilled.py.

Resumable: a rerun of the same command skips written shards and re-reads the finished records
of the current ones (`.part` files); a rerun with other settings (another model, sampling, prompt
set or shard size) is refused with the key that differs. Under torchrun each rank generates the
shards i with i % WORLD_SIZE == RANK; no process group is needed. With
engine.tensor_parallel_size > 1 the torchrun processes, if any, are the ranks of one engine
instead: rank 0 writes every shard (docs/tensor_parallel.md), and the target hash is of the
whole model gathered from the ranks, equal to one process's.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from mtpx.data.distilled import (
    FORMAT,
    DistilledRecord,
    MANIFEST_FILE,
    RESUME_KEYS,
    missing_shards,
    part_name,
    read_manifest,
    read_shard,
    shard_name,
)
from mtpx.data.prompts import check_data_config, load_prompts
from mtpx.engine.config import resolve_compile
from mtpx.engine.llm import LLM
from mtpx.engine.tensor_parallel import full_state
from mtpx.engine.threads import choose_threads
from mtpx import schema
from mtpx.evaluate import _Stop, cap_max_tokens, engine_args, model_path, sampling_params, spec_args
from mtpx.io import (GracefulInterrupt, Interrupted, atomic_write_json, atomic_write_jsonl,
                     check_writable_dir, source_commit)
from mtpx.metrics.progress import ProgressLines
from mtpx.train.tokenizer import tokenizer_sha256


def target_sha256(model: torch.nn.Module) -> str:
    """SHA-256 of the target's weights as loaded (names, dtypes, shapes and bytes of every
    parameter and buffer outside the draft modules `mtp.*`, in name order): what decides the
    generated tokens, whatever file layout they came from. For rank 0's shard of a
    tensor-parallel LLM, of the whole model's tensors gathered from the ranks: the same hash
    as one process's, for any tensor_parallel_size."""
    h = hashlib.sha256()
    for name, t in full_state(model, exclude=("mtp.",)):
        t = t.detach().contiguous().cpu()
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)};".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def _prompts_sha256(prompts) -> str:
    h = hashlib.sha256()
    for p in prompts:
        h.update(json.dumps(p.engine_input).encode() + b"\n")
    return h.hexdigest()


def _tensor_parallel(cfg: DictConfig) -> bool:
    """engine.tensor_parallel_size > 1: the torchrun processes, if any, are the ranks of one
    tensor-parallel engine (rank 0 writes every shard; the others become its workers)."""
    tp = cfg.engine.get("tensor_parallel_size") if cfg.get("engine") is not None else None
    return isinstance(tp, int) and not isinstance(tp, bool) and tp > 1


def _rank(cfg: DictConfig) -> tuple[int, int]:
    """(RANK, WORLD_SIZE) of torchrun, (0, 1) without it or with tensor parallelism."""
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    if not 0 <= rank < world:
        raise ValueError(f"RANK={rank} is not in [0, WORLD_SIZE={world}): launch with torchrun")
    return (0, 1) if _tensor_parallel(cfg) else (rank, world)


def _stop_strings(value) -> list[str]:
    """distill.stop as a list of non-empty strings (null = none). Raises ValueError naming the key."""
    if value is None:
        return []
    items = ([value] if isinstance(value, str) else list(value)
             if OmegaConf.is_list(value) or isinstance(value, list) else None)
    if items is None or not all(isinstance(x, str) and x for x in items):
        raise ValueError(f"distill.stop={value!r}: must be a list of non-empty strings, e.g. "
                         "'distill.stop=[\"Question:\"]', or null")
    return items


def _check_resume(out_dir: Path, manifest: dict) -> None:
    """Refuse to add to a folder written with other settings (names the first differing key)."""
    saved = read_manifest(out_dir, "distill.out_dir")
    for key in RESUME_KEYS:
        if saved.get(key) != manifest.get(key):
            raise ValueError(f"distill.out_dir={out_dir} holds data generated with another {key} "
                             f"({saved.get(key)!r}, now {manifest.get(key)!r}): use a new distill.out_dir, "
                             "or rerun with the settings of the folder's manifest.json")


def run_distill(cfg: DictConfig) -> int:
    """mode=distill (see the module doc). Returns the exit code: 0 when this rank's shards are
    written. Raises ValueError naming the key for bad settings; Interrupted after Ctrl-C (the
    finished records are kept)."""
    c = cfg.get("distill")
    worker = _tensor_parallel(cfg) and int(os.environ.get("RANK", "0")) > 0
    settings = _check_settings(cfg, c, probe=not worker)
    if worker:      # a torchrun rank > 0: its LLM serves rank 0's engine, then exits the process
        _load_target(cfg, c)
        return 0
    out_dir, shard_size = settings.out_dir, settings.shard_size
    rank, world = _rank(cfg)
    target = _load_target(cfg, c)
    llm = target.llm
    prompts = load_prompts(cfg.data, settings.num_prompts, llm.tokenizer, llm.model.cfg.vocab_size,
                           num_prompts_key="distill.num_prompts")
    stop = _stop_strings(c.get("stop"))
    params = [dataclasses.replace(p, stop=stop) for p in
              sampling_params(c, len(prompts), "distill", [p.output_len for p in prompts])]
    params, _ = cap_max_tokens(prompts, params, llm.max_model_len, "distill.max_tokens")
    num_shards = -(-len(prompts) // shard_size)
    manifest = _manifest(cfg, c, target, prompts, params[0], stop, shard_size, num_shards)
    if (out_dir / MANIFEST_FILE).is_file():
        _check_resume(out_dir, manifest)
    else:   # every rank writes the same manifest (atomic; the last write wins with equal content)
        atomic_write_json(out_dir / MANIFEST_FILE, manifest)

    todo = [i for i in missing_shards(out_dir, manifest) if i % world == rank]
    print(f"distill: {len(prompts)} prompts in {num_shards} shards of {shard_size} into {out_dir}; "
          f"rank {rank} of {world}: {len(todo)} shards to write"
          + (f" (of {len(range(rank, num_shards, world))})" if world > 1 else ""))
    if todo:
        _generate_shards(llm, prompts, params, todo, num_shards, shard_size, out_dir, settings.concurrency)
    _print_finish_reasons(out_dir, manifest, rank, world, num_shards)
    return 0


@dataclasses.dataclass
class _Settings:
    """The distill section's values run_distill reads after checking them."""

    out_dir: Path
    shard_size: int
    num_prompts: int | None
    concurrency: int | None


def _check_settings(cfg: DictConfig, c: DictConfig | None, probe: bool = True) -> _Settings:
    """Check the distill section (c), the data set, model.path and the output folder before the
    model loads; probe: create the folder and check it is writable (not on a tensor-parallel
    worker, which writes nothing). Raises ValueError naming the key and the fix."""
    if c is None:
        raise ValueError("the config has no 'distill' section: "
                         "add '- distill: default' to the defaults list of conf/config.yaml")
    if not c.get("out_dir"):
        raise ValueError("distill.out_dir is required: the folder to write the shards to (e.g. "
                         "distill.out_dir=distill/gsm8k)")
    out_dir = Path(str(c.out_dir))
    schema.check("distill", c)                            # mtpx/schema/groups.py, before the model loads
    settings = _Settings(out_dir, c.shard_size, c.get("num_prompts"), c.get("concurrency"))
    _stop_strings(c.get("stop"))
    check_data_config(cfg.data, settings.num_prompts, num_prompts_key="distill.num_prompts")
    if OmegaConf.is_missing(cfg.model, "path"):
        raise ValueError("model.path is required with model=hf: "
                         "add model.path=DIR (a Hugging Face checkpoint folder)")
    if out_dir.exists() and not out_dir.is_dir():
        raise ValueError(f"distill.out_dir={out_dir} is a file: choose a folder")
    if out_dir.is_dir() and any(out_dir.iterdir()) and not (out_dir / MANIFEST_FILE).is_file():
        raise ValueError(f"distill.out_dir={out_dir} exists and was not written by mode=distill (no "
                         f"{MANIFEST_FILE}): choose a new folder")
    if probe:
        check_writable_dir(out_dir, "distill.out_dir")
    return settings


@dataclasses.dataclass
class _Target:
    """The loaded engine and what the manifest records of how it was loaded."""

    llm: LLM
    path: str | Path              # model.path as model_path resolved it
    dtype: str
    method: str | None            # the speculator (None: plain decoding)
    k: int | str | None           # spec.num_speculative_tokens as configured


def _load_target(cfg: DictConfig, c: DictConfig) -> _Target:
    """The LLM of the model, engine and spec groups (threads from distill.threads), with its
    thread choice printed. Raises ValueError when the model has no tokenizer."""
    spec = cfg.get("spec")
    k = spec.num_speculative_tokens if spec is not None else None
    method = None if spec is None or k == 0 else spec.method
    path = model_path(cfg)
    dtype = cfg.model.get("dtype") or "float32"
    engine = engine_args(cfg.engine)
    n, m = c.get("num_prompts"), c.get("max_tokens")
    engine["compile"] = resolve_compile(engine.get("compile"), "distill",
                                        n * m if isinstance(n, int) and isinstance(m, int) else None)
    if c.get("threads") is not None:
        choose_threads(None, c.threads, "distill.threads")
    llm = LLM(model=path, spec=method, num_speculative_tokens=k, dtype=dtype,
              draft_path=spec.get("draft_path") if spec is not None else None,
              cost_model_file=spec.get("cost_model_file") if spec is not None and k == "auto" else None,
              allow_pickle=bool(cfg.model.get("allow_pickle", False)), **engine, **spec_args(spec),
              threads=lambda model: choose_threads(model, c.get("threads"), "distill.threads"))
    print(llm.thread_choice.describe())
    if llm.tokenizer is None:
        raise ValueError(f"model.path={path} has no tokenizer: distilled data is text, "
                         "so the model needs one")
    return _Target(llm, path, dtype, method, k)


def _manifest(cfg: DictConfig, c: DictConfig, target: _Target, prompts, p0, stop: list[str], shard_size: int,
              num_shards: int) -> dict:
    """manifest.json of the output folder (format: mtpx/data/distilled.py); p0: the sampling
    parameters of prompt 0 (every prompt's but the seed)."""
    llm = target.llm
    return {
        "format": FORMAT,
        "model": {"path": str(target.path), "dtype": target.dtype, "target_sha256": target_sha256(llm.model)},
        "tokenizer_sha256": tokenizer_sha256(llm.tokenizer),
        "data": OmegaConf.to_container(cfg.data, resolve=True),
        "prompts_sha256": _prompts_sha256(prompts),
        "num_prompts": len(prompts),
        "sampling": {"max_tokens": c.max_tokens, "temperature": p0.temperature, "top_k": p0.top_k,
                     "top_p": p0.top_p, "min_p": p0.min_p, "stop": stop, "seed": int(c.seed),
                     "seeds": "distill.seed + prompt index"},
        "shard_size": shard_size,
        "num_shards": num_shards,
        "eos_token_ids": llm.eos_token_ids,
        "speculator": {"method": target.method, "num_speculative_tokens": target.k},
        "mtpx_commit": source_commit(),
    }


def _print_finish_reasons(out_dir: Path, manifest: dict, rank: int, world: int, num_shards: int) -> None:
    """One line: the finish reasons of this rank's written records, most frequent first, and the
    shards left to write."""
    reasons: dict = {}
    for i in range(rank, num_shards, world):
        for r in read_shard(out_dir / shard_name(i, num_shards), "distill.out_dir"):
            key = "error" if r.error is not None else r.finish_reason
            reasons[key] = reasons.get(key, 0) + 1
    print(f"distill: rank {rank}'s {sum(reasons.values())} records in {out_dir}: " +
          ", ".join(f"{n} {k}" for k, n in sorted(reasons.items(), key=lambda kv: -kv[1])) +
          " (finish reasons; 'length' = cut at distill.max_tokens); left to write: "
          f"{len(missing_shards(out_dir, manifest))} shards")


def _generate_shards(llm: LLM, prompts, params, todo: list[int], num_shards: int, shard_size: int,
                     out_dir: Path, concurrency: int | None) -> None:
    """Generate the prompts of shards `todo` in one continuous batch; write each shard as soon as
    all of its prompts have finished."""
    done: dict[int, dict[int, dict]] = {}                  # shard -> index -> record

    def shard_len(i: int) -> int:
        return min(shard_size, len(prompts) - i * shard_size)

    parts = {}                                             # shard -> its open .part file
    for i in todo:
        part = out_dir / part_name(i, num_shards)
        done[i] = ({r.index: dataclasses.asdict(r) for r in read_shard(part, "distill.out_dir", partial=True)}
                   if part.is_file() else {})
    queue = [j for i in todo for j in range(i * shard_size, i * shard_size + shard_len(i))
             if j not in done[i]]
    written = 0
    t0 = time.perf_counter()
    tokens = 0

    def finish_shard(i: int) -> None:
        nonlocal written
        rows = [done[i][j] for j in sorted(done[i])]
        atomic_write_jsonl(out_dir / shard_name(i, num_shards), rows)
        if i in parts:
            parts.pop(i).close()
        (out_dir / part_name(i, num_shards)).unlink(missing_ok=True)
        written += 1
        rate = tokens / max(time.perf_counter() - t0, 1e-9)
        print(f"wrote {shard_name(i, num_shards)} ({len(rows)} records; {written}/{len(todo)} shards, "
              f"{rate:.0f} tok/s)")

    for i in todo:                                         # a resumed shard may be complete already
        if len(done[i]) == shard_len(i):
            finish_shard(i)

    lines = ProgressLines("distill", len(queue), "prompts")
    finished = 0

    def on_finish(r) -> None:
        nonlocal tokens, finished
        o = llm.request_output(r)
        tokens += len(o.output_token_ids)
        finished += 1
        lines.update(finished, f"{tokens / max(time.perf_counter() - t0, 1e-9):.0f} tok/s",
                     f"{written}/{len(todo)} shards written")
        record(queue[r.index], o)

    def record(j: int, o) -> None:
        i = j // shard_size
        rec = dataclasses.asdict(DistilledRecord(j, prompts[j].text, list(o.prompt_token_ids), o.text,
                                                 list(o.output_token_ids), o.finish_reason, o.error))
        done[i][j] = rec
        if i not in parts:
            parts[i] = (out_dir / part_name(i, num_shards)).open("a", encoding="utf-8")
        parts[i].write(json.dumps(rec, ensure_ascii=False) + "\n")
        parts[i].flush()
        if len(done[i]) == shard_len(i):
            finish_shard(i)

    with GracefulInterrupt() as interrupt:
        def on_step(engine) -> None:
            lines.tick()
            if interrupt.requested:
                raise _Stop
        try:
            outs = llm.generate([prompts[j].engine_input for j in queue], [params[j] for j in queue],
                                on_finish=on_finish, on_step=on_step, max_concurrency=concurrency)
            failed = [(j, o) for j, o in zip(queue, outs) if o.error is not None]
            for j, o in failed:          # a prompt that cannot run is kept as a record with its error
                record(j, o)
            if failed:
                print(f"distill: {len(failed)} prompts could not be generated (first: prompt {failed[0][0]}: "
                      f"{failed[0][1].error}); their records carry the error and training skips them")
        except _Stop:
            raise Interrupted(f"{written} shards written; the finished records of the others are kept in "
                              "their .part files, and the same command resumes") from None
        finally:
            for f in parts.values():
                f.close()
