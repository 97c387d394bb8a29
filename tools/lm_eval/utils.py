"""Helpers of the gsm8k_json_mtpx lm-eval task: GSM8K's test split from $MTPX_DATA_DIR (never
downloaded), the prompt, and the metrics (json_valid: the response parses as the schema's object;
exact_match: its answer equals GSM8K's)."""
import json
import os
from pathlib import Path

import datasets


def load_gsm8k(**kwargs) -> datasets.DatasetDict:
    path = Path(os.environ.get("MTPX_DATA_DIR", "data")) / "gsm8k" / "test.jsonl"
    return datasets.DatasetDict({"test": datasets.Dataset.from_json(str(path))})


def doc_to_text(doc: dict) -> str:
    return f"Question: {doc['question']}\nAnswer as JSON with reasoning and answer:\n"


def doc_to_target(doc: dict) -> str:
    return doc["answer"].split("####")[-1].strip().replace(",", "")


def process_results(doc: dict, results: list[str]) -> dict:
    try:
        out = json.loads(results[0])
        ok = (isinstance(out, dict) and set(out) == {"reasoning", "answer"}
              and isinstance(out["reasoning"], str) and isinstance(out["answer"], int))
    except ValueError:
        ok = False
    return {"json_valid": float(ok), "exact_match": float(ok and str(out["answer"]) == doc_to_target(doc))}
