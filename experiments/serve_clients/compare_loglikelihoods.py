"""lm-eval's loglikelihoods (from its --log_samples files) against the server's own echo + logprobs
scoring of the same (context, continuation) pairs, tokenized by mtpx.

Usage: python compare_loglikelihoods.py BASE_URL SAMPLES.jsonl [SAMPLES.jsonl ...]
For each pair the context and continuation are split as lm-eval does (trailing spaces of the
context move to the continuation; continuation ids = ids(context + continuation) after the ids of
the context), encoded with the tokenizer of checkpoints/demo (mtpx's), sent as token ids with
echo=true, logprobs=0, max_tokens=1, and the continuation tokens' logprobs summed. Prints the
number of pairs, the largest |difference| and how many differ at all.
"""
import json
import sys
from pathlib import Path

import httpx

from mtpx.hf.loader import load_folder_tokenizer

ROOT = Path(__file__).resolve().parents[2]


def split(tok, context: str, continuation: str) -> tuple[list[int], list[int]]:
    n = len(context) - len(context.rstrip())
    if n:
        context, continuation = context[:-n], context[-n:] + continuation
    whole = tok.encode(context + continuation).ids
    ctx = tok.encode(context).ids
    return ctx, whole[len(ctx):]


def main(base_url: str, *paths: str) -> None:
    tok = load_folder_tokenizer(ROOT / "checkpoints" / "demo")
    pairs, theirs = [], []
    for path in paths:
        for line in open(path):
            doc = json.loads(line)
            args_list = doc["arguments"]
            if isinstance(args_list, dict):       # lm-eval 0.4.13: {"gen_args_0": {"arg_0", "arg_1"}, ...}
                args_list = [args_list[k] for k in sorted(args_list, key=lambda k: int(k.rsplit("_", 1)[1]))]
            for args, resp in zip(args_list, doc["resps"]):
                pairs.append((args["arg_0"], args["arg_1"]))
                theirs.append(float(resp[0][0]))     # logged as the str of a float
    ours = []
    with httpx.Client(timeout=120) as client:
        for context, continuation in pairs:
            ctx, cont = split(tok, context, continuation)
            r = client.post(f"{base_url}/v1/completions",
                            json={"model": "demo", "prompt": ctx + cont, "echo": True,
                                   "logprobs": 0, "max_tokens": 1, "temperature": 0})
            lps = r.json()["choices"][0]["logprobs"]["token_logprobs"]
            ours.append(sum(lps[len(ctx): len(ctx) + len(cont)]))
    diffs = [abs(a - b) for a, b in zip(theirs, ours)]
    print(f"{len(pairs)} (context, continuation) pairs; max |lm-eval - server| = {max(diffs):.3g}; "
          f"{sum(d > 0 for d in diffs)} differ at all; {sum(d > 1e-4 for d in diffs)} differ by > 1e-4")


if __name__ == "__main__":
    main(*sys.argv[1:])
