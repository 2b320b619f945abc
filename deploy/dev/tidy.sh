#!/usr/bin/env bash
# clang-tidy (.clang-tidy's short check list) on the C++ files changed since
# a base commit, using build/compile_commands.json.
#
#   deploy/dev/tidy.sh [BASE]     BASE defaults to HEAD~1; "all" checks every file
#
# Not part of deploy/test.sh: CI tests a fresh clone of main, which has no
# base to diff against, and the whole tree takes over 15 minutes on 2 cores
# (about 6 s a file). Run it before you commit.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
base=${1:-HEAD~1}
[[ -f build/compile_commands.json ]] || { echo "tidy.sh: build/ first (deploy/test.sh --unit)" >&2; exit 2; }
if [[ $base == all ]]; then
  mapfile -t files < <(git ls-files '*.cc' | grep -v '^tests/fuzz/')
else
  mapfile -t files < <(git diff --name-only --diff-filter=AMR "$base" -- '*.cc' | grep -v '^tests/fuzz/' || true)
fi
((${#files[@]})) || { echo "tidy.sh: no C++ file changed since $base"; exit 0; }
echo "tidy.sh: ${#files[@]} files"
printf '%s\0' "${files[@]}" | xargs -0 -n 4 -P "$(nproc)" clang-tidy -p build --quiet --extra-arg=-Wno-unknown-warning-option
echo "tidy.sh: clean"
