"""Package layers: serving never imports the trainer, and the scheduler side imports no tensor,
metrics or config library (the import-linter contracts in pyproject.toml state the whole
layering; .ci/run checks them with lint-imports; these tests check what an import loads)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_serving_imports_nothing_from_training():
    code = ("import sys\n"
            "from mtpx import LLM, SamplingParams\n"
            "llm = LLM(spec='mtp8', num_speculative_tokens=2, max_num_seqs=1)\n"
            "out = llm.generate(['def f(x):'], SamplingParams(max_tokens=4, ignore_eos=True))\n"
            "assert len(out[0].output_token_ids) == 4\n"
            "print(sorted(m for m in sys.modules if m.startswith('mtpx.train')))\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"


HEAVY = ("torch", "numpy", "rich", "omegaconf", "matplotlib")


def _loaded_after(statement: str) -> dict:
    """The heavy packages (HEAVY) and mtpx modules in sys.modules of a fresh interpreter after
    `statement`."""
    code = (f"import sys, json\n{statement}\n"
            f"print(json.dumps({{'heavy': sorted(m for m in {HEAVY!r} if m in sys.modules), "
            "'mtpx': sorted(m for m in sys.modules if m.startswith('mtpx'))}))\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


def test_the_scheduler_side_imports_no_tensor_code_metrics_or_config_libraries():
    """vLLM's core / worker split (docs/architecture.md): the engine's Request, the scheduler, the
    KV cache manager and the draft-length policy load without torch, numpy, rich, omegaconf or
    matplotlib, and without any worker-side module."""
    loaded = _loaded_after("from mtpx.core.request import Request\n"
                           "from mtpx.core.scheduler import Scheduler, SchedulerOutput\n"
                           "from mtpx.auto_k import AutoDraftLength\n"
                           "from mtpx.outputs import RequestOutput")
    assert loaded["heavy"] == []
    assert loaded["mtpx"] == ["mtpx", "mtpx.auto_k", "mtpx.auto_k.acceptance", "mtpx.auto_k.admission",
                              "mtpx.auto_k.choices", "mtpx.auto_k.config", "mtpx.auto_k.cost_curve",
                              "mtpx.auto_k.cost_learning", "mtpx.auto_k.cost_model_log",
                              "mtpx.auto_k.exploring",
                              "mtpx.auto_k.fixed", "mtpx.auto_k.plain_stretch", "mtpx.auto_k.policy",
                              "mtpx.auto_k.request_k",
                              "mtpx.auto_k.settled", "mtpx.auto_k.summary", "mtpx.core",
                              "mtpx.core.block_pool",
                              "mtpx.core.kv_cache_manager", "mtpx.core.request", "mtpx.core.sampling_params",
                              "mtpx.core.scheduler", "mtpx.core.step_plan", "mtpx.core.structured_outputs",
                              "mtpx.outputs"]


def test_the_engine_imports_no_metrics_rich_or_omegaconf():
    """The engine takes its output types from mtpx.outputs, not mtpx.metrics (whose report and
    logging pull in rich and omegaconf); `from mtpx import SamplingParams` loads the core only."""
    loaded = _loaded_after("from mtpx.engine.engine import Engine")
    assert not any(m.startswith("mtpx.metrics") for m in loaded["mtpx"])
    assert not {"rich", "omegaconf", "matplotlib"} & set(loaded["heavy"])
    assert _loaded_after("from mtpx import SamplingParams")["heavy"] == []


def test_no_module_over_500_lines_and_no_function_over_80():
    """Sizes a reader can follow (docs/architecture.md, "Sizes"): every module of mtpx at most 500
    lines, every function at most 80."""
    import ast
    over = []
    for path in sorted((ROOT / "mtpx").rglob("*.py")):
        source = path.read_text()
        if source.count("\n") > 500:
            over.append(f"{path.relative_to(ROOT)}: {source.count(chr(10))} lines")
        for node in ast.walk(ast.parse(source)):
            if (isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                    and node.end_lineno - node.lineno >= 80):
                over.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}: "
                            f"{node.end_lineno - node.lineno + 1} lines")
    assert over == []
