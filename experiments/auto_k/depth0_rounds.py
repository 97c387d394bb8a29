"""Plain decoding against `num_speculative_tokens=auto` (calibrated at start-up, a fresh step-cost
cache) on the first 64 GSM8K test prompts at concurrency 64, at most 128 tokens, alternated in one
process for 4 rounds: at batch 64 auto admits every request at depth 0 and runs plain decoding's
computation, so the spread of auto / plain is the machine's noise on a 10 s measurement. Prints each
generate's wall time, and its prefill and decode seconds (StepTimings).

    OMP_NUM_THREADS=2 python experiments/auto_k/depth0_rounds.py
"""
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

os.environ['MTPX_CACHE_DIR'] = tempfile.mkdtemp()
from mtpx import LLM, SamplingParams  # noqa: E402
from mtpx.schema import data_dir  # noqa: E402  (MTPX_DATA_DIR, else conf/config.yaml's data_dir)
from mtpx.data.gsm8k import format_prompt, load_gsm8k  # noqa: E402

torch.set_num_threads(2)
prompts = [format_prompt(r["question"])
           for r in load_gsm8k(data_dir(ROOT / "conf") / "gsm8k" / "test.jsonl")][:64]
kw = dict(model=str(ROOT / 'checkpoints' / 'demo'), max_num_seqs=64, max_model_len=1024,
          record_step_timings=True)
plain = LLM(**kw)
auto = LLM(spec='mtp8', num_speculative_tokens='auto', **kw)
print('calibration', auto.calibration['source'], round(auto.calibration['seconds'], 1))
p = SamplingParams(max_tokens=128)
times = {'auto': [], 'plain': []}
for r in range(4):
    for name, llm in (('auto', auto), ('plain', plain)) if r % 2 == 0 else (('plain', plain), ('auto', auto)):
        llm.engine.reset_step_timings()
        t0 = time.perf_counter()
        llm.generate(prompts, p)
        dt = time.perf_counter() - t0
        ts = llm.engine.step_timings
        pre = sum(t.prefill_s for t in ts)
        dec = sum(t.verify_s + t.draft_s for t in ts)
        times[name].append(dt)
        print(r, name, round(dt, 2), 's; prefill', round(pre, 2), 'decode', round(dec, 2), 'other',
              round(dt - pre - dec, 2), flush=True)
print('auto / plain output tok/s per round:',
      [round(p / a, 2) for a, p in zip(times['auto'], times['plain'])])
