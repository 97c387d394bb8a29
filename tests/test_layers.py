"""Package layers: serving never imports the trainer (the import-linter contracts in
pyproject.toml state the whole layering; .ci/run checks them with lint-imports)."""
from __future__ import annotations

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
