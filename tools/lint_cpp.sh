#!/usr/bin/env bash
# clang-format check of every C++/CUDA source (*.h *.cc *.cu *.cuh) under addons/, tests/,
# benchmarks/ and harness/, with the repo's .clang-format. Fails (and lists the files) when one
# would change.
#   tools/lint_cpp.sh          check (clang-format --dry-run -Werror)
#   tools/lint_cpp.sh --fix    rewrite the files in place
# clang-format: $ROOT/.venv/bin/clang-format (tools/setup.sh installs it), else the one on PATH.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
mode=check
case "${1:-}" in
  "") ;;
  --fix) mode=fix ;;
  *) echo "usage: tools/lint_cpp.sh [--fix]" >&2; exit 2 ;;
esac
CLANG_FORMAT="$ROOT/.venv/bin/clang-format"
[ -x "$CLANG_FORMAT" ] || CLANG_FORMAT="$(command -v clang-format || true)"
[ -n "$CLANG_FORMAT" ] || { echo "lint_cpp.sh: no clang-format (.venv/bin or PATH)" >&2; exit 2; }

# Sources only: build trees (CMake's build/, Bazel's bazel-*) and data are not walked.
mapfile -d '' files < <(find addons tests benchmarks harness \
  \( -name build -o -name 'bazel-*' -o -name raw -o -name __pycache__ \) -prune -o \
  -type f \( -name '*.h' -o -name '*.cc' -o -name '*.cu' -o -name '*.cuh' \) -print0 | sort -z)
[ "${#files[@]}" -gt 0 ] || { echo "lint_cpp.sh: no sources found" >&2; exit 2; }

if [ "$mode" = fix ]; then
  "$CLANG_FORMAT" -i "${files[@]}"
  echo "lint_cpp.sh: formatted ${#files[@]} files ($("$CLANG_FORMAT" --version))"
  exit 0
fi
bad=()
for f in "${files[@]}"; do
  "$CLANG_FORMAT" --dry-run -Werror "$f" >/dev/null 2>&1 || bad+=("$f")
done
if [ "${#bad[@]}" -gt 0 ]; then
  printf '  %s\n' "${bad[@]}"
  echo "lint_cpp.sh: ${#bad[@]} of ${#files[@]} files need formatting: run tools/lint_cpp.sh --fix"
  exit 1
fi
echo "lint_cpp.sh: ${#files[@]} files formatted OK"
