#!/usr/bin/env bash
# lm-evaluation-harness (pip install "lm-eval[api]") against mode=serve: GSM8K test, the first 50
# problems, through lm-eval's local-completions client; then mtpx's own eval on the same 50
# prompts, for the two scorers side by side. Run from anywhere; about 5 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=experiments/serve_lm_eval
PORT=8124
export OMP_NUM_THREADS=1
python train_or_eval.py mode=serve +spec=mtp8 serve.port=$PORT serve.threads=1 logger=none \
  hydra.run.dir=/tmp/mtpx_lm_eval/server > /tmp/mtpx_lm_eval_server.log 2>&1 &
SERVER=$!
trap 'kill -INT $SERVER 2>/dev/null || true' EXIT
for i in $(seq 1 120); do curl -sf http://127.0.0.1:$PORT/health >/dev/null && break; sleep 1; done
lm_eval --model local-completions \
  --model_args "model=demo,base_url=http://127.0.0.1:$PORT/v1/completions,num_concurrent=8,tokenized_requests=False,tokenizer_backend=None,max_retries=1" \
  --tasks gsm8k_local --include_path $OUT --limit 50 --output_path $OUT/lm_eval --log_samples
python train_or_eval.py data=gsm8k eval.num_prompts=50 eval.max_tokens=256 eval.concurrency=8 eval.threads=1 \
  +spec=mtp8 logger=none hydra.run.dir=$OUT/mtpx_eval > /dev/null
python - <<'PY'
import glob, json
from pathlib import Path
out = Path("experiments/serve_lm_eval")
res = json.loads(Path(sorted(glob.glob(str(out / "lm_eval/**/results_*.json"), recursive=True))[-1]).read_text())
r = res["results"]["gsm8k_local"]
m = json.loads((out / "mtpx_eval/metrics.json").read_text())
lines = ["| scorer | exact match on the first 50 GSM8K test problems |", "|---|---:|",
         f"| lm-eval strict-match (#### answer) | {r['exact_match,strict-match']:.3f} |",
         f"| lm-eval flexible-extract (last number) | {r['exact_match,flexible-extract']:.3f} |",
         f"| mtpx eval (mtpx.data.gsm8k: #### answer, else the last number) | {m['accuracy']:.3f} |"]
(out / "results.md").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
PY
