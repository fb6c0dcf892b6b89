#!/usr/bin/env bash
# Python lint (rules in ruff.toml): ruff from the repo's .venv, else from PATH.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
RUFF="$ROOT/.venv/bin/ruff"
[ -x "$RUFF" ] || RUFF="$(command -v ruff || true)"
if [ -z "$RUFF" ]; then
  echo "lint_python.sh: ruff not found (in $ROOT/.venv/bin or on PATH)" >&2
  exit 1
fi
cd "$ROOT"
exec "$RUFF" check addons tests benchmarks tools "$@"
