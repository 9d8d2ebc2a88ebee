#!/usr/bin/env bash
# Create the project's virtualenv (.venv) if it is absent or stale, from the pinned lock file.
# CPU only: torch is pinned to the 2.13.0 CPU wheel; GPU packages live in the `gpu` extra.
# Usage: bash infra/setup_env.sh   (the two README commands call it)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/.venv"
lock="$root/infra/requirements.lock"
stamp="$venv/.asyncrl-lock.sha256"
want="$(cat "$lock" "$root/pyproject.toml" | sha256sum | cut -d' ' -f1)"

if [ -x "$venv/bin/asyncrl" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi

python="${PYTHON:-}"
if [ -z "$python" ]; then
  for candidate in python3.11 python3.12 python3; do
    if command -v "$candidate" >/dev/null && "$candidate" -c 'import sys; sys.exit(not (3, 11) <= sys.version_info[:2] <= (3, 12))'; then
      python="$candidate"; break
    fi
  done
fi
[ -n "$python" ] || { echo "asyncrl needs Python 3.11 or 3.12 (set PYTHON=...)" >&2; exit 1; }

echo "[asyncrl] creating $venv with $($python --version) (about 2-3 minutes)..." >&2
start=$(date +%s)
[ -d "$venv" ] || "$python" -m venv "$venv"
pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)
# torch first and alone, so nothing can pull a CUDA build in as a dependency.
"${pip[@]}" install "torch==2.13.0" 2>&1 | grep -v "is ignored: it is neither" || true
"${pip[@]}" install -r "$lock" 2>&1 | grep -v "is ignored: it is neither" || true
"${pip[@]}" install --no-deps -e "$root" 2>&1 | grep -v "is ignored: it is neither" || true
"$venv/bin/python" -c 'import torch, asyncio; assert torch.__version__.startswith("2.13.0"), torch.__version__' 
"$venv/bin/asyncrl" --help >/dev/null
echo "$want" > "$stamp"
echo "[asyncrl] environment ready in $(( $(date +%s) - start )) s" >&2
