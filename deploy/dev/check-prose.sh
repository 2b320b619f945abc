#!/usr/bin/env bash
# Checks that the project speaks of itself only: no numbered work item
# ("issue", "session" and a number) in the docs, results, scripts, tests or
# code, and no absolute path of a build or cache directory outside the
# repository (/work/..., /root/..., /home/USER/..., /tmp/.../build) in docs/,
# results/ or README.md, where a reader's machine has none of them. A run's
# story goes to results/, which the docs link.
#
#   deploy/dev/check-prose.sh     exit 0 when clean; lists each offending line
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

bad=0
if grep -rnIiE '(session|issue) [0-9]+' docs README.md results deploy tests \
  base rdma storage proto upgrade server node client tools; then
  echo "check-prose: the lines above number an issue or a session; say what the thing is"
  bad=1
fi
# A path starts the text or follows a character that cannot end a path.
machine='(^|[^[:alnum:]_./~-])(/work/|/root/|/home/[^/[:space:]]+/|/tmp/[^[:space:]]*build)'
if grep -rnIE "$machine" docs README.md results; then
  echo "check-prose: the lines above name a directory of one machine; use a repo-relative path"
  bad=1
fi
((bad)) && exit 1
echo "check-prose: no numbered issue or session anywhere; no machine path in docs, results, README"
