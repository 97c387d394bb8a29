"""The options of the data, model and logger config groups (prompt sets, a model loaded from a
folder, loggers): structured configs with a default and a docstring per field, as mtpx/schema/groups.py's
groups; their checks are the code that reads them (data loaders, the model loader, RunLogger)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional

from omegaconf import MISSING

__all__ = ["BuiltinData", "FileData", "GSM8KData", "ChatData", "RandomData", "DemoLoading", "HFModel",
           "NoLogger", "WandbLogger"]


@dataclass
class BuiltinData:
    """Built-in prompts: code cut from held-out files of the Python standard library."""
    name: str = "builtin"
    """The prompt set's name (fixed per option)."""
    prompt_tokens: int = 128
    """Approximate prompt length in tokens."""
    split: Literal["test", "train"] = "test"
    """test: the held-out stdlib modules (evaluation); train: the other stdlib files (e.g. code
    prompts for mode=distill that share no file with the evaluation's)."""


@dataclass
class FileData:
    """A prompt set read from one file (HumanEval)."""
    name: str = MISSING
    """The prompt set's name (fixed per option)."""
    path: str = MISSING
    """The file of the prompt set."""


@dataclass
class GSM8KData(FileData):
    """GSM8K's test set, scored against the #### answers."""
    num_fewshot: int = 0
    """Few-shot: prepend this many solved train examples (the same prefix for every question)."""
    fewshot_path: str = "${data_dir}/gsm8k/train.jsonl"
    """The solved examples' file."""


@dataclass
class ChatData(FileData):
    """MT-Bench and Spec-Bench: questions by category, through the chat template."""
    categories: Optional[list[str]] = None
    """Keep only these categories, e.g. [coding,math]; null = all."""
    chat_template: bool = True
    """Through the model's chat template when it has one (false = raw turn text)."""


@dataclass
class RandomData:
    """Random prompts (vLLM bench's random dataset)."""
    name: str = "random"
    """The prompt set's name (fixed per option)."""
    input_len: int = 256
    """Prompt tokens per request."""
    output_len: int = 128
    """Output tokens per request, exactly."""
    seed: int = 0
    """Seed of the prompts' token ids."""


@dataclass
class DemoLoading:
    """The loading keys of the demo model group (`model=demo`); its other keys are ModelConfig's
    fields (mtpx.schema.DemoModel)."""
    path: Optional[str] = None
    """A checkpoint folder to evaluate (null = the committed demo checkpoint, checkpoints/demo); in
    mode=train a path initialises from that checkpoint (required by train.freeze_base=true)."""
    dtype: Literal["float32", "bfloat16", "float16", "float64", "auto"] = "float32"
    """Weights and compute when decoding: float32 | bfloat16 | float16 | float64 | auto (checked by
    mtpx.engine.llm.LLM)."""
    allow_pickle: bool = False
    """true: read pytorch_model.bin with torch.load(weights_only=True) when no safetensors exist."""


@dataclass
class HFModel:
    """A Hugging Face-format checkpoint folder (`model=hf model.path=DIR`)."""
    path: str = MISSING
    """Required: the checkpoint folder."""
    dtype: Literal["float32", "bfloat16", "float16", "float64", "auto"] = "float32"
    """float32 | bfloat16 | float16 | float64 | auto (the checkpoint's own): weights are converted
    tensor by tensor (checked by mtpx.engine.llm.LLM)."""
    allow_pickle: bool = False
    """true: read pytorch_model.bin with torch.load(weights_only=True) when no safetensors exist."""


@dataclass
class NoLogger:
    """No logging besides the run folder's files."""
    name: str = "none"
    """The logger's name (fixed per option)."""


@dataclass
class WandbLogger:
    """Weights & Biases, offline by default (into the run folder)."""
    name: str = "wandb"
    """The logger's name (fixed per option)."""
    project: str = "mtpx"
    """The W&B project."""
    mode: Literal["offline", "online"] = "offline"
    """offline (files in the run folder; `wandb sync` later) | online (checked by
    mtpx.metrics.logging.RunLogger)."""
    dir: Optional[str] = None
    """null = the run directory."""
