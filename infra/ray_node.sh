#!/usr/bin/env bash
# Start a Ray node for asyncrl runs, with the project's Python environment (created if absent).
# A node needs this environment only: a run ships its code to the cluster (runtime_env).
#
#   bash infra/ray_node.sh head   [--resources '{"inference": 1}'] [other `ray start` flags]
#   bash infra/ray_node.sh worker HEAD:6379 [--resources '{"training": 1}'] [flags]
#   bash infra/ray_node.sh stop
#
# Export the fileroot's credentials (AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY)
# and ASYNCRL_ENGINE_API_KEY (the inference servers bind the node's address and need a key)
# before starting the node: Ray's workers inherit the node's environment.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
role="${1:-}"; shift || true
case "$role" in
  head|worker|stop) ;;
  *) echo "usage: bash infra/ray_node.sh head|worker HEAD:PORT|stop [ray start flags]" >&2; exit 2 ;;
esac
bash "$root/infra/setup_env.sh"
ray="$root/.venv/bin/ray"
case "$role" in
  head)   exec "$ray" start --head --port "${RAY_PORT:-6379}" --disable-usage-stats "$@" ;;
  worker) address="${1:?usage: ray_node.sh worker HEAD:PORT [flags]}"; shift
          exec "$ray" start --address "$address" --disable-usage-stats "$@" ;;
  stop)   exec "$ray" stop ;;
esac
