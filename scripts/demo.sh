#!/usr/bin/env bash
# Set up the minimum (core + reference backend) in .venv and run the main job: pick, run and verify
# a GQA causal attention backward on this machine. Extra arguments go to `attn-dispatch demo`.
# Set-up options (PYTHON, ATTN_DISPATCH_SYSTEM_SITE=1, TORCH_INDEX_URL): see scripts/setup.sh.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh --minimal
exec .venv/bin/python -m attn_dispatch demo "$@"
