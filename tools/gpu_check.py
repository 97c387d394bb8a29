"""GPU check: the fast paths against the references, and a timing table, in one short run.

    python tools/gpu_check.py [--device cuda] [--model checkpoints/demo] [--dtype bfloat16] \
        [--out outputs/gpu_check] [--quick]

Sections (each one says "skipped: <reason>" when its prerequisite is missing, e.g. on a CPU):
1. attention: FlashInferBackend vs TorchBackend on a ragged batch (a prefill chunk, a decode, a
   verification window) over a random paged cache: max |difference|.
2. gated delta rule: flash-linear-attention's kernels vs the plain-PyTorch forms (recurrent, T=1;
   chunked, T=256): max |difference|.
3. engine: greedy tokens of mtp8 with engine.attention_backend=flashinfer vs torch, identical.
4. timing: the decode-step cost per k at batch 1 and 64 (automatic k's calibration, mtpx.auto_k.costs),
   output tokens/s of plain decoding and mtp8 at batch 1 and 64, and the decode step at batch 1
   against the weight-bandwidth floor (weight bytes / measured copy bandwidth).
5. compiled: engine.compile (torch.compile "reduce-overhead", CUDA graphs, on CUDA) against eager,
   for plain decoding and mtp8: identical greedy tokens, the decode step (verify + draft loop, ms)
   with and without compile at batch 1 and the largest batch, output tokens/s, and the build time
   of each engine cold (an empty $MTPX_CACHE_DIR; compile and CUDA-graph capture in the warm-up)
   and again (the same settings once more: graphs loaded from the compile cache).
6. training: one optimizer step of the joint objective (target + heads) and of the frozen-target
   one (heads only) on --device against the same step on the CPU (float32, TF32 off): loss and
   updated weights within tolerance; then training tokens/s on the device in float32 and in
   bfloat16 autocast (16 x 256-token batches, as mode=train).
7. tensor parallel: greedy mtp8 tokens with engine.tensor_parallel_size=2 over NCCL (two
   processes, one GPU each) against one process, identical; skipped with fewer than 2 GPUs.
8. reference comparison: the reference design's own benchmark, mtp8 against mtp1 and plain
   decoding at concurrency 64 on GSM8K (the first 128 test questions, greedy, at most 128 tokens,
   eager), with automatic k beside them: output tok/s, mtp8 / mtp1, mtp8 / plain, auto / the best
   fixed contender, and the requests whose tokens differ from plain decoding (bf16 near-ties can
   flip a token; counted, not failed); skipped without the GSM8K test set.
Runs in under 5 minutes on one GPU. Writes gpu_check.md and gpu_check.json into --out
(atomically). Exit status 1 when a comparison fails its tolerance or tokens differ.
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

import torch  # noqa: E402

from mtpx import LLM, SamplingParams  # noqa: E402
from mtpx.attention.torch_backend import TorchBackend  # noqa: E402
from mtpx.attention.kv_cache import KVCache  # noqa: E402
from mtpx.hf.loader import load_pretrained  # noqa: E402
from mtpx.io import atomic_write_json, atomic_write_text  # noqa: E402
from mtpx.auto_k.costs import step_costs  # noqa: E402
from mtpx.engine.engine import measure_step_costs  # noqa: E402
from mtpx.attention.meta import ForwardMeta  # noqa: E402

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
ATTN_TOL = {torch.bfloat16: 3e-2, torch.float16: 1e-2, torch.float32: 1e-4}


def check_attention(device, dtype) -> dict:
    """FlashInfer vs torch attention on a ragged batch (block size 16, 8 query / 2 KV heads, D 128)."""
    try:
        from mtpx.attention.flashinfer_backend import FlashInferBackend
        fi = FlashInferBackend(device)
    except (ImportError, ValueError) as err:
        return {"skipped": str(err)}
    if device.type != "cuda":
        return {"skipped": "FlashInfer needs a CUDA device"}
    g = torch.Generator(device="cpu").manual_seed(0)
    S, H, Hkv, D, nb = 16, 8, 2, 128, 64
    starts, lengths = torch.tensor([32, 200, 48]), torch.tensor([40, 1, 9])
    table = torch.randperm(nb, generator=g)[:3 * 16].view(3, 16)
    meta = ForwardMeta.build(starts.to(device), lengths.to(device), torch.arange(3, device=device),
                             table.to(device), S)
    T = int(lengths.max())
    q = torch.randn(3, T, H, D, generator=g).to(device, dtype)
    k, v = (torch.randn(3, T, Hkv, D, generator=g).to(device, dtype) for _ in range(2))
    base = [torch.randn(nb, S, Hkv, D, generator=g).to(device, dtype) for _ in range(2)]
    outs = []
    for backend in (TorchBackend(), fi):
        cache = KVCache(base[0].clone(), base[1].clone())
        meta.planned(backend)
        outs.append(backend.forward(q, k, v, cache, meta)[meta.valid].float())
    diff = (outs[0] - outs[1]).abs().max().item()
    return {"max_abs_diff": diff, "tolerance": ATTN_TOL[dtype], "ok": diff <= ATTN_TOL[dtype]}


def check_gated_delta_rule(device, dtype) -> dict:
    """FLA kernels (through mtpx's dispatch) vs the plain forms; float32 reference."""
    from mtpx.models import gated_delta_rule as gdr
    if device.type != "cuda":
        return {"skipped": "flash-linear-attention needs a CUDA device"}
    try:
        import fla.ops.gated_delta_rule  # noqa: F401  (availability check)
    except ImportError as err:
        return {"skipped": f"flash-linear-attention is not installed ({err})"}
    g = torch.Generator(device="cpu").manual_seed(0)
    out = {}
    for name, fast, ref, T in (("recurrent", gdr.gated_delta_rule_recurrent,
                                gdr.recurrent_gated_delta_rule, 1),
                               ("chunked", gdr.gated_delta_rule_chunked, gdr.chunk_gated_delta_rule, 256)):
        B, H, Dk = 2, 4, 128
        q, k, v = (torch.randn(B, T, H, Dk, generator=g) for _ in range(3))
        gl = -torch.rand(B, T, H, generator=g)
        beta = torch.rand(B, T, H, generator=g)
        s0 = torch.randn(B, H, Dk, Dk, generator=g) * 0.1
        with torch.no_grad():
            o_ref, s_ref = ref(q, k, v, gl, beta, s0)[:2]
            dev = ([x.to(device, dtype) for x in (q, k, v)]
                   + [gl.to(device), beta.to(device, dtype), s0.to(device)])
            o, s = fast(*dev)[:2]
        out[name] = {"max_abs_diff_out": (o.float().cpu() - o_ref).abs().max().item(),
                     "max_abs_diff_state": (s.float().cpu() - s_ref).abs().max().item()}
    out["ok"] = all(r["max_abs_diff_out"] <= 2e-2 for r in out.values() if isinstance(r, dict))
    return out


def check_engine_tokens(model, device, dtype_name, prompts, max_tokens) -> dict:
    try:
        fi = LLM(model=model, spec="mtp8", dtype=dtype_name, device=device, attention_backend="flashinfer")
    except ValueError as err:
        return {"skipped": str(err)}
    p = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    ref = LLM(model=fi.model, tokenizer=fi.tokenizer, spec="mtp8").generate(prompts, p)
    got = fi.generate(prompts, p)
    same = sum(a.output_token_ids == b.output_token_ids for a, b in zip(ref, got))
    return {"identical_requests": same, "num_requests": len(prompts), "ok": same == len(prompts)}


def check_tensor_parallel(model, device, dtype_name, prompts, max_tokens) -> dict:
    """mtp8's greedy tokens with tensor_parallel_size=2 (NCCL, GPUs 0 and 1) against TP=1."""
    if device.type != "cuda":
        return {"skipped": "tensor parallelism over NCCL needs CUDA devices (the CPU path, gloo, "
                           "is in the test suite)"}
    if torch.cuda.device_count() < 2:
        return {"skipped": f"tensor_parallel_size=2 needs 2 GPUs; {torch.cuda.device_count()} visible"}
    p = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    ref = LLM(model=model, spec="mtp8", dtype=dtype_name, device=device).generate(prompts, p)
    tp = LLM(model=model, spec="mtp8", dtype=dtype_name, device=device, tensor_parallel_size=2)
    got = tp.generate(prompts, p)
    tp.shutdown()
    same = sum(a.output_token_ids == b.output_token_ids for a, b in zip(ref, got))
    return {"identical_requests": same, "num_requests": len(prompts), "ok": same == len(prompts)}


def reference_comparison(model, device, dtype_name, quick: bool) -> dict:
    """Section 8 of the module doc (quick: 4 questions at concurrency 4, 8 tokens)."""
    from mtpx.data.gsm8k import format_prompt, load_gsm8k
    from mtpx.schema import CONF_DIR, data_dir
    path = data_dir(CONF_DIR) / "gsm8k" / "test.jsonl"
    if not path.exists():
        return {"skipped": f"no GSM8K test set at {path} (MTPX_DATA_DIR sets the data directory)"}
    concurrency, num, new = (4, 4, 8) if quick else (64, 128, 128)
    prompts = [format_prompt(q["question"]) for q in load_gsm8k(path)[:num]]
    params = SamplingParams(max_tokens=new)
    rows, tokens = {}, {}
    for name, spec, k in (("plain", None, None), ("mtp1", "mtp1", 1), ("mtp8", "mtp8", None),
                          ("auto", "mtp8", "auto")):
        llm = LLM(model=model, spec=spec, num_speculative_tokens=k, dtype=dtype_name, device=device,
                  max_num_seqs=concurrency)
        llm.generate(prompts[:1], SamplingParams(max_tokens=2))          # warm
        _sync(device)
        t0 = time.perf_counter()
        outs = llm.generate(prompts, params, max_concurrency=concurrency)
        _sync(device)
        seconds = time.perf_counter() - t0
        tokens[name] = [o.output_token_ids for o in outs]
        rows[name] = {"tok_s": sum(map(len, tokens[name])) / seconds,
                      "differing_from_plain": sum(a != b for a, b in zip(tokens[name], tokens["plain"]))}
        del llm
    best = max(("plain", "mtp1", "mtp8"), key=lambda n: rows[n]["tok_s"])
    return {"concurrency": concurrency, "num_prompts": num, "max_tokens": new, "rows": rows,
            "mtp8_over_mtp1": rows["mtp8"]["tok_s"] / rows["mtp1"]["tok_s"],
            "mtp8_over_plain": rows["mtp8"]["tok_s"] / rows["plain"]["tok_s"],
            "best_fixed": best, "auto_over_best": rows["auto"]["tok_s"] / rows[best]["tok_s"]}


def _throughput(llm, prompts, max_tokens) -> float:
    p = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    llm.generate(prompts[:1], SamplingParams(max_tokens=2))
    t0 = time.perf_counter()
    outs = llm.generate(prompts, p)
    return sum(len(o.output_token_ids) for o in outs) / (time.perf_counter() - t0)


def _copy_bandwidth(device, nbytes: int) -> float:
    """Bytes/s of a device-to-device copy (read + write), a practical memory-bandwidth estimate."""
    x = torch.empty(nbytes // 4, dtype=torch.float32, device=device)
    y = torch.empty_like(x)
    y.copy_(x)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    for _ in range(5):
        y.copy_(x)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return 5 * 2 * nbytes / (time.perf_counter() - t0)


def timing(model, device, dtype_name, quick: bool) -> dict:
    ks, sizes = ([0, 1, 2], [1, 4]) if quick else ([0, 1, 2, 4, 8], [1, 64])
    m, _ = load_pretrained(model, dtype=DTYPES[dtype_name], device=device)
    vocab = m.cfg.vocab_size
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(2, vocab, (64,), generator=g).tolist() for _ in range(max(sizes))]
    costs = [c for c in measure_step_costs(m, "mtp8", sizes, max(ks), rounds=4 if quick else 12,
                                           context_len=32 if quick else 64)
             if c["k"] in ks]
    new = 8 if quick else 64
    tput = {}
    for b in sizes:
        for spec in (None, "mtp8"):
            runner = LLM(model=m, spec=spec, max_num_seqs=b)
            tput[f"{spec or 'plain'}@{b}"] = _throughput(runner, prompts[:b], new)
    weight_bytes = sum(p.numel() * p.element_size() for p in m.parameters())
    bw = _copy_bandwidth(device, 64 << 20 if quick else 1 << 30)
    plain1 = next(c for c in costs if c["k"] == 0 and c["batch_size"] == 1)["step_ms"]
    floor_ms = 1e3 * weight_bytes / bw
    return {"step_costs": costs, "output_tokens_per_s": tput, "weight_bytes": weight_bytes,
            "copy_bandwidth_GBps": bw / 1e9, "decode_step_ms_batch1": plain1,
            "weight_bandwidth_floor_ms": floor_ms, "decode_over_floor": plain1 / floor_ms}


def check_compiled(model, device, dtype_name, quick: bool, backend: str) -> dict:
    """engine.compile vs eager (section 5). One eager and one compiled LLM per spec (plain, mtp8)
    at the largest batch, reused for every batch size (each engine compiles once)."""
    sizes = [1, 4] if quick else [1, 64]
    m, _ = load_pretrained(model, dtype=DTYPES[dtype_name], device=device)
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(2, m.cfg.vocab_size, (64,), generator=g).tolist() for _ in range(max(sizes))]
    new = 16 if quick else 96
    params = SamplingParams(max_tokens=new, ignore_eos=True)
    out, ok = {"rows": []}, True
    for spec in (None, "mtp8"):
        k = 0 if spec is None else m.cfg.num_nextn_predict_layers
        llms = {"eager": LLM(model=m, spec=spec, max_num_seqs=max(sizes)),
                "compiled": LLM(model=m, spec=spec, max_num_seqs=max(sizes), compile=True,
                                compile_backend=backend)}
        out[f"compile_{spec or 'plain'}"] = llms["compiled"].compile_stats
        # the same engine built again: its graphs load from the compile cache (a second run's start)
        t0 = time.perf_counter()
        again = LLM(model=m, spec=spec, max_num_seqs=max(sizes), compile=True, compile_backend=backend)
        out[f"compile_{spec or 'plain'}_again"] = {**again.compile_stats,
                                                   "built_s": round(time.perf_counter() - t0, 2)}
        del again
        for b in sizes:
            row = {"spec": spec or "plain", "batch_size": b}
            tokens = {}
            for name, llm in llms.items():
                llm.generate(prompts[:b], SamplingParams(max_tokens=4, ignore_eos=True))   # warm
                t0 = time.perf_counter()
                outs = llm.generate(prompts[:b], params)
                row[f"{name}_tok_s"] = sum(len(o.output_token_ids) for o in outs) / (time.perf_counter() - t0)
                tokens[name] = [o.output_token_ids for o in outs]
                cost = step_costs(llm.engine.step_timings, k).get(b)
                row[f"{name}_step_ms"] = None if cost is None else cost["step_ms"]
                row[f"{name}_draft_ms"] = None if cost is None else cost["draft_ms"]
            row["tokens_identical"] = tokens["eager"] == tokens["compiled"]
            ok &= row["tokens_identical"]
            out["rows"].append(row)
    out["ok"] = ok
    return out


