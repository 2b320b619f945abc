// kvnode_map_probe: how long a shard map change takes to reach clients.
//
//   kvnode_map_probe --seeds H:P[,H:P...] --auth_token_file F
//                    --etcd_endpoints H:P --cluster NAME [--clients 8]
//                    [--changes 20] [--report OUT.json]
//
// Connects --clients ClusterClients (each touches every node with a few
// GETs, so that it has a session to each), then --changes times: reads the
// map from etcd, writes it back with the next epoch (a CAS on its
// mod_revision, as an operator's tool would), and polls every client until
// its map_epoch() is the new one. A client's delay is from the write's
// answer to the poll that saw the epoch (one clock, this process); a
// change's "every client" delay is its slowest client's. Prints and writes
// (--report) p50/p99/max of both. Exit 0 when every change reached every
// client within --deadline_ms; 1 otherwise (naming the change and client).
// Used by deploy/bench/bench-cluster.sh.
#include <gflags/gflags.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "kvnode/client/admin.h"
#include "kvnode/client/cluster_client.h"
#include "kvnode/cluster/etcd_client.h"
#include "kvnode/cluster/keys.h"
#include "kvnode/cluster/map_json.h"

DEFINE_string(seeds, "", "the nodes' endpoints HOST:PORT,... (ClusterClient seeds)");
DEFINE_string(auth_token_file, "", "file holding the nodes' auth token");
DEFINE_string(etcd_endpoints, "127.0.0.1:2379", "etcd's HOST:PORT,...");
DEFINE_string(cluster, "", "the cluster's name");
DEFINE_uint32(clients, 8, "ClusterClients that must all see each change");
DEFINE_uint32(changes, 20, "map epoch changes to time");
DEFINE_uint32(deadline_ms, 10000, "give up on a change after this long");
DEFINE_string(report, "", "write the figures here as JSON");

namespace {

using kvnode::client::ClusterClient;

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(p / 100.0 * v.size()));
  return v[i];
}

// Writes the stored map back with epoch + 1; returns the new epoch.
absl::StatusOr<uint64_t> BumpEpoch(kvnode::cluster::EtcdClient& etcd) {
  const std::string key = kvnode::cluster::MapKey(FLAGS_cluster);
  auto kv = etcd.Get(key);
  if (!kv.ok()) return kv.status();
  if (!kv->has_value()) return absl::NotFoundError(absl::StrCat("no map at ", key));
  auto map = kvnode::cluster::DecodeMapJson((*kv)->value, FLAGS_cluster);
  if (!map.ok()) return map.status();
  map->epoch += 1;
  auto cas = etcd.PutIfModRevision(key, kvnode::cluster::EncodeMapJson(*map), (*kv)->mod_revision);
  if (!cas.ok()) return cas.status();
  if (!cas->applied) return absl::AbortedError(absl::StrCat(key, " changed under the probe"));
  return map->epoch;
}

// Polls every client until each has `epoch`; the delay of each (ms) since
// `t0`, or -1 for a client that did not see it by the deadline.
std::vector<double> AwaitEpoch(const std::vector<std::unique_ptr<ClusterClient>>& clients,
                               uint64_t epoch, absl::Time t0) {
  std::vector<double> delay(clients.size(), -1);
  std::vector<ClusterClient*> raw;
  for (const auto& c : clients) raw.push_back(c.get());
  kvnode::client::OpResult out[8];
  size_t left = clients.size();
  const absl::Time deadline = t0 + absl::Milliseconds(FLAGS_deadline_ms);
  while (left > 0 && absl::Now() < deadline) {
    ClusterClient::WaitAny(raw, absl::Now() + absl::Milliseconds(1));
    for (size_t i = 0; i < clients.size(); ++i) {
      clients[i]->Poll(out);
      if (delay[i] < 0 && clients[i]->map_epoch() >= epoch) {
        delay[i] = absl::ToDoubleMilliseconds(absl::Now() - t0);
        --left;
      }
    }
  }
  return delay;
}

