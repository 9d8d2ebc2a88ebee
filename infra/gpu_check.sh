#!/usr/bin/env bash
# The CUDA paths in one go (<= 5 minutes on one GPU): our engine in bfloat16 on CUDA (and with
# flash-attention when the gpu extra is installed), the FSDP2 learner over NCCL (2 ranks when 2
# GPUs are visible), and one RL step end to end — all on a model built locally, nothing from a hub.
# Prints what passed. Usage: bash infra/gpu_check.sh   (creates .venv if absent, like the tests)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/infra/setup_env.sh"
cd "$root"
py="$root/.venv/bin/python"
echo "== device"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
"$py" - <<'PY'
import sys, torch
print(f"torch {torch.__version__}, CUDA build {torch.version.cuda}, devices {torch.cuda.device_count()}")
if not torch.cuda.is_available():
    sys.exit("no CUDA device visible: nothing to check (on a GPU machine, .venv needs a CUDA "
             "build of torch 2.13.0 from download.pytorch.org instead of the CPU wheel)")
PY
echo "== CUDA paths (tests/gpu)"
start=$(date +%s)
status=0
timeout 300 "$py" -m pytest tests/gpu -m gpu -v -rA -p no:cacheprovider || status=$?
echo "== done in $(( $(date +%s) - start )) s, pytest exit status $status"
exit "$status"
