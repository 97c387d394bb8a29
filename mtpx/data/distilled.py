"""Self-distilled data on disk: the folder `mode=distill` writes and `train.data_sources=[distill]` reads.

A folder holds `manifest.json` and the shards `shard-00000-of-00012.jsonl`, ... Shard i holds the
prompts with index i * shard_size .. (i + 1) * shard_size - 1 of the prompt set, one JSON object
per line, in index order:

    {"index": int, "prompt": str, "prompt_token_ids": [int], "completion": str,
     "completion_token_ids": [int], "finish_reason": "stop" | "length" | ..., "error": null | str}

`completion_token_ids` are the tokens the target generated, the eos that ended it included (as
vLLM's `CompletionOutput.token_ids`); a prompt the engine refused (too long for the model) is
kept with its `error` and no completion, so that the shard is complete. A shard is written atomically once all
of its prompts have finished; until then its finished records are appended to `shard-....jsonl.part`, which a
resumed run reads back, so Ctrl-C loses no finished request.

The manifest records what makes the data what it is (checked on resume, `RESUME_KEYS`): the
target's weights hash and dtype, the tokenizer's hash, the prompt set and its hash, the sampling
settings and the shard size; and, for the record only, the speculator that sped the generation up
(greedy and rejection-sampled speculation leave the output distribution unchanged).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mtpx.data.jsonl import check_fields, read_jsonl

__all__ = ["MANIFEST_FILE", "FORMAT", "RESUME_KEYS", "DistilledRecord", "shard_name", "part_name",
           "read_manifest", "read_shard", "missing_shards", "read_distilled"]

MANIFEST_FILE = "manifest.json"
FORMAT = "mtpx.distill/1"
# manifest keys whose values must match for a run to resume (or extend) a folder
RESUME_KEYS = ("format", "model", "tokenizer_sha256", "data", "prompts_sha256", "num_prompts", "sampling",
               "shard_size")
_RECORD = ("an object with 'index' (int), 'prompt' (str), 'prompt_token_ids' (list), 'completion' (str), "
           "'completion_token_ids' (list)")
_FIELDS = {"index": int, "prompt": str, "prompt_token_ids": list, "completion": str,
           "completion_token_ids": list}


@dataclass(frozen=True)
class DistilledRecord:
    """One prompt and the target's completion of it (token ids in the manifest's tokenizer)."""

    index: int
    prompt: str
    prompt_token_ids: list[int]
    completion: str
    completion_token_ids: list[int]
    finish_reason: str | None
    error: str | None = None


def shard_name(i: int, num_shards: int) -> str:
    """`shard-00003-of-00012.jsonl` (0-based i)."""
    return f"shard-{i:05d}-of-{num_shards:05d}.jsonl"


def part_name(i: int, num_shards: int) -> str:
    """The file shard i's finished records are appended to before the shard is complete."""
    return shard_name(i, num_shards) + ".part"


def read_manifest(folder: str | os.PathLike[str], option: str) -> dict[str, Any]:
    """The manifest of a distilled-data folder.

    Raises:
        FileNotFoundError: no folder, or no manifest.json in it (the message names `option`).
        ValueError: the manifest is not JSON or not of format FORMAT.
    """
    folder = Path(folder)
    file = folder / MANIFEST_FILE
    if not file.is_file():
        raise FileNotFoundError(f"{option}={folder}: no {MANIFEST_FILE} there; point it at a folder written "
                                f"by mode=distill (distill.out_dir)")
    try:
        manifest = json.loads(file.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{file}: not a JSON manifest ({e}); rerun mode=distill into a new "
                         "distill.out_dir") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        got = manifest.get("format") if isinstance(manifest, dict) else None
        raise ValueError(f"{file}: format {got!r}, expected {FORMAT!r}; "
                         "rerun mode=distill into a new distill.out_dir")
    return manifest


def _record(obj: dict, path: Path, lineno: int) -> DistilledRecord:
    check_fields(obj, _FIELDS, path, lineno, "distilled data", _RECORD)
    return DistilledRecord(obj["index"], obj["prompt"], [int(t) for t in obj["prompt_token_ids"]],
                           obj["completion"], [int(t) for t in obj["completion_token_ids"]],
                           obj.get("finish_reason"), obj.get("error"))


def read_shard(path: str | os.PathLike[str], option: str, *, partial: bool = False) -> list[DistilledRecord]:
    """The records of one shard file. partial=True reads a `.part` file: a last line cut by a
    crash mid-write is dropped, and an empty file is no error.

    Raises:
        FileNotFoundError, ValueError: as mtpx.data.jsonl.read_jsonl, or a record lacks a field.
    """
    path = Path(path)
    if partial:
        lines = path.read_text(encoding="utf-8", errors="replace").split("\n")
        records = []
        for lineno, line in enumerate(lines[:-1], start=1):   # lines[-1]: "" or a cut-off write
            if line.strip():
                records.append(_record(json.loads(line), path, lineno))
        return records
    return [_record(obj, path, lineno) for lineno, obj in
            read_jsonl(path, option, "distilled data", _RECORD, "written by mode=distill")]


def missing_shards(folder: str | os.PathLike[str], manifest: dict[str, Any]) -> list[int]:
    """Indices of the manifest's shards that are not written yet."""
    n = int(manifest["num_shards"])
    return [i for i in range(n) if not (Path(folder) / shard_name(i, n)).is_file()]


def read_distilled(folder: str | os.PathLike[str],
                   option: str = "train.distill_path") -> tuple[dict, list[DistilledRecord]]:
    """(manifest, every record in index order) of a complete distilled-data folder.

    Raises:
        FileNotFoundError: no manifest (see read_manifest).
        ValueError: shards missing (the generation has not finished: rerun the same mode=distill
            command, it resumes), or a bad shard.
    """
    manifest = read_manifest(folder, option)
    missing = missing_shards(folder, manifest)
    if missing:
        raise ValueError(f"{option}={folder}: {len(missing)} of {manifest['num_shards']} shards are not "
                         f"written yet (first missing: {shard_name(missing[0], manifest['num_shards'])}); "
                         "rerun the same mode=distill command to finish them (it resumes)")
    n = int(manifest["num_shards"])
    records = [r for i in range(n) for r in read_shard(Path(folder) / shard_name(i, n), option)]
    return manifest, records