def check_train_step(model, device, quick: bool) -> dict:
    """Section 6 of the module doc."""
    from mtpx.train import checkpoint as ckpt
    from mtpx.train.loop import build_optimizer, train_step
    from mtpx.train.losses import Objective

    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    base, _ = ckpt.load_model(model)
    vocab = base.cfg.vocab_size
    B, T = (2, 64) if quick else (16, 256)
    batch = torch.randint(0, vocab, (B, T), generator=torch.Generator().manual_seed(0))
    out = {"batch": [B, T]}
    ok = True
    for name, freeze in (("joint", False), ("frozen_target", True)):
        results = {}
        for dev in (torch.device("cpu"), device):
            m, _ = ckpt.load_model(model)
            m = m.to(dev).train()
            opt = build_optimizer(m, lr=1e-3, weight_decay=0.1, freeze_base=freeze)
            obj = Objective(m, mtp_loss_weight=0.3)
            stats = train_step(m, opt, batch.to(dev), lr=1e-3, grad_clip=1.0, mtp_loss_weight=0.3,
                               train_base=not freeze, objective=obj)
            results[dev.type] = (stats["loss"],
                                 {k: v.detach().float().cpu() for k, v in m.state_dict().items()})
        (l_cpu, w_cpu), (l_dev, w_dev) = results["cpu"], results[device.type]
        w_diff = max(float((w_cpu[k] - w_dev[k]).abs().max()) for k in w_cpu)
        rel = abs(l_cpu - l_dev) / abs(l_cpu)
        row_ok = rel < 1e-4 and w_diff < 1e-4
        ok &= row_ok
        out[name] = {"loss_cpu": l_cpu, "loss_device": l_dev, "loss_rel_diff": rel, "max_weight_diff": w_diff,
                     "ok": row_ok}
    speed = {}
    for label, dtype in (("float32", None), ("bfloat16_autocast", torch.bfloat16)):
        m, _ = ckpt.load_model(model)
        m = m.to(device).train()
        opt = build_optimizer(m, lr=1e-3, weight_decay=0.1, freeze_base=False)
        obj = Objective(m, mtp_loss_weight=0.3)
        b = batch.to(device)
        times = []
        for i in range(2 if quick else 6):
            _sync(device)
            t0 = time.perf_counter()
            with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
                train_step(m, opt, b, lr=1e-3, grad_clip=1.0, mtp_loss_weight=0.3, objective=obj)
            _sync(device)
            if i > 0:                                  # the first step allocates
                times.append(time.perf_counter() - t0)
        speed[label] = B * T / (sum(times) / len(times))
    out["train_tokens_per_s"] = speed
    out["ok"] = ok
    return out