void Report(const std::vector<double>& per_client, const std::vector<double>& per_change) {
  const std::string j = absl::StrCat(
      "{\"clients\":", FLAGS_clients, ",\"changes\":", FLAGS_changes,
      ",\"client_ms\":{\"p50\":", Percentile(per_client, 50),
      ",\"p99\":", Percentile(per_client, 99), ",\"max\":", Percentile(per_client, 100),
      "},\"every_client_ms\":{\"p50\":", Percentile(per_change, 50),
      ",\"p99\":", Percentile(per_change, 99), ",\"max\":", Percentile(per_change, 100), "}}");
  std::printf("%s\n", j.c_str());
  if (!FLAGS_report.empty()) std::ofstream(FLAGS_report) << j << "\n";
}

}  // namespace

int main(int argc, char** argv) {
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  auto token = kvnode::client::ReadAuthTokenFile(FLAGS_auth_token_file);
  auto endpoints = kvnode::cluster::ParseEndpoints(FLAGS_etcd_endpoints);
  if (!token.ok() || !endpoints.ok() || FLAGS_cluster.empty() || FLAGS_clients == 0) {
    std::fprintf(stderr,
                 "kvnode_map_probe: need --auth_token_file, --etcd_endpoints, "
                 "--cluster and --clients >= 1\n");
    return 2;
  }
  kvnode::cluster::EtcdClientOptions eo;
  eo.endpoints = *endpoints;
  auto etcd = kvnode::cluster::EtcdClient::Connect(eo);
  if (!etcd.ok()) {
    std::fprintf(stderr, "kvnode_map_probe: %s\n", etcd.status().ToString().c_str());
    return 2;
  }
  std::vector<std::unique_ptr<ClusterClient>> clients;
  for (uint32_t i = 0; i < FLAGS_clients; ++i) {
    kvnode::client::ClusterClientOptions o;
    o.seeds = absl::StrSplit(FLAGS_seeds, ',', absl::SkipEmpty());
    o.base.auth_token = *token;
    o.base.client_name = "kvnode_map_probe";
    auto c = ClusterClient::Connect(o);
    if (!c.ok()) {
      std::fprintf(stderr, "kvnode_map_probe: client %u: %s\n", i, c.status().ToString().c_str());
      return 2;
    }
    // A session to every node: 64 keys cover three nodes' slots many times.
    // The clients made before are polled between the GETs: a client is
    // driven only by its caller, and one left alone for 3 s misses its
    // keepalives and is cut (which a slow guest reaches while 8 connect).
    kvnode::client::OpResult out[8];
    for (int k = 0; k < 64; ++k) {
      (void)(*c)->Get(absl::StrCat("probe-", k));
      for (auto& earlier : clients) earlier->Poll(out);
    }
    clients.push_back(*std::move(c));
  }
  std::vector<double> per_client, per_change;
  for (uint32_t n = 0; n < FLAGS_changes; ++n) {
    auto epoch = BumpEpoch(**etcd);
    if (!epoch.ok()) {
      std::fprintf(stderr, "kvnode_map_probe: change %u: %s\n", n,
                   epoch.status().ToString().c_str());
      return 1;
    }
    const std::vector<double> d = AwaitEpoch(clients, *epoch, absl::Now());
    for (size_t i = 0; i < d.size(); ++i) {
      if (d[i] < 0) {
        std::fprintf(stderr, "kvnode_map_probe: client %zu did not see epoch %lu within %u ms\n", i,
                     static_cast<unsigned long>(*epoch), FLAGS_deadline_ms);
        return 1;
      }
    }
    per_client.insert(per_client.end(), d.begin(), d.end());
    per_change.push_back(*std::max_element(d.begin(), d.end()));
  }
  Report(per_client, per_change);
  for (auto& c : clients) (void)c->Close();
  return 0;
}
