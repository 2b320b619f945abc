#!/usr/bin/env bash
# Installs, from Debian's packages only, everything kvnode's build, tests and
# Soft-RoCE VM test bed need. Idempotent and non-interactive: a second run on
# a machine that has everything installs nothing and takes about a second.
set -euo pipefail

PACKAGES=(
  # build
  build-essential cmake pkg-config git clang-format
  # rdma-core: verbs library, providers (rxe), tools, perftest baselines
  rdma-core ibverbs-providers libibverbs-dev ibverbs-utils perftest iproute2
  # libraries
  libboost-dev librocksdb-dev libgflags-dev libgoogle-glog-dev libabsl-dev
  libxxhash-dev nlohmann-json3-dev
  # the cluster: etcd v3 over gRPC with etcd's own protos (cluster/), the
  # etcd the tests start, promtool for the metrics, the HTTP metrics endpoint
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler golang-etcd-server-dev
  etcd-server etcd-client prometheus libcpp-httplib-dev
  # test and benchmark scripts read JSON reports with python3
  python3
  # tests and benchmarks
  libgtest-dev libgmock-dev libbenchmark-dev
  strace # tests/e2e/log_time_zone.sh: what the node's log lines read
  clang libclang-rt-14-dev # fuzzing: deploy/dev/fuzz.sh, tests/fuzz (libFuzzer, ASan, UBSan)
  redis-server redis-tools gnuplot-nox # deploy/bench/bench-all.sh: Redis on loopback TCP, the plots
  # the VM test bed (the kernel package is only downloaded and extracted)
  qemu-system-x86 busybox-static cpio kmod
  # deploy/vm/rxe-vm --two-host adds no package: inside its guests iproute2
  # (above) gives `ip link set eth0 down/up`, `tc qdisc ... netem` and nstat,
  # and the modules virtio_net (the link) and sch_netem come from the same
  # kernel package as rdma_rxe.
)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if ((${#missing[@]})); then
  SUDO=""
  [[ $(id -u) -eq 0 ]] || SUDO="sudo"
  echo "install-deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
echo "install-deps: all ${#PACKAGES[@]} packages present"