def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _markdown(r: dict) -> str:
    lines = [f"# mtpx GPU check ({r['device']}, {r['dtype']}, {r['model']})", "", r["environment"], ""]
    for sec in ("attention", "gated_delta_rule", "engine_tokens", "tensor_parallel"):
        lines.append(f"- **{sec}**: {r[sec]}")
    t = r["timing"]
    lines += ["", "| k | batch | step ms |", "|---:|---:|---:|"]
    lines += [f"| {c['k']} | {c['batch_size']} | {c['step_ms']:.2f} |"
              for c in t["step_costs"]]
    lines += ["", "| run | output tok/s |", "|---|---:|"]
    lines += [f"| {k} | {v:.1f} |" for k, v in t["output_tokens_per_s"].items()]
    c = r["compiled"]
    fmt = lambda x: "-" if x is None else f"{x:.2f}"  # noqa: E731
    lines += ["", "engine.compile (" + ", ".join(
        f"{s}: built cold in {c[f'compile_{s}']['compile_s']:.1f} s ({c[f'compile_{s}']['num_graphs']} "
        f"graphs), again in {c[f'compile_{s}_again']['built_s']:.1f} s "
        f"({c[f'compile_{s}_again']['num_loaded']} loaded), mode {c[f'compile_{s}']['mode']}, "
        f"regions {c[f'compile_{s}']['regions']}" for s in ("plain", "mtp8")) + ")",
              "", "| run | batch | eager step ms | compiled step ms | eager draft ms | compiled draft ms | "
              "eager tok/s | compiled tok/s | tokens identical |",
              "|---|---:|---:|---:|---:|---:|---:|---:|:---:|"]
    lines += [f"| {x['spec']} | {x['batch_size']} | {fmt(x['eager_step_ms'])} | {fmt(x['compiled_step_ms'])} "
              f"| {fmt(x['eager_draft_ms'])} | {fmt(x['compiled_draft_ms'])} | {x['eager_tok_s']:.1f} | "
              f"{x['compiled_tok_s']:.1f} | {'yes' if x['tokens_identical'] else 'NO'} |" for x in c["rows"]]
    lines += ["", f"Decode step at batch 1: {t['decode_step_ms_batch1']:.3f} ms; weight-bandwidth floor "
              f"{t['weight_bandwidth_floor_ms']:.4f} ms ({t['weight_bytes'] / 1e6:.1f} MB of weights at "
              f"{t['copy_bandwidth_GBps']:.0f} GB/s copy bandwidth): "
              f"{t['decode_over_floor']:.1f}x the floor.", ""]
    ref = r["reference"]
    if "skipped" in ref:
        lines += [f"Reference comparison: skipped: {ref['skipped']}", ""]
    else:
        lines += [f"Reference comparison (GSM8K, {ref['num_prompts']} questions, concurrency "
                  f"{ref['concurrency']}, greedy, at most {ref['max_tokens']} tokens, eager): mtp8 / mtp1 "
                  f"{ref['mtp8_over_mtp1']:.2f}x, mtp8 / plain {ref['mtp8_over_plain']:.2f}x, "
                  f"auto / {ref['best_fixed']} {ref['auto_over_best']:.2f}x",
                  "", "| contender | output tok/s | requests differing from plain |", "|---|---:|---:|"]
        lines += [f"| {n} | {x['tok_s']:.1f} | {x['differing_from_plain']} |" for n, x in ref["rows"].items()]
        lines.append("")
    tr = r["training"]
    lines += [f"Training step ({tr['batch'][0]} x {tr['batch'][1]} tokens), device vs CPU float32:", "",
              "| objective | loss CPU | loss device | relative diff | max weight diff | ok |",
              "|---|---:|---:|---:|---:|:---:|"]
    lines += [f"| {n} | {tr[n]['loss_cpu']:.6f} | {tr[n]['loss_device']:.6f} | {tr[n]['loss_rel_diff']:.2e} "
              f"| {tr[n]['max_weight_diff']:.2e} | {'yes' if tr[n]['ok'] else 'NO'} |"
              for n in ("joint", "frozen_target")]
    lines += ["", "Training tokens/s on the device: " + ", ".join(
        f"{k} {v:,.0f}" for k, v in tr["train_tokens_per_s"].items()), ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--model", default="checkpoints/demo")
    ap.add_argument("--dtype", default=None, choices=sorted(DTYPES),
                    help="default: bfloat16 on CUDA, float32 on CPU")
    ap.add_argument("--quick", action="store_true", help="small sizes (a CPU smoke run)")
    ap.add_argument("--out", type=Path, default=Path("outputs/gpu_check"))
    ap.add_argument("--compile-backend", default="inductor",
                    help="torch.compile backend of section 5 (eager: a quick CPU smoke run)")
    args = ap.parse_args(argv)
    if not os.environ.get("MTPX_CACHE_DIR"):      # section 5's first builds are cold
        os.environ["MTPX_CACHE_DIR"] = tempfile.mkdtemp(prefix="mtpx_gpu_check_")
    device = torch.device(args.device)
    dtype_name = args.dtype or ("bfloat16" if device.type == "cuda" else "float32")
    dtype = DTYPES[dtype_name]
    t0 = time.perf_counter()
    env = (f"torch {torch.__version__}, python {platform.python_version()}, "
           + (torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"))
    prompts = [list(range(2 + i, 34 + i)) for i in range(4)]
    result = {"device": str(device), "dtype": dtype_name, "model": args.model, "environment": env,
              "attention": check_attention(device, dtype),
              "gated_delta_rule": check_gated_delta_rule(device, dtype),
              "engine_tokens": check_engine_tokens(args.model, device, dtype_name, prompts, 16),
              "timing": timing(args.model, device, dtype_name, args.quick),
              "compiled": check_compiled(args.model, device, dtype_name, args.quick, args.compile_backend),
              "training": check_train_step(args.model, device, args.quick),
              "tensor_parallel": check_tensor_parallel(args.model, device, dtype_name, prompts, 16),
              "reference": reference_comparison(args.model, device, dtype_name, args.quick)}
    result["seconds"] = time.perf_counter() - t0
    text = _markdown(result)
    print(text)
    atomic_write_text(args.out / "gpu_check.md", text)
    atomic_write_json(args.out / "gpu_check.json", result)
    failed = [s for s in ("attention", "gated_delta_rule", "engine_tokens", "compiled", "training",
                          "tensor_parallel")
              if result[s].get("ok") is False]
    if failed:
        print(f"gpu_check.py: FAILED: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
