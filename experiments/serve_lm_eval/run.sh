#!/usr/bin/env bash
# lm-evaluation-harness (pip install "lm-eval[api]") against mode=serve: GSM8K test, the first 50
# problems and GSM8K train, the first 200, through lm-eval's local-completions client; then mtpx's
# own eval on the same prompts, for the two scorers side by side. Run from anywhere; about 5 minutes on 2 cores.
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
run_split() {  # TASK SPLIT LIMIT SUFFIX: lm-eval through the server, then mtpx's eval on the same prompts
  lm_eval --model local-completions \
    --model_args "model=demo,base_url=http://127.0.0.1:$PORT/v1/completions,num_concurrent=8,tokenized_requests=False,tokenizer_backend=None,max_retries=1" \
    --tasks $1 --include_path $OUT --limit $3 --output_path $OUT/lm_eval$4 --log_samples
  python train_or_eval.py data=gsm8k data.path='${data_dir}'/gsm8k/$2.jsonl eval.num_prompts=$3 eval.max_tokens=256 \
    eval.concurrency=8 eval.threads=1 +spec=mtp8 logger=none hydra.run.dir=$OUT/mtpx_eval$4 > /dev/null
}
run_split gsm8k_local test 50 ""
run_split gsm8k_local_train train 200 _train
python experiments/serve_lm_eval/summarize.py
