#!/usr/bin/env bash
# Checks that the include graph between the top-level libraries has no
# upward arrow and no cycle: every `#include "kvnode/<lib>/..."` in a
# library's sources and headers must name the library itself or one it may
# depend on (README.md "Layout"). Tests may include anything.
#
#   deploy/dev/check-layout.sh        exit 0 when clean; lists each offending line
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

# dir -> the include prefixes (kvnode/<prefix>/) it may use besides its own.
declare -A allowed=(
  [base]=""
  [rdma]="base"
  [storage]="base"
  [proto]="base storage"
  [upgrade]="base proto"
  [cluster]="base proto"
  [server]="base proto storage rdma"
  [node]="base proto storage rdma server upgrade cluster"
  [client]="base proto storage rdma"
  [tools]="base proto storage rdma client cluster"
)
# include prefix -> the directory that owns it.
declare -A owner=(
  [base]=base [rdma]=rdma [storage]=storage [proto]=proto [upgrade]=upgrade
  [cluster]=cluster [server]=server [node]=node [client]=client [load]=tools [fill]=tools
)
# proto may take only storage's header-only limits (no link to storage).
proto_storage_ok='kvnode/storage/limits.h'

bad=0
for dir in "${!allowed[@]}"; do
  while IFS=: read -r file line text; do
    prefix=$(sed -E 's#.*"kvnode/([a-z_]+)/.*#\1#' <<<"$text")
    to=${owner[$prefix]:-}
    if [[ -z $to ]]; then
      echo "$file:$line: unknown library kvnode/$prefix/"
      bad=1
      continue
    fi
    [[ $to == "$dir" ]] && continue
    if [[ " ${allowed[$dir]} " != *" $to "* ]]; then
      echo "$file:$line: $dir/ must not include $to/ ($text)"
      bad=1
    elif [[ $dir == proto && $to == storage && $text != *"\"$proto_storage_ok\""* ]]; then
      echo "$file:$line: proto/ may include only $proto_storage_ok of storage/ ($text)"
      bad=1
    fi
  done < <(grep -rnE '^#include "kvnode/' "$dir" --include='*.h' --include='*.cc' || true)
  # A library's private headers stay private: no "../" into another tree.
  if grep -rnE '^#include "\.\./' "$dir" --include='*.h' --include='*.cc'; then bad=1; fi
done
if ((bad)); then
  echo "check-layout: include graph has upward arrows (see above)"
  exit 1
fi
echo "check-layout: ${#allowed[@]} libraries, no upward include, no cycle"
