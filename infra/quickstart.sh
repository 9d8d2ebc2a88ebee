#!/usr/bin/env bash
# The main job on embedded defaults: creates .venv if absent, then runs the quickstart experiment.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/infra/setup_env.sh"
cd "$root"
exec "$root/.venv/bin/asyncrl" run experiments/quickstart.yaml "$@"
