"""Structured output on the demo checkpoint (experiments/structured_output): validity, acceptance
and cost.

1. Validity: constrained requests (JSON schemas, regexes, choices, an EBNF grammar in turn)
   through a live mode=serve app, /v1/completions, streamed and not, at concurrency 1 and 16,
   under mtp8 and automatic k; every output is parsed or matched.
2. Acceptance and cost: the same prompts through LLM.generate with and without a JSON-schema
   constraint, at concurrency 1 and 16: output tok/s, acceptance length, per-position
   acceptance, and the grammar mask's host time per step; --compare adds each request's mean TTFT
   (its prefill, first token and first draft round) and TPOT (ms per output token after the first:
   the decode steps alone).

    python tools/bench_structured.py --requests 200 --out /tmp/structured
    /work/bench1 python tools/bench_structured.py --compare 16 --acceptance-requests 16 --compile

3. --compare C: the cost of a JSON-schema constraint against unconstrained decoding of the same
   prompts at concurrency C, contenders alternated on one engine (compare(); --contenders picks
   them from CONTENDERS: with drafts under the grammar mask, with disable_any_whitespace, with
   unmasked drafts).

Runs eager on the CPU (engine.compile off); --compile compiles the decode step.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from mtpx import LLM, SamplingParams, StructuredOutputsParams  # noqa: E402

PROMPTS = ["def parse(text):", "import os\n", "class Config:", "# compute the total\n", "for i in range(",
           "    return self.", "if __name__ == '__main__':", "with open(path) as f:", "x = {", "try:\n"]
SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 12}, "count": {"type": "integer", "minimum": 0, "maximum": 9999},
    "flags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3},
    "ok": {"type": "boolean"}}, "required": ["name", "count", "flags", "ok"], "additionalProperties": False}
SCHEMA2 = {"type": "object", "properties": {"x": {"type": "number", "minimum": -100, "maximum": 100},
                                            "unit": {"enum": ["m", "s", "kg"]}}, "required": ["x", "unit"]}
REGEX = r"[a-z_]{1,10}\(([a-z]{1,6}(, [a-z]{1,6}){0,2})?\)"
CHOICES = ["True", "False", "None", "return self"]
GRAMMAR = 'root ::= expr\nexpr ::= term (("+" | "-") term){0,3}\nterm ::= [0-9]{1,3} | "(" expr ")"'


def constraints():
    """(name, request fields, check(text) -> bool), in turn."""
    def json_ok(schema_keys):
        def ok(t):
            try:
                x = json.loads(t)
            except ValueError:
                return False
            return isinstance(x, dict) and set(schema_keys) <= set(x)
        return ok
    paren = re.compile(r"[0-9]{1,3}|\(.*\)")
    return [
        ("json_schema", {"guided_json": SCHEMA}, json_ok(SCHEMA["required"])),
        ("regex", {"guided_regex": REGEX}, lambda t: re.fullmatch(REGEX, t) is not None),
        ("choice", {"guided_choice": CHOICES}, lambda t: t in CHOICES),
        ("grammar", {"guided_grammar": GRAMMAR},
         lambda t: re.fullmatch(r"[0-9()+\-]+", t) is not None and t.count("(") == t.count(")")
         and paren.search(t) is not None),
        ("json_schema_2", {"response_format": {"type": "json_schema", "json_schema": {"name": "m",
                                                                                      "schema": SCHEMA2}}},
         json_ok(SCHEMA2["required"])),
    ]


def _serve(llm):
    import uvicorn

    import socket

    from mtpx.serve.app import build_app
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    srv = uvicorn.Server(uvicorn.Config(build_app(llm, "demo"), host="127.0.0.1", port=port,
                                        log_level="warning"))
    threading.Thread(target=srv.run, daemon=True).start()
    t0 = time.time()
    while not srv.started:
        if time.time() - t0 > 120:
            raise SystemExit("the server did not start in 120 s")
        time.sleep(0.05)
    return srv, f"http://127.0.0.1:{port}"


def _request(url: str, i: int, stream: bool, max_tokens: int):
    name, fields, ok = constraints()[i % len(constraints())]
    body = {"prompt": PROMPTS[i % len(PROMPTS)], "max_tokens": max_tokens, "temperature": 0, "stream": stream,
            **fields}
    r = httpx.post(f"{url}/v1/completions", json=body, timeout=600)
    if r.status_code != 200:
        return name, False, f"HTTP {r.status_code}: {r.text[:200]}"
    if stream:
        events = [json.loads(line[6:]) for line in r.text.split("\n\n") if line.startswith("data: {")]
        text = "".join(e["choices"][0]["text"] for e in events if e.get("choices"))
    else:
        text = r.json()["choices"][0]["text"]
    return name, ok(text), text


def validity(spec_k, n: int, max_tokens: int, compile_: bool) -> list[dict]:
    """n requests through a live server per (spec, k): concurrency 1 and 16, streamed and not."""
    rows = []
    per_cell = {(1, False): n // 10, (1, True): n // 10, (16, False): 4 * n // 10, (16, True): 4 * n // 10}
    for spec, k in spec_k:
        llm = LLM("checkpoints/demo", spec=spec, num_speculative_tokens=k, max_num_seqs=16, compile=compile_)
        srv, url = _serve(llm)
        for (conc, stream), count in per_cell.items():
            t0 = time.perf_counter()
            with ThreadPoolExecutor(conc) as pool:
                results = list(pool.map(_request, [url] * count, range(count), [stream] * count,
                                        [max_tokens] * count))
            bad = [(name, text) for name, good, text in results if not good]
            rows.append({"spec": spec, "k": k, "concurrency": conc, "stream": stream, "requests": count,
                         "valid": count - len(bad), "seconds": round(time.perf_counter() - t0, 1),
                         "invalid_examples": bad[:3]})
            print(json.dumps(rows[-1]), flush=True)
        srv.should_exit = True
    return rows


def acceptance(spec: str, k, n: int, max_tokens: int, compile_: bool) -> list[dict]:
    """The same n prompts with and without the JSON-schema constraint, concurrency 1 and 16."""
    rows = []
    for conc in (1, 16):
        llm = LLM("checkpoints/demo", spec=spec, num_speculative_tokens=k, max_num_seqs=conc,
                  compile=compile_)
        for constrained in (False, True):
            so = StructuredOutputsParams(json=SCHEMA) if constrained else None
            sp = SamplingParams(max_tokens=max_tokens, structured_outputs=so)
            prompts = [PROMPTS[i % len(PROMPTS)] for i in range(n if conc == 16 else max(1, n // 4))]
            llm.generate(prompts[:1], sp, use_tqdm=False)                       # warm-up, grammar compiled
            masks = llm.engine.runner.grammars
            m0 = (masks.seconds, masks.num_masked) if masks else (0.0, 0)
            steps0 = llm.engine.num_steps
            t0 = time.perf_counter()
            outs = llm.generate(prompts, sp, use_tqdm=False)
            seconds = time.perf_counter() - t0
            masks = llm.engine.runner.grammars
            mask_s = (masks.seconds - m0[0]) if masks else 0.0
            tokens = sum(len(o.outputs[0].token_ids) for o in outs)
            drafts = sum(o.spec.num_drafts for o in outs)
            accepted = sum(o.spec.num_accepted_tokens for o in outs)
            per_pos = [sum(o.spec.accepted_per_position[i] for o in outs) / max(drafts, 1)
                       for i in range(len(outs[0].spec.accepted_per_position))]
            valid = sum(1 for o in outs if o.outputs[0].finish_reason == "stop"
                        and constraints()[0][2](o.outputs[0].text)) if constrained else None
            steps = llm.engine.num_steps - steps0
            rows.append({"spec": spec, "k": k, "concurrency": conc, "constrained": constrained,
                         "requests": len(prompts), "output_tokens": tokens,
                         "tok_s": round(tokens / seconds, 1),
            "acceptance_length": round(1 + accepted / max(drafts, 1), 3),
                         "per_position": [round(x, 3) for x in per_pos], "valid": valid,
                         "mask_ms_per_step": round(1000 * mask_s / max(steps, 1), 3),
                         "mask_share": round(mask_s / seconds, 4)})
            print(json.dumps(rows[-1]), flush=True)
    return rows


# name: (JSON-schema constraint (None, "json", "compact": disable_any_whitespace),
#        engine.structured_outputs_mask_drafts)
CONTENDERS = {"none": (None, True), "json_masked_drafts": ("json", True),
              "json_compact": ("compact", True), "json_unmasked_drafts": ("json", False)}


def _measure(llm, prompts, sp) -> dict:
    """One generate of `prompts`: tok/s, acceptance length and per-position acceptance, the
    grammar masks' host time per step (target columns, and drafts)."""
    masks, engine = llm.engine.runner.grammars, llm.engine
    m0, d0, steps0 = masks.seconds, masks.draft_seconds, engine.num_steps
    f0, fd0, r0 = masks.num_filled, masks.num_draft_filled, masks.num_reused
    t0 = time.perf_counter()
    outs = llm.generate(prompts, sp, use_tqdm=False)
    seconds = time.perf_counter() - t0
    steps = max(engine.num_steps - steps0, 1)
    drafts = sum(o.spec.num_drafts for o in outs)
    accepted = sum(o.spec.num_accepted_tokens for o in outs)
    width = max(len(o.spec.accepted_per_position) for o in outs)
    per_pos = [sum(o.spec.accepted_per_position[i] for o in outs if i < len(o.spec.accepted_per_position))
               / max(drafts, 1) for i in range(width)]
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    # per request: TTFT (prefill, first token, first draft round) and TPOT (the decode steps alone)
    ttft = [o.first_token_time - o.arrival_time for o in outs]
    tpot = [(o.finish_time - o.first_token_time) / (len(o.outputs[0].token_ids) - 1)
            for o in outs if len(o.outputs[0].token_ids) > 1]
    valid = None
    if sp.structured_outputs is not None:
        ok = constraints()[0][2]
        valid = sum(o.outputs[0].finish_reason == "stop" and ok(o.outputs[0].text) for o in outs)
    return {"output_tokens": tokens, "seconds": round(seconds, 3), "tok_s": round(tokens / seconds, 2),
            "ttft_ms": round(1000 * sum(ttft) / len(ttft), 2),
            "tpot_ms": round(1000 * sum(tpot) / max(len(tpot), 1), 3),
            "acceptance_length": round(1 + accepted / max(drafts, 1), 3),
            "per_position": [round(x, 3) for x in per_pos], "valid": valid,
            "mask_ms_per_step": round(1000 * (masks.seconds - m0) / steps, 3),
            "draft_mask_ms_per_step": round(1000 * (masks.draft_seconds - d0) / steps, 3),
            "fills_per_step": round((masks.num_filled - f0 + masks.num_draft_filled - fd0) / steps, 2),
            "reused_per_step": round((masks.num_reused - r0) / steps, 2)}


