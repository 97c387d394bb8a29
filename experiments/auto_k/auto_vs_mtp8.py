"""auto (step costs that make k = 8 best) against mtp8, alternated on the same GSM8K prompts, eager:
the difference between two engines doing the same work.

    OMP_NUM_THREADS=2 python experiments/auto_k/auto_vs_mtp8.py BATCH
"""
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from mtpx import LLM, SamplingParams  # noqa: E402
from mtpx.schema import data_dir  # noqa: E402  (MTPX_DATA_DIR, else conf/config.yaml's data_dir)
from mtpx.data.gsm8k import format_prompt, load_gsm8k  # noqa: E402
from mtpx.auto_k.store import save_step_costs  # noqa: E402
from mtpx.auto_k.costs import step_costs  # noqa: E402

torch.set_num_threads(2)
B = int(sys.argv[1])
M = str(ROOT / "checkpoints" / "demo")
cost_file = Path(tempfile.mkdtemp()) / "flat_costs.json"
save_step_costs(cost_file, {(k, b): 10.0 + 0.1 * k for k in range(9) for b in (1, 64)}, {})
llms = {"mtp8": LLM(model=M, spec="mtp8", max_num_seqs=B, max_model_len=1024),
        "auto": LLM(model=M, spec="mtp8", num_speculative_tokens="auto", max_num_seqs=B, max_model_len=1024,
                    cost_model_file=cost_file)}
data = data_dir(ROOT / "conf") / "gsm8k" / "test.jsonl"
prompts = [format_prompt(r["question"]) for r in load_gsm8k(data)[:8 * B]]
tok_s = {n: [] for n in llms}
steps = {n: [] for n in llms}
for rep in range(4):
    chunk = prompts[rep * 2 * B:(rep + 1) * 2 * B]
    for n in (list(llms) if rep % 2 == 0 else list(llms)[::-1]):
        llm = llms[n]
        llm.engine.reset_step_timings()
        t0 = time.perf_counter()
        outs = llm.generate(chunk, SamplingParams(max_tokens=128), max_concurrency=B)
        tok_s[n].append(sum(len(o.output_token_ids) for o in outs) / (time.perf_counter() - t0))
        c = step_costs(llm.engine.step_timings, 8).get(B)
        steps[n].append(None if c is None else round(c["step_ms"], 1))
    print(f"chunk {rep}: tok/s {({n: round(v[-1], 1) for n, v in tok_s.items()})}, "
          f"auto / mtp8 {tok_s['auto'][-1] / tok_s['mtp8'][-1]:.2f}; median k = 8 steps (ms) {steps}",
          flush=True)
print("auto's k per step:", llms["auto"].engine.draft_length.summary()["k_histogram"])
