"""engine.compile with tensor parallelism: greedy mtp8 tokens of TP=2 compiled (functional
collectives inside the compiled decode step and its layer regions) against TP=1 eager, on the
test suite's tiny hybrid model (4 layers, 4 MTP modules; written to a temporary folder).

    python experiments/tensor_parallel/compiled_check.py --backend inductor   # or aot_eager
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from mtpx import LLM, SamplingParams  # noqa: E402
from mtpx.train.checkpoint import save_checkpoint  # noqa: E402
from mtpx.train.tokenizer import train_tokenizer  # noqa: E402
from tests.helpers import peaked_model, tiny_config  # noqa: E402

PROMPTS = [[5, 17, 42, 9, 9, 100], [7] * 20, list(range(30, 70))]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="inductor")
    args = ap.parse_args()
    folder = Path(tempfile.mkdtemp()) / "tiny"
    tok = train_tokenizer(["def f(x):\n    return x + 1\n" * 50, "Question: what?\nAnswer: 42\n" * 50], 300)
    save_checkpoint(folder, peaked_model(tiny_config(vocab_size=tok.get_vocab_size(),
                                                     max_position_embeddings=1024)).float(), tok)
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    eager = LLM(model=folder, spec="mtp8", threads=1, max_num_seqs=4, compile=False)
    ref = [o.output_token_ids for o in eager.generate(PROMPTS, params)]
    t0 = time.perf_counter()
    llm = LLM(model=folder, spec="mtp8", threads=1, max_num_seqs=4, tensor_parallel_size=2, compile=True,
              compile_backend=args.backend)
    built = time.perf_counter() - t0
    got = [o.output_token_ids for o in llm.generate(PROMPTS, params)]
    llm.shutdown()
    print(json.dumps({"backend": args.backend, "built_s": round(built, 1),
                      "num_graphs": llm.compile_stats["num_graphs"],
                      "regions": llm.compile_stats["regions"], "requests": len(ref),
                      "identical": sum(a == b for a, b in zip(ref, got))}))
    return 0 if got == ref else 1


if __name__ == "__main__":
    sys.exit(main())
