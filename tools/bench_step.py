"""The engine's decode-step time beside the model forwards it runs, timed alone on the same shapes,
so the engine's own overhead is a number.

    python tools/bench_step.py [--model checkpoints/demo] [--specs none mtp1 mtp8] \
        [--batch-sizes 1 4 16 64] [--modes eager compiled] [--mtp1-k 1] [--input-len 64] \
        [--steps 12] [--repeats 20] [--out experiments/step_costs]

For each (spec, mode) one LLM serves `batch` random prompts of input-len tokens for about `steps`
decode rounds with every request verifying a full k drafts; the engine step is the median of
verify_s + draft_s over those steps (StepTiming, mtpx/engine/model_runner.py). Then, on the
engine's own cache and the same static metadata (padded batch, k + 1 window, block bucket):
- target(k+1): the verification forward (target over k + 1 tokens, lm_head included);
- target(1): the same over one token (plain decoding's step);
- draft loop: the speculator's plan + draft loop (mtp8: module k over its k + 1 window and its
  draft logits; mtp1: step 1 over k + 1, then k - 1 one-token steps), back to back, and again
  each call right after an untimed verification forward as in the engine step ("after verify":
  the target's weights have pushed the modules' out of the CPU caches);
and, with a speculator, the rest of the verify phase: the greedy verification of the window's
logits (mtpx.spec_decode.verification.verify) and the Gated DeltaNet commit at the accepted
token (the engine's compiled commit in compiled mode);
each a median of `repeats` calls (compiled mode: the engine's compiled functions; target(1) is a
second graph of the same compiled forward). target(1) and target(k+1) are timed alternately, call
by call, and their ratio is the median of the paired ratios: timed minutes apart, in separate
engines, the 1-token forward moved by 60% between runs. overhead = engine step / (target(k+1) +
draft loop alone). Last, the engine step and its forwards again, alternated call by call (the
step from Engine.time_decode_steps, the calibration's step at the same context; the forwards:
target(k+1), then the draft loop): "step / forwards, paired" is the median of the paired ratios
(quartiles beside it), which the machine's drift between the two measurements above does not
move. Writes bench_step.md and .json into --out atomically.
"""
from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from mtpx import LLM, SamplingParams  # noqa: E402
from mtpx.engine.decode_step import block_bucket, verify_forward  # noqa: E402
from mtpx.spec_decode.protocol import DraftBatch  # noqa: E402
from mtpx.io import atomic_write_json, atomic_write_text  # noqa: E402
from mtpx.auto_k.costs import step_costs  # noqa: E402
from mtpx.spec_decode.sampler import RequestSampling  # noqa: E402
from mtpx.spec_decode.verification import verify as verify_drafts  # noqa: E402


def _median_ms(fn, repeats: int) -> float:
    fn()                                                    # untimed
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def _paired_ms(first, second, repeats: int) -> list[tuple[float, float]]:
    """[(ms of first, ms of second)] over `repeats` alternated calls, after one untimed call of each."""
    first(), second()
    pairs = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        first()
        t1 = time.perf_counter()
        second()
        pairs.append((1e3 * (t1 - t0), 1e3 * (time.perf_counter() - t1)))
    return pairs


