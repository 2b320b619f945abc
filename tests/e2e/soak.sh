#!/usr/bin/env bash
# The CI's short soak (issue 8): deploy/soak.sh with KV_SOAK_UPGRADES live
# upgrades, default 2, not ~20: one upgrade with its checks took ~3 min in the
# TCG guest on a host at load 13-20 (signal -> Owned 44-75 s), and
# e2e_upgrade_live's 2 upgrades take ~200 s, so 2 upgrades, one fault attempt
# and one churn round are what fits the ~4 min CI budget. Before upgrade 2: a
# random crash|fail cell of the new side's fault matrix (hang cells cost a
# 20 s deadline each; the full soak draws them) and a second, short-lived
# kvload that joins and leaves. The seed is drawn and printed; KV_SOAK_SEED
# replays a run.
set -euo pipefail
cells=""
for p in n_attach n_register n_ready n_open_db n_accepting; do cells+="$p:crash,$p:fail,"; done
exec "$(dirname "$0")/../../deploy/soak.sh" --no-build --build "${KVNODE_BUILD_DIR:?}" \
  --upgrades "${KV_SOAK_UPGRADES:-2}" --fault_every 2 --churn_every 2 --cells "${cells%,}" \
  --seed "${KV_SOAK_SEED:-$(($(date +%s%N) % 1000000007))}"
