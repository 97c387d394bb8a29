"""Prompt sets (built-in held-out code prompts, GSM8K, Spec-Bench, MT-Bench, HumanEval, random
token ids) and GSM8K answer scoring."""

from mtpx.data.chat import (
    MT_BENCH_CATEGORIES,
    SPEC_BENCH_CATEGORIES,
    has_chat_template,
    load_questions,
    render_chat,
)
from mtpx.data.gsm8k import (
    extract_predicted_answer,
    extract_reference_answer,
    format_example,
    format_prompt,
    load_gsm8k,
    normalize_number,
    score,
)
from mtpx.data.humaneval import load_humaneval
from mtpx.data.prompts import (
    CHAT_SETS,
    DATA_SETS,
    STDLIB_HELDOUT_MODULES,
    Prompt,
    builtin_prompts,
    chat_template_applies,
    check_data_config,
    load_prompts,
)
from mtpx.data.random_prompts import random_token_ids, special_token_ids

__all__ = [
    "Prompt",
    "DATA_SETS",
    "CHAT_SETS",
    "STDLIB_HELDOUT_MODULES",
    "MT_BENCH_CATEGORIES",
    "SPEC_BENCH_CATEGORIES",
    "builtin_prompts",
    "load_prompts",
    "check_data_config",
    "chat_template_applies",
    "has_chat_template",
    "load_questions",
    "render_chat",
    "load_humaneval",
    "random_token_ids",
    "special_token_ids",
    "format_prompt",
    "format_example",
    "load_gsm8k",
    "extract_reference_answer",
    "extract_predicted_answer",
    "normalize_number",
    "score",
]
