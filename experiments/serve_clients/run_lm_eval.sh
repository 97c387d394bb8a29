#!/usr/bin/env bash
# lm-eval's local-completions client against a running `mode=serve` (+spec=mtp8, the demo) on $PORT:
# a 4-way multiple-choice task (loglikelihood, --limit 40) and GSM8K generate_until (--limit 50),
# once with tokenizer_backend=auto (the server's /tokenizer_info and /tokenize) and once with
# tokenizer=checkpoints/demo (transformers' AutoTokenizer); then the loglikelihoods against the
# server's own echo + logprobs scoring. Needs GSM8K_DIR (the folder of GSM8K's test.jsonl and
# train.jsonl) and LM_EVAL (the lm_eval executable). Run from the repository root.
set -euo pipefail
OUT=experiments/serve_clients/lm_eval
TASKS=$(mktemp -d)
for f in experiments/serve_clients/tasks/*.yaml.in; do
  sed "s#@GSM8K_DIR@#$GSM8K_DIR#g" "$f" > "$TASKS/$(basename "${f%.in}")"
done
cp experiments/serve_clients/tasks/utils.py "$TASKS/"
URL=http://127.0.0.1:$PORT/v1/completions
for variant in auto hf; do
  if [ $variant = auto ]; then TOK="tokenizer_backend=auto"; else TOK="tokenizer_backend=huggingface,tokenizer=$PWD/checkpoints/demo"; fi
  ARGS="model=demo,base_url=$URL,num_concurrent=8,max_retries=1,$TOK"
  # scoring one request at a time: each is computed alone, as the server's own scoring below is, so
  # float32 sums do not depend on what else shares the batch and equal values are bit-identical
  $LM_EVAL --model local-completions --model_args "${ARGS/num_concurrent=8/num_concurrent=1}" --tasks gsm8k_mc_local --include_path "$TASKS" \
    --limit 40 --output_path $OUT/$variant/mc --log_samples 2>&1 | tee $OUT/$variant/mc.log | tail -8
  $LM_EVAL --model local-completions --model_args "$ARGS" --tasks gsm8k_gen_local --include_path "$TASKS" \
    --limit 50 --output_path $OUT/$variant/gen --log_samples 2>&1 | tee $OUT/$variant/gen.log | tail -8
done
for variant in auto hf; do
  python experiments/serve_clients/compare_loglikelihoods.py http://127.0.0.1:$PORT \
    $(find $OUT/$variant/mc -name 'samples_*.jsonl') | tee $OUT/$variant/loglikelihoods.txt
done