def compare(spec: str, k, conc: int, n: int, max_tokens: int, repeats: int, compile_: bool,
            contenders=tuple(CONTENDERS)) -> list[dict]:
    """The same n prompts through each of `contenders` (CONTENDERS: unconstrained, the JSON
    schema with drafts under the mask, with disable_any_whitespace, or with unmasked drafts:
    engine.structured_outputs_mask_drafts toggled on one engine), alternated `repeats` times;
    one LLM with max_num_seqs=conc."""
    llm = LLM("checkpoints/demo", spec=spec, num_speculative_tokens=k, max_num_seqs=conc, compile=compile_)
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(n)]
    params = {c: SamplingParams(max_tokens=max_tokens, structured_outputs=None if so is None else
                                StructuredOutputsParams(json=SCHEMA, disable_any_whitespace=so == "compact"))
              for c, (so, _) in CONTENDERS.items() if c in contenders}
    config = llm.engine.runner.config
    for name, (_, mask) in CONTENDERS.items():                      # warm-up: graphs, grammar compiled
        if name not in contenders:
            continue
        config.structured_outputs_mask_drafts = mask
        llm.generate(prompts[:conc], params[name], use_tqdm=False)
    rows = []
    for rep in range(repeats):
        for name in contenders:
            config.structured_outputs_mask_drafts = CONTENDERS[name][1]
            rows.append({"spec": spec, "k": k, "concurrency": conc, "contender": name, "repeat": rep,
                         "requests": n, **_measure(llm, prompts, params[name])})
            print(json.dumps(rows[-1]), flush=True)
    for name in contenders:
        mine = [r for r in rows if r["contender"] == name]
        tps = sorted(r["tok_s"] for r in mine)
        tpot, ttft = (sorted(r[key] for r in mine) for key in ("tpot_ms", "ttft_ms"))
        print(f"{name:22s} conc {conc}: tok/s median {tps[len(tps) // 2]:.2f} (min {tps[0]:.2f}, max "
              f"{tps[-1]:.2f}); TPOT ms median {tpot[len(tpot) // 2]:.3f} ({tpot[0]:.3f}-{tpot[-1]:.3f}); "
              f"TTFT ms median {ttft[len(ttft) // 2]:.2f}; acceptance length {mine[-1]['acceptance_length']}",
              flush=True)
    return rows


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=200, help="validity requests in all (half per spec)")
    ap.add_argument("--max-tokens", type=int, default=160)
    ap.add_argument("--acceptance-requests", type=int, default=16)
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--skip-validity", action="store_true")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--compare", type=int, metavar="CONCURRENCY",
                    help="only the cost comparison (compare()) at this concurrency")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--spec", default="mtp8")
    ap.add_argument("--k", default="8")
    ap.add_argument("--contenders", default="none,json_masked_drafts,json_compact",
                    help=f"--compare's contenders, comma-separated, of {', '.join(CONTENDERS)}")
    a = ap.parse_args(argv)
    if a.compare:
        k = a.k if a.k == "auto" else int(a.k)
        rows = compare(a.spec, k, a.compare, a.acceptance_requests, a.max_tokens, a.repeats, a.compile,
                       tuple(a.contenders.split(",")))
        save({"compare": rows}, a.out)
        return
    out = {"acceptance": acceptance("mtp8", 8, a.acceptance_requests, a.max_tokens, a.compile),
           "validity": []}
    for spec_k in ([] if a.skip_validity else [("mtp8", 8), ("mtp8", "auto")]):
        save(out, a.out)
        out["validity"] += validity([spec_k], a.requests // 2, a.max_tokens, a.compile)
    v = out["validity"]
    if v:
        print(f"valid: {sum(r['valid'] for r in v)} of {sum(r['requests'] for r in v)}")
    save(out, a.out)


def save(out: dict, path: Path | None) -> None:
    if path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
