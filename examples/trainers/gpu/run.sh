#!/usr/bin/env bash
# TRL's GRPOTrainer (its NeMo Gym rollout path, examples/trainers/trl/nemo_gym_grpo.py) trained on
# two polygym environments through `gym env start`, with vLLM (TRL's server mode) on ONE GPU shared
# with the trainer. Target: under 10 minutes on one H100 for a 0.5B model, no network.
# PREPARED, NOT RUN: no GPU machine was lent to the session that wrote it.
#
# Needs, already on the machine (nothing is downloaded): a Python with torch + CUDA, vllm (TRL
# 1.16's range: >=0.22,<=0.31), trl==1.16.*, and polygym's core dependencies; a Hugging Face model
# folder in MODEL_DIR (default /models/Qwen2.5-0.5B-Instruct).
# Usage: MODEL_DIR=/path/to/model bash examples/trainers/gpu/run.sh [OUTPUT_DIR]
# Prints, per batch, "rollouts: K of 32 contiguous and scored; failed: {...}", and TRL's log lines.
set -euo pipefail
cd "$(dirname "$0")/../../.."
OUT="${1:-results/trainers_gpu}"
MODEL_DIR="${MODEL_DIR:-/models/Qwen2.5-0.5B-Instruct}"
PY="${PYTHON:-python3}"
VLLM_PORT=8000
HEAD_PORT=11000   # TRL's default head port
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
mkdir -p "$OUT"

[ -f "$MODEL_DIR/config.json" ] || { echo "no model folder at MODEL_DIR=$MODEL_DIR (no network: it must be on the machine)"; exit 2; }
"$PY" -c "import torch, vllm, trl, polygym; assert torch.cuda.is_available(), 'no CUDA device'" \
    || { echo "missing a package above (or CUDA); install them on the machine first"; exit 2; }

# 1. the step-ordered file: every step holds 4 games and 4 questions
"$PY" -m polygym data blend --spec examples/trainers/gpu/blend.yaml --order steps --steps 12 --output "$OUT/steps.jsonl"

pids=()
cleanup() { for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT
wait_http() {  # URL SECONDS PID LOG
    local deadline=$((SECONDS + $2))
    until curl -sf "$1" > /dev/null; do
        kill -0 "$3" 2>/dev/null || { echo "exited before $1 answered; see $4"; tail -20 "$4"; exit 1; }
        [ "$SECONDS" -lt "$deadline" ] || { echo "$1 did not answer in $2 s; see $4"; exit 1; }
        sleep 2
    done
}

# 2. the policy: vLLM's OpenAI server with TRL's weight-transfer engine, a third of the GPU
VLLM_SERVER_DEV_MODE=1 "$PY" -m vllm.entrypoints.openai.api_server --model "$MODEL_DIR" \
    --host 127.0.0.1 --port "$VLLM_PORT" --served-model-name policy \
    --max-model-len 4096 --gpu-memory-utilization 0.3 --dtype bfloat16 \
    --weight-transfer-config '{"backend": "nccl"}' --logprobs-mode processed_logprobs --max-logprobs -1 \
    > "$OUT/vllm.log" 2>&1 &
pids+=($!)
wait_http "http://127.0.0.1:$VLLM_PORT/health" 300 "${pids[-1]}" "$OUT/vllm.log"

# 3. the stack: both environments behind vllm_model, token ids on, head on TRL's default port
"$PY" -m polygym env start --model-type vllm_model \
    --resources-server guess_number --resources-server mcqa --head-port "$HEAD_PORT" \
    "policy_base_url=http://127.0.0.1:$VLLM_PORT/v1" policy_api_key= policy_model_name=policy \
    policy_model.responses_api_models.vllm_model.return_token_ids=true \
    > "$OUT/stack.log" 2>&1 &
pids+=($!)
wait_http "http://127.0.0.1:$HEAD_PORT/global_config_dict_yaml" 120 "${pids[-1]}" "$OUT/stack.log"

# 4. TRL trains: 12 steps, weights pushed to vLLM before each generation batch
timeout 480 "$PY" examples/trainers/trl/nemo_gym_grpo.py --config examples/trainers/gpu/trl_config.yaml \
    --head-url "http://127.0.0.1:$HEAD_PORT" --model "$MODEL_DIR" --dataset "$OUT/steps.jsonl" \
    --output-dir "$OUT/trl" 2>&1 | tee "$OUT/train.log"
echo "contiguous and scored rollouts per batch:"; grep -c '^rollouts:' "$OUT/train.log"; grep '^rollouts:' "$OUT/train.log"
