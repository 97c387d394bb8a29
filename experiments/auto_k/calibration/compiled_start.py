"""Start-up of a compiled engine on a machine's first run: fixed k = 8 against
num_speculative_tokens=auto (whose calibration runs the decode step at every depth 0..8, each a
window width with graphs of its own), each in a fresh process with empty Inductor and step-cost
caches, demo, max_num_seqs 16.

    OMP_NUM_THREADS=2 python experiments/auto_k/calibration/compiled_start.py
"""
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
CHILD = """
import sys, time, torch
sys.path.insert(0, {root!r})
torch.set_num_threads(2)
from mtpx import LLM
t = time.perf_counter()
llm = LLM(model={model!r}, spec="mtp8", num_speculative_tokens={k!r}, max_num_seqs=16, compile=True)
total = time.perf_counter() - t
stats = llm.engine.compile_stats()
cal = llm.calibration
print(f"k={k}: LLM built in {{total:.0f}} s; graphs compiled {{stats['num_graphs']}}, "
      f"compile {{stats['compile_s']:.0f}} s" + (f"; calibration {{cal['seconds']:.0f}} s" if cal else ""),
      flush=True)
"""
for k in (8, "auto"):
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=tempfile.mkdtemp(), MTPX_CACHE_DIR=tempfile.mkdtemp())
    code = CHILD.format(root=str(ROOT), model=str(ROOT / "checkpoints" / "demo"), k=k)
    subprocess.run([sys.executable, "-c", code], env=env, check=True)
