"""Do the start-up calibration's relative step costs match the real engines' at one batch size?
In each of REPEATS rounds, in a rotated order: plain decoding and fixed k = 2, 4, 8 (multi-module
MTP) each generate the same BATCH GSM8K test prompts (at most 128 tokens, greedy, all in flight),
their pure decode steps of all BATCH requests timed (StepTimings: verify + draft); and the
calibration (calibrate_step_costs, the auto engine's start-up measurement) at that batch size.
Prints, per round, step(k) / step(plain) of the real engines beside cost(k) / cost(0) of the
calibration, raw and as the cost model uses it (smoothed). Eager, demo, 2 threads.

    OMP_NUM_THREADS=2 python experiments/auto_k/calibration/calib_vs_fixed.py BATCH [REPEATS]
"""
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from mtpx import LLM, SamplingParams  # noqa: E402
from mtpx.schema import data_dir  # noqa: E402  (MTPX_DATA_DIR, else conf/config.yaml's data_dir)
from mtpx.data.gsm8k import format_prompt, load_gsm8k  # noqa: E402
from mtpx.auto_k import AutoDraftLength, calibration  # noqa: E402
from mtpx.auto_k.store import save_step_costs  # noqa: E402


def calibrate_step_costs(eng, **kw):
    """mtpx.auto_k.calibration.calibrate_step_costs over the engine's Engine.time_decode_steps (the
    start-up calibration's measure; an eager engine, each k its own step). Returns {(k, B): ms}."""
    def measure(b, ks, context_len, rounds, seed=0, draft=None):
        return eng.time_decode_steps(b, ks, context_len, rounds, seed=seed, draft=draft)
    return calibration.calibrate_step_costs(measure, eng.num_speculative_tokens, eng.config.max_num_seqs,
                                            **kw)


torch.set_num_threads(2)
B = int(sys.argv[1])
R = int(sys.argv[2]) if len(sys.argv) > 2 else 3
KS = (2, 4, 8)
prompts = [format_prompt(r["question"]) for r in load_gsm8k(data_dir(ROOT / "conf") / "gsm8k" / "test.jsonl")]
fake = Path(tempfile.mkdtemp()) / "costs.json"          # skips the LLM's own start-up calibration
save_step_costs(fake, {(k, 1): 10.0 + k for k in range(9)}, {})
kw = dict(model=str(ROOT / "checkpoints" / "demo"), max_num_seqs=B, max_model_len=1024,
          record_step_timings=True)
engines = {"plain": LLM(**kw)}
for k in KS:
    engines[f"k={k}"] = LLM(spec="mtp8", num_speculative_tokens=k, **kw)
auto = LLM(spec="mtp8", num_speculative_tokens="auto", cost_model_file=fake, **kw)
params = SamplingParams(max_tokens=128)
names = list(engines) + ["calibration"]
rows = []
for rnd in range(R):
    chunk = prompts[rnd * B:(rnd + 1) * B]
    real, cal = {}, None
    for name in names[rnd % len(names):] + names[: rnd % len(names)]:
        if name == "calibration":
            cal = calibrate_step_costs(auto.engine, batch_sizes=[B])
            continue
        llm = engines[name]
        llm.engine.reset_step_timings()
        llm.generate(chunk, params)
        steps = [1e3 * (t.verify_s + t.draft_s) for t in llm.engine.step_timings
                 if t.num_decodes == B and t.num_prefill_tokens == 0]
        real[name] = statistics.median(steps)
    policy = AutoDraftLength(8, cal)
    line = [f"round {rnd} batch {B}: plain step {real['plain']:.1f} ms, calibrated k=0 {cal[(0, B)]:.1f} ms"]
    for k in KS:
        r = real[f"k={k}"] / real["plain"]
        c_raw = cal[(k, B)] / cal[(0, B)]
        c = policy.costs.calibrated_cost(k, B) / policy.costs.calibrated_cost(0, B)
        rows.append((k, r, c_raw, c))
        line.append(f"k={k}: real {r:.2f}, calibrated {c_raw:.2f} (smoothed {c:.2f}; / real {c / r:.2f})")
    print("; ".join(line), flush=True)
for k in KS:
    q = [c / r for kk, r, _, c in rows if kk == k]
    print(f"k={k}: smoothed calibrated / real relative cost: median {statistics.median(q):.2f}, "
          f"{min(q):.2f}-{max(q):.2f}")
