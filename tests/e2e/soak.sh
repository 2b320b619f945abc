#!/usr/bin/env bash
# The CI's short soak: deploy/bench/soak.sh with KV_SOAK_UPGRADES live
# upgrades, default 20. Before every 4th upgrade a random crash|fail cell of
# the new side's fault matrix (hang cells cost a 20 s deadline each; the full
# soak draws them); around every 3rd a second, short-lived kvload that joins
# (before the signal, or while the upgrade runs) and leaves. 20 upgrades, 5
# faults and 6 churn rounds took 339 s in the TCG guest on an idle 2-core host
# (~14 s per upgrade, most of it the node's own signal -> Owned). The seed is
# drawn and printed; KV_SOAK_SEED replays a run.
set -euo pipefail
cells=""
for p in n_attach n_register n_ready n_open_db n_accepting; do cells+="$p:crash,$p:fail,"; done
exec "$(dirname "$0")/../../deploy/bench/soak.sh" --no-build --build "${KVNODE_BUILD_DIR:?}" \
  --upgrades "${KV_SOAK_UPGRADES:-20}" --fault_every 4 --churn_every 3 --cells "${cells%,}" \
  --seed "${KV_SOAK_SEED:-$(($(date +%s%N) % 1000000007))}"
