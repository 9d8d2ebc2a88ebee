#!/usr/bin/env bash
# The test suite: creates .venv if absent, then runs pytest (extra args are passed through).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/infra/setup_env.sh"
cd "$root"
exec "$root/.venv/bin/python" -m pytest "$@"
