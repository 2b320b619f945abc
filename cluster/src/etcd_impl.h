// The gRPC implementation of EtcdClient, shared by etcd_client.cc (unary
// calls, leases) and watcher.cc (the watch stream). Private to cluster/.
#ifndef KVNODE_CLUSTER_SRC_ETCD_IMPL_H_
#define KVNODE_CLUSTER_SRC_ETCD_IMPL_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "etcd/etcdserver/etcdserverpb/rpc.grpc.pb.h"
#include "kvnode/cluster/etcd_client.h"

namespace kvnode::cluster {

// One endpoint's channel and stubs.
struct EtcdConn {
  std::string endpoint;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<etcdserverpb::KV::Stub> kv;
  std::unique_ptr<etcdserverpb::Lease::Stub> lease;
  std::unique_ptr<etcdserverpb::Watch::Stub> watch;
  std::unique_ptr<etcdserverpb::Maintenance::Stub> maintenance;
};

// gRPC status -> absl::Status (the codes share their numbers), the message
// "etcd <op> <key>: <grpc message>".
absl::Status FromGrpc(const grpc::Status& s, std::string_view op, std::string_view key);

// A KeyValue from etcd's, refusing a value above `max_value_size`.
absl::StatusOr<KeyValue> FromProto(const mvccpb::KeyValue& kv, size_t max_value_size);

class GrpcEtcdClient final : public EtcdClient {
 public:
  GrpcEtcdClient(EtcdClientOptions options, std::vector<EtcdConn> conns);

  absl::StatusOr<std::optional<KeyValue>> Get(std::string_view key, int64_t* revision) override;
  absl::StatusOr<RangeResult> GetPrefix(std::string_view prefix) override;
  absl::StatusOr<int64_t> Put(std::string_view key, std::string_view value, int64_t lease) override;
  absl::StatusOr<int64_t> Delete(std::string_view key) override;
  absl::StatusOr<CasResult> PutIfModRevision(std::string_view key, std::string_view value,
                                             int64_t expected_mod_revision, int64_t lease) override;
  absl::StatusOr<CasResult> PutIfCreateRevision(std::string_view key, std::string_view value,
                                                int64_t expected_create_revision,
                                                int64_t lease) override;
  absl::StatusOr<CasResult> PutIfGuarded(std::string_view key, std::string_view value,
                                         bool by_create, int64_t expected_revision,
                                         const ValueGuard& guard, int64_t lease) override;
  absl::StatusOr<CasResult> PutIfModRevisions(std::string_view key, std::string_view value,
                                              int64_t expected_mod_revision,
                                              std::string_view guard_key,
                                              int64_t guard_mod_revision) override;
  absl::StatusOr<CasResult> PutBothIfModRevisions(const RevisionedPut& first,
                                                  const RevisionedPut& second) override;
  absl::StatusOr<CasResult> DeleteUnlessExists(std::string_view key,
                                               std::string_view unless_key) override;
  absl::StatusOr<LeaseGrantResult> LeaseGrant(int64_t ttl_s) override;
  absl::StatusOr<int64_t> LeaseKeepAliveOnce(int64_t lease) override;
  absl::Status LeaseRevoke(int64_t lease) override;
  absl::StatusOr<int64_t> LeaseTimeToLive(int64_t lease) override;
  absl::StatusOr<EtcdHealth> Health() override;
  absl::Status Compact(int64_t revision) override;
  std::unique_ptr<Watcher> Watch(std::string prefix, int64_t from_revision,
                                 WatchCallbacks callbacks) override;

  // The endpoint calls go to now; Failed() moves on to the next after a
  // call to it failed as unreachable.
  const EtcdConn& conn() const { return conns_[current_.load() % conns_.size()]; }
  void Failed(const absl::Status& s);
  // Gives a call its deadline (rpc_deadline from now) and wait_for_ready.
  void SetDeadline(grpc::ClientContext* ctx) const;

 private:
  absl::StatusOr<etcdserverpb::RangeResponse> Range(const etcdserverpb::RangeRequest& req,
                                                    std::string_view key);
  absl::StatusOr<CasResult> PutIf(std::string_view key, std::string_view value,
                                  etcdserverpb::Compare compare, int64_t lease);
  absl::StatusOr<CasResult> Txn(const etcdserverpb::TxnRequest& req, std::string_view key);
  absl::StatusOr<CasResult> CasFromResponse(const etcdserverpb::TxnResponse& resp,
                                            std::string_view key);

  std::vector<EtcdConn> conns_;
  std::atomic<size_t> current_{0};
};

// watcher.cc
std::unique_ptr<Watcher> StartWatcher(GrpcEtcdClient* client, std::string prefix,
                                      int64_t from_revision, WatchCallbacks callbacks);

}  // namespace kvnode::cluster

#endif  // KVNODE_CLUSTER_SRC_ETCD_IMPL_H_
