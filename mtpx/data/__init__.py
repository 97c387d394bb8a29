"""Prompt sets (built-in held-out code prompts, GSM8K) and GSM8K answer scoring."""

from mtpx.data.gsm8k import (
    extract_predicted_answer,
    extract_reference_answer,
    format_example,
    format_prompt,
    load_gsm8k,
    normalize_number,
    score,
)
from mtpx.data.prompts import STDLIB_HELDOUT_MODULES, Prompt, builtin_prompts, load_prompts

__all__ = [
    "Prompt",
    "STDLIB_HELDOUT_MODULES",
    "builtin_prompts",
    "load_prompts",
    "format_prompt",
    "format_example",
    "load_gsm8k",
    "extract_reference_answer",
    "extract_predicted_answer",
    "normalize_number",
    "score",
]