@torch.inference_mode()
def _forwards(llm: LLM, B: int, n: int, repeats: int) -> dict:
    """Target and draft-loop forwards alone on the decode step's static shapes (module doc)."""
    runner = llm.engine.runner
    cache, model, spec, k = runner.cache, llm.model, runner.speculator, runner.num_speculative_tokens
    step = runner.step                  # the engine's DecodeStep, eager or compiled
    Bp = step.padded_batch(B)
    need = n + 2 * k + 2
    nb = (block_bucket(need, cache.block_size, cache.max_blocks) if step.static
          else min(cache.max_blocks, -(-need // cache.block_size)))
    rows = torch.tensor(list(range(B)) + [cache.pad_row] * (Bp - B))
    starts = torch.full((Bp,), n)
    lengths = torch.tensor([k + 1] * B + [0] * (Bp - B))
    meta = cache.static_meta(starts, lengths, rows, k + 1, nb, keep_states=k > 0)  # as the engine's
    # plain decoding's forward (its one token's state is stored by the forward, no window kept)
    one = cache.static_meta(starts, torch.tensor([1] * B + [0] * (Bp - B)), rows, 1, nb)
    verify = lambda: step.verify(meta)  # noqa: E731
    # the 1-token forward on the same weights and cache (compiled: a second graph of the same
    # function, as automatic k compiles for its k = 0 steps), alternated call by call with the
    # verification forward so that both see the same machine state; the ratio is the median of
    # the paired ratios
    one_fwd = lambda: step.verify(one)  # noqa: E731
    pairs = _paired_ms(one_fwd, verify, repeats)
    out = {"target_1_ms": statistics.median(a for a, _ in pairs),
           "target_k1_ms": statistics.median(b for _, b in pairs),
           "target_k1_over_1_paired": statistics.median(b / a for a, b in pairs)}
    if k > 0:         # each back to back as well (the same graph call after call: warm caches)
        out["target_1_back_to_back_ms"] = _median_ms(one_fwd, repeats)
        out["target_k1_back_to_back_ms"] = _median_ms(verify, repeats)
    if spec is not None:
        # the rest of the verify phase: the greedy verification of the window's logits, and the
        # Gated DeltaNet commit at the accepted token (each after a fresh verification forward)
        ids, _, logits = verify()
        params = [SamplingParams(max_tokens=1)] * B
        out["verification_ms"] = _median_ms(
            lambda: verify_drafts(ids[:B], logits[:B], [k] * B,
                                  RequestSampling(params, [None] * B, ids.device), [None] * B), repeats)
        if cache.recurrent:
            accepted = torch.zeros(Bp, dtype=torch.long)
            commit = lambda: step.commit(accepted, None)  # noqa: E731
            times = []
            for i in range(repeats + 1):                 # the first call untimed
                verify()
                t0 = time.perf_counter()
                commit()
                if i:
                    times.append(time.perf_counter() - t0)
            out["commit_ms"] = 1e3 * statistics.median(times)
        _, h, _ = verify_forward(model, cache, meta)
        is_drafting = torch.arange(Bp) < B
        nt = torch.where(is_drafting, n + k + 1, 1)
        target_end = torch.where(is_drafting, n + k, 0)
        start = meta.positions[:, 0]
        spec.reset_rows(rows, n)                             # the modules computed [0, n)
        saved = spec.computed.clone()

        batch = DraftBatch(rows, nt, target_end, is_drafting, torch.where(is_drafting, k, 0), start, h,
                           k, k, k + 1, meta.block_table)

        def draft():
            spec.computed.copy_(saved)                       # every call re-prefills the same window
            return step.draft(batch)

        out["draft_loop_ms"] = _median_ms(draft, repeats)
        # as in the engine step: each call right after a verification forward (untimed), whose
        # 32 layers' weights push the modules' out of the CPU caches
        times = []
        for i in range(repeats + 1):                     # the first call untimed
            verify()
            cache.clear_pending()
            t0 = time.perf_counter()
            draft()
            if i:
                times.append(time.perf_counter() - t0)
        out["draft_loop_after_verify_ms"] = 1e3 * statistics.median(times)

    def forwards():
        verify()
        cache.clear_pending()
        if spec is not None:
            draft()
    out.update(_step_vs_forwards(llm, B, n, k, forwards, repeats))
    return out


def _step_vs_forwards(llm: LLM, B: int, n: int, k: int, forwards, repeats: int) -> dict:
    """The engine step (Engine.time_decode_steps: the calibration's step of B requests at n known
    tokens, verifying and proposing k drafts) and its forwards alone (`forwards`: the
    verification forward, then the draft loop) alternated call by call, `repeats` pairs after
    one untimed: the pairs (ms), and the median and quartiles of the paired step / forwards ratios."""
    engine = llm.engine
    engine.time_decode_steps(B, [k], n, rounds=1)
    forwards()
    pairs = []
    for _ in range(repeats):
        step = engine.time_decode_steps(B, [k], n, rounds=1, warmup=0)[k][0]
        t0 = time.perf_counter()
        forwards()
        pairs.append((step, 1e3 * (time.perf_counter() - t0)))
    ratios = [a / b for a, b in pairs]
    q = statistics.quantiles(ratios, n=4)
    return {"paired_ms": pairs,
            "paired_step_ms": statistics.median(a for a, _ in pairs),
            "paired_forwards_ms": statistics.median(b for _, b in pairs),
            "step_over_forwards_paired": statistics.median(ratios),
            "step_over_forwards_quartiles": [q[0], q[2]]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=str(ROOT / "checkpoints" / "demo"))
    ap.add_argument("--specs", nargs="+", default=["none", "mtp1", "mtp8"])
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 4, 16, 64])
    ap.add_argument("--modes", nargs="+", default=["eager", "compiled"], choices=["eager", "compiled"])
    ap.add_argument("--mtp1-k", type=int, default=1)
    ap.add_argument("--input-len", type=int, default=64)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="experiments/step_costs")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(args.seed)
    rows = []
    for spec in args.specs:
        k = 0 if spec == "none" else args.mtp1_k if spec == "mtp1" else None
        for mode in args.modes:
            llm = LLM(model=args.model, spec=None if spec == "none" else spec, num_speculative_tokens=k,
                      max_num_seqs=max(args.batch_sizes), compile=mode == "compiled",
                      max_model_len=args.input_len + (args.steps + 2) * 10 + 32)
            k = llm.num_speculative_tokens
            vocab = llm.model.cfg.vocab_size
            for B in args.batch_sizes:
                prompts = torch.randint(2, vocab, (B, args.input_len), generator=g).tolist()
                llm.generate(prompts, SamplingParams(max_tokens=(args.steps + 2) * (k + 1), ignore_eos=True))
                costs = step_costs(llm.engine.step_timings, k).get(B)
                if costs is None:
                    print(f"{spec} {mode} batch {B}: no step verified {k} drafts for every request; skipped")
                    continue
                fw = _forwards(llm, B, args.input_len, args.repeats)
                alone = fw["target_k1_ms"] + fw.get("draft_loop_ms", 0.0)
                row = {"spec": spec, "k": k, "mode": mode, "batch_size": B, **costs, **fw,
                       "forwards_ms": alone, "overhead": costs["step_ms"] / alone,
                       "verify_over_target_1": fw["target_k1_over_1_paired"]}
                rows.append(row)
                print(f"{spec} k={k} {mode} batch {B}: engine step {costs['step_ms']:.2f} ms, forwards alone "
                      f"{alone:.2f} ms ({row['overhead']:.2f}x; paired "
                      f"{row['step_over_forwards_paired']:.2f}x); target({k + 1}) {fw['target_k1_ms']:.2f}, "
                      f"target(1) {fw['target_1_ms']:.2f}, draft loop {fw.get('draft_loop_ms', 0):.2f} ms",
                      flush=True)

    def ms(x):
        return "—" if x is None else f"{x:.2f}"

    lines = [f"# Engine decode step vs its forwards alone ({Path(args.model).name}, {args.threads} threads, "
             f"{args.input_len}-token prompts)", "",
             "| spec | k | mode | batch | engine step ms | verify ms | draft ms | target(k+1) ms | "
             "target(1) ms | draft loop ms | after verify ms | verification ms | commit ms | step / forwards "
             "| step / forwards, paired (quartiles) | target(k+1) / target(1), paired |",
             "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['spec']} | {r['k']} | {r['mode']} | {r['batch_size']} | {r['step_ms']:.2f} | "
                     f"{r['verify_ms']:.2f} | {r['draft_ms']:.2f} | {r['target_k1_ms']:.2f} | "
                     f"{ms(r['target_1_ms'])} | {r.get('draft_loop_ms', 0):.2f} | "
                     f"{ms(r.get('draft_loop_after_verify_ms'))} | {ms(r.get('verification_ms'))} | "
                     f"{ms(r.get('commit_ms'))} | {r['overhead']:.2f}x | "
                     f"{r['step_over_forwards_paired']:.2f}x ({r['step_over_forwards_quartiles'][0]:.2f}-"
                     f"{r['step_over_forwards_quartiles'][1]:.2f}) | "
                     f"{ms(r['verify_over_target_1'])}x |")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / "bench_step.json", {"model": args.model, "threads": args.threads,
                                                "platform": platform.platform(), "rows": rows})
    atomic_write_text(out / "bench_step.md", "\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
