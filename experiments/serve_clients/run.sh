#!/usr/bin/env bash
# Real clients against `mode=serve` (+spec=mtp8 on the demo, eager, 1 thread): guidellm (concurrent
# and sweep profiles, TTFT / ITL against /metrics), lm-eval local-completions (run_lm_eval.sh),
# AIPerf; then SIGTERM, whose exit status is recorded. The clients live in their own environment
# (CLIENTS: a virtualenv with `pip install guidellm "lm-eval[api]" aiperf`; see README.md).
# Needs GSM8K_DIR (GSM8K's test.jsonl and train.jsonl). Run from anywhere; about 10 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=experiments/serve_clients
export PORT=${PORT:-8137} OMP_NUM_THREADS=1 PYTHONPATH=$PWD
: "${CLIENTS:?set CLIENTS to the clients virtualenv}" "${GSM8K_DIR:?set GSM8K_DIR}"
python train_or_eval.py +spec=mtp8 mode=serve engine.compile=false serve.port=$PORT serve.threads=1 logger=none \
  hydra.run.dir=/tmp/mtpx_serve_clients > $OUT/server.log 2>&1 &
SERVER=$!
for i in $(seq 1 120); do curl -sf http://127.0.0.1:$PORT/health >/dev/null && break; sleep 1; done

mkdir -p $OUT/guidellm
for p in concurrent sweep; do
  if [ $p = concurrent ]; then profile=kind=concurrent,streams=4; else profile=kind=sweep,sweep_size=3; fi
  curl -s http://127.0.0.1:$PORT/metrics > $OUT/guidellm/metrics_before_$p.txt
  $CLIENTS/bin/guidellm run --backend kind=openai_http,target=http://127.0.0.1:$PORT,model=demo,request_format=/v1/completions \
    --profile $profile --constraint kind=max_requests,count=20 \
    --data kind=synthetic_text,prompt_tokens=64,output_tokens=32 \
    --tokenizer kind=huggingface_auto,model=$PWD/checkpoints/demo \
    --output kind=json,path=$OUT/guidellm/$p.json --output kind=console --disable-progress > $OUT/guidellm/$p.log 2>&1
  curl -s http://127.0.0.1:$PORT/metrics > $OUT/guidellm/metrics_after_$p.txt
  python $OUT/compare_metrics.py $OUT/guidellm/metrics_before_$p.txt $OUT/guidellm/metrics_after_$p.txt \
    $OUT/guidellm/$p.json | tee $OUT/guidellm/compare_$p.md
done

mkdir -p $OUT/lm_eval/auto $OUT/lm_eval/hf
LM_EVAL=$CLIENTS/bin/lm_eval bash $OUT/run_lm_eval.sh

rm -rf $OUT/aiperf
$CLIENTS/bin/aiperf profile --model demo --url http://127.0.0.1:$PORT --endpoint-type completions --streaming \
  --tokenizer $PWD/checkpoints/demo --isl 64 --osl 32 --concurrency 4 --request-count 24 \
  --artifact-dir $OUT/aiperf --ui-type none > $OUT/aiperf.log 2>&1
tail -30 $OUT/aiperf.log

kill -TERM $SERVER
set +e
wait $SERVER
echo "server exit status $? after SIGTERM" | tee -a $OUT/server.log
