"""What the automatic-k host-work scripts share (experiments/concurrency/host_work, settled): the
source tree (ROOT, or the one this file is in) first on sys.path, GSM8K test prompts, greedy
128-token params and the demo's engines at concurrency 1 (1 thread, max_model_len 1024), and
`timed_steps`, which times their scheduler and runner calls."""
import collections
import os
import pathlib
import sys
import time

ROOT = pathlib.Path(os.environ.get("ROOT") or pathlib.Path(__file__).resolve().parents[1])
sys.path.insert(0, str(ROOT))
from mtpx import LLM, SamplingParams  # noqa: E402
from mtpx.data.gsm8k import format_prompt, load_gsm8k  # noqa: E402

DATA = pathlib.Path(os.environ.get("MTPX_DATA_DIR", ROOT.parent / "shared" / "data"))
PARAMS = SamplingParams(max_tokens=128, temperature=0.0)


def gsm8k_prompts(default: int) -> list[str]:
    """The first argv[1] (else `default`) GSM8K test questions as prompts."""
    n = int(sys.argv[1]) if len(sys.argv) > 1 else default
    return [format_prompt(r["question"]) for r in load_gsm8k(DATA / "gsm8k" / "test.jsonl")[:n]]


def engine(k, compile: bool) -> LLM:
    """The demo's mtp8 speculator at num_speculative_tokens k (8 or "auto"), concurrency 1."""
    return LLM(str(ROOT / "checkpoints/demo"), spec="mtp8", num_speculative_tokens=k, threads=1,
               max_num_seqs=1, max_model_len=1024, compile=compile)


def timed_steps(llms: dict, on_execute=None) -> dict:
    """Wrap each engine's scheduler.schedule, scheduler.update_from_output and runner.execute with
    perf_counter; returns {name: Counter of seconds per call name}; on_execute(name, out, result,
    seconds) after every execute (out: the SchedulerOutput)."""
    host = {n: collections.Counter() for n in llms}

    def wrap(name, obj, attr):
        f = getattr(obj, attr)

        def timed(*a, **k):
            t = time.perf_counter()
            r = f(*a, **k)
            dt = time.perf_counter() - t
            host[name][attr] += dt
            if attr == "execute" and on_execute is not None:
                on_execute(name, a[0], r, dt)
            return r
        setattr(obj, attr, timed)

    for name, llm in llms.items():
        wrap(name, llm.engine.scheduler, "schedule")
        wrap(name, llm.engine.scheduler, "update_from_output")
        wrap(name, llm.engine.runner, "execute")
    return host
