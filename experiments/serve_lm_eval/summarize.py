"""The results table of experiments/serve_lm_eval (run.sh writes its inputs): both scorers on GSM8K
test and train, and how many texts lm-eval got through the server equal mtpx's in-process ones.

    python experiments/serve_lm_eval/summarize.py   -> results.md
"""
import glob
import json
from pathlib import Path
out = Path("experiments/serve_lm_eval")
lines = ["| problems | lm-eval strict-match (#### answer) | lm-eval flexible-extract (last number) | "
         "mtpx eval (#### answer, else the last number) | texts identical (lm-eval's, cut at its stop "
         "string, vs mtpx's) |",
         "|---|---:|---:|---:|---:|"]
for task, suffix, label in (("gsm8k_local", "", "GSM8K test, first 50"),
                            ("gsm8k_local_train", "_train", "GSM8K train, first 200")):
    res = json.loads(Path(sorted(glob.glob(str(out / f"lm_eval{suffix}/**/results_*.json"),
                                           recursive=True))[-1]).read_text())
    r = res["results"][task]
    m = json.loads((out / f"mtpx_eval{suffix}/metrics.json").read_text())
    samples = [json.loads(x) for f in glob.glob(str(out / f"lm_eval{suffix}/**/samples_{task}_*.jsonl"),
                                                recursive=True)
               for x in open(f)]
    samples = [x for x in samples if x["filter"] == "strict-match"]   # one row per problem and filter
    mine = {json.loads(x)["index"]: json.loads(x)["text"]
            for x in open(out / f"mtpx_eval{suffix}/outputs.jsonl")}
    same = sum(s["resps"][0][0] == mine[s["doc_id"]].split("Question:")[0] for s in samples)
    lines.append(f"| {label} | {r['exact_match,strict-match']:.3f} | {r['exact_match,flexible-extract']:.3f} "
                 f"| {m['accuracy']:.3f} ({m['num_correct']}) | {same}/{len(samples)} |")
(out / "results.md").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
