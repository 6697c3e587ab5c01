#!/usr/bin/env bash
# Set up the minimum (core + reference backend) and run the main job: pick, run and verify a GQA
# causal attention backward on this machine. Extra arguments go to `attn-dispatch demo`.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh --minimal
exec "${PYTHON:-python3}" -m attn_dispatch demo "$@"
