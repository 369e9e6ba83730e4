#!/usr/bin/env bash
# The GPU recipe of README.md (this folder): vLLM on GPU 0 fed the trainer's weights by TRL's server
# mode, the trainer on GPU 1, one-step off-policy. NOT RUN YET: no GPU machine was available.
# Usage: bash examples/train_grpo_vllm/run.sh [OUTPUT_DIR] [extra gym train run flags...]
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT="${1:-results/train_grpo_vllm}"
shift || true
MODEL_DIR=models/qwen2.5-1.5b-instruct
PORT=8000

.venv/bin/python -m pip install --quiet -e '.[train]' 'vllm>=0.22.0,<=0.31.0'   # TRL 1.16's vllm range
.venv/bin/python examples/train_grpo/make_data.py
[ -d "$MODEL_DIR" ] || .venv/bin/hf download Qwen/Qwen2.5-1.5B-Instruct --local-dir "$MODEL_DIR"

# 1. the policy server: vLLM's OpenAI server with TRL's weight-transfer engine (what `trl vllm-serve` runs)
CUDA_VISIBLE_DEVICES=0 VLLM_SERVER_DEV_MODE=1 .venv/bin/vllm serve "$MODEL_DIR" \
    --host 127.0.0.1 --port "$PORT" --served-model-name policy \
    --max-model-len 4096 --gpu-memory-utilization 0.9 --dtype bfloat16 \
    --weight-transfer-config '{"backend": "nccl"}' --logprobs-mode processed_logprobs --max-logprobs -1 \
    --enable-auto-tool-choice --tool-call-parser hermes > "$OUT.vllm.log" 2>&1 &
VLLM_PID=$!
trap 'kill "$VLLM_PID"' EXIT
deadline=$((SECONDS + 900))
until curl -sf "http://127.0.0.1:$PORT/health" > /dev/null; do
    [ "$SECONDS" -lt "$deadline" ] || { echo "vLLM did not come up; see $OUT.vllm.log"; exit 1; }
    kill -0 "$VLLM_PID" || { echo "vLLM exited; see $OUT.vllm.log"; exit 1; }
    sleep 5
done

# 2. training on GPU 1: TRL pushes the weights to vLLM before each step; step N+1 is collected
#    while step N trains, corrected by truncated importance sampling
CUDA_VISIBLE_DEVICES=1 .venv/bin/gym train run examples/train_grpo_vllm/blend.yaml \
    --config examples/train_grpo/stack.yaml \
    --model "$MODEL_DIR" \
    --vllm-server "http://127.0.0.1:$PORT" \
    --output "$OUT" \
    --steps 100 \
    --learning-rate 1e-6 \
    --temperature 1.0 \
    --max-output-tokens 256 \
    --concurrency 256 \
    --off-policy --max-staleness 1 --on-stale refuse --is-cap 2 \
    --validate-every 10 --validation-limit 64 \
    --max-regression reasoning_gym=0.05 --max-regression guess_number=0.05 \
    "$@"
