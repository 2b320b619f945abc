// A small etcd v3 client over gRPC, with etcd's own protos (generated at build
// time; nothing of them shows in this header).
//
// Contracts:
//  1. Every call takes at most the options' rpc_deadline (a call may pass its
//     own); nothing here blocks forever. etcd unreachable or slow ->
//     Unavailable / DeadlineExceeded, retryable.
//  2. Values are returned as bytes; callers parse them (map_json.h,
//     member.h). A value larger than max_value_size is an error naming its
//     key, never a crash or an unbounded allocation beyond gRPC's own limit.
//  3. Errors name the operation and the key: "etcd Get /kvnode/c1/map: ...".
//
// Thread safety: an EtcdClient may be used from any number of threads at
// once (gRPC stubs are thread-safe). A Watcher runs its own thread and must
// be destroyed before the client it was made from.
#ifndef KVNODE_CLUSTER_ETCD_CLIENT_H_
#define KVNODE_CLUSTER_ETCD_CLIENT_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace kvnode::cluster {

struct EtcdClientOptions {
  // host:port of etcd members (client URLs without the scheme). Required.
  // gRPC picks one that answers (round robin over the resolved addresses).
  std::vector<std::string> endpoints;
  // Deadline of each unary call and of each one-shot stream. Default 2 s.
  absl::Duration rpc_deadline = absl::Seconds(2);
  // Largest value accepted from etcd. Default 1 MiB.
  size_t max_value_size = 1 << 20;

  // InvalidArgument naming --etcd_endpoints for an empty list or an endpoint
  // that is not host:port.
  absl::Status Validate() const;
};

// Parses "host:port[,host:port...]" (the --etcd_endpoints form).
absl::StatusOr<std::vector<std::string>> ParseEndpoints(std::string_view list);

struct KeyValue {
  std::string key;
  std::string value;
  int64_t create_revision = 0;
  int64_t mod_revision = 0;
  int64_t version = 0;
  int64_t lease = 0;
};

struct RangeResult {
  int64_t revision = 0;  // the store's revision the read saw (header)
  std::vector<KeyValue> kvs;
};

struct CasResult {
  bool applied = false;
  int64_t revision = 0;             // the store's revision after the txn
  std::optional<KeyValue> current;  // when not applied: the key's value, if any
  // PutIfGuarded / PutIfModRevisions / PutBothIfModRevisions not applied:
  // the guard (second) key, if any.
  std::optional<KeyValue> guard;
};

// The extra condition of PutIfGuarded: `key` exists and holds `value`.
struct ValueGuard {
  std::string key;
  std::string value;
};

// One key of PutBothIfModRevisions: put `value` (no lease) if the key's
// mod_revision is `expected_mod_revision` (0: the key must not exist).
struct RevisionedPut {
  std::string key;
  std::string value;
  int64_t expected_mod_revision = 0;
};

struct LeaseGrantResult {
  int64_t id = 0;
  int64_t ttl_s = 0;  // as granted (etcd may raise a small TTL)
};

struct EtcdHealth {
  std::string endpoint;  // the member that answered
  std::string version;   // etcd server version
  int64_t revision = 0;
  int64_t db_size = 0;
  uint64_t leader = 0;  // member id of the leader; 0 none
};

struct WatchEvent {
  enum class Type { kPut, kDelete };
  Type type = Type::kPut;
  KeyValue kv;  // for kDelete: key and mod_revision only
};

// What a Watcher delivers. A resync replaces everything the receiver knew of
// the prefix by `snapshot` (the first delivery, and after the watch revision
// was compacted away); otherwise `events` follow the previous delivery in
// revision order, without gaps.
struct WatchUpdate {
  bool resync = false;
  int64_t revision = 0;  // store revision this update brings the view to
  std::vector<KeyValue> snapshot;
  std::vector<WatchEvent> events;
};

struct WatchCallbacks {
  // Called on the watcher's thread, one at a time, never after Stop returns.
  std::function<void(const WatchUpdate&)> on_update;
  // Each time the watch stream breaks or a resync read fails (the watcher
  // retries with backoff on its own), and with OkStatus once it is watching
  // again. Optional.
  std::function<void(const absl::Status&)> on_state;
};

class EtcdClient;

// Watches every key starting with a prefix, from a revision, on its own
// thread, forever: a broken stream is reopened from the next revision with
// backoff (100 ms doubling to 2 s); a compacted revision (etcd's
// compact_revision in the watch response) makes it re-read the prefix and
// deliver a resync. Destroying or Stop()ping it cancels the stream and joins
// the thread.
class Watcher {
 public:
  virtual ~Watcher() = default;
  virtual void Stop() = 0;
  // Number of resyncs delivered (the first snapshot counts).
  virtual int64_t resyncs() const = 0;
};

class EtcdClient {
 public:
  // Creates the channel; does not wait for etcd (the first call does).
  static absl::StatusOr<std::unique_ptr<EtcdClient>> Connect(const EtcdClientOptions& options);
  virtual ~EtcdClient() = default;

  const EtcdClientOptions& options() const { return options_; }

  // The key; nullopt when it does not exist. `revision`, when set, receives
  // the store revision of the read.
  virtual absl::StatusOr<std::optional<KeyValue>> Get(std::string_view key,
                                                      int64_t* revision = nullptr) = 0;
  // Every key starting with `prefix`, sorted by key, and the store revision.
  virtual absl::StatusOr<RangeResult> GetPrefix(std::string_view prefix) = 0;
  // Puts `value` at `key`, attached to `lease` (0: none). Returns the new
  // store revision.
  virtual absl::StatusOr<int64_t> Put(std::string_view key, std::string_view value,
                                      int64_t lease = 0) = 0;
  // Deletes `key`; returns how many keys were deleted (0 or 1).
  virtual absl::StatusOr<int64_t> Delete(std::string_view key) = 0;
  // Txn: if mod_revision(key) == expected_mod_revision (0: the key must not
  // exist) put `value` with `lease`; else read the key. Not applying is not
  // an error: see CasResult.
  virtual absl::StatusOr<CasResult> PutIfModRevision(std::string_view key, std::string_view value,
                                                     int64_t expected_mod_revision,
                                                     int64_t lease = 0) = 0;
  // Txn: if create_revision(key) == expected_create_revision put `value`
  // with `lease`; else read the key. Member registration uses it (a member
  // key it did not create is another process's).
  virtual absl::StatusOr<CasResult> PutIfCreateRevision(std::string_view key,
                                                        std::string_view value,
                                                        int64_t expected_create_revision,
                                                        int64_t lease = 0) = 0;
  // Txn: if create_revision(key) == expected_create_revision (by_create) or
  // mod_revision(key) == expected_revision (!by_create), AND the guard key
  // holds guard.value, put `value` with `lease`; else read both keys
  // (CasResult.current, .guard). A node's member key is written only this
  // way, guarded by the node id's instance key.
  virtual absl::StatusOr<CasResult> PutIfGuarded(std::string_view key, std::string_view value,
                                                 bool by_create, int64_t expected_revision,
                                                 const ValueGuard& guard, int64_t lease) = 0;
  // Txn: if mod_revision(key) == expected_mod_revision and
  // mod_revision(guard_key) == guard_mod_revision (0: the guard key must not
  // exist) put `value` (no lease); else read both keys (CasResult.current,
  // .guard). The fleet roll's and slot migration's drivers start this way,
  // each guarded by the other's plan as they read it: not running.
  virtual absl::StatusOr<CasResult> PutIfModRevisions(std::string_view key, std::string_view value,
                                                      int64_t expected_mod_revision,
                                                      std::string_view guard_key,
                                                      int64_t guard_mod_revision) = 0;
  // Txn: if both keys' mod_revisions are as expected put both values, in
  // one revision; else read both keys (CasResult.current: first's,
  // .guard: second's). A slot move's commit writes the map and the
  // migration plan this way (migration_commit.h).
  virtual absl::StatusOr<CasResult> PutBothIfModRevisions(const RevisionedPut& first,
                                                          const RevisionedPut& second) = 0;
  // Txn: if `unless_key` does not exist delete `key` (applied); else read
  // unless_key (CasResult.current). kvctl cluster forget-node uses it.
  virtual absl::StatusOr<CasResult> DeleteUnlessExists(std::string_view key,
                                                       std::string_view unless_key) = 0;

  virtual absl::StatusOr<LeaseGrantResult> LeaseGrant(int64_t ttl_s) = 0;
  // One keepalive round trip (a stream opened and closed per call). Returns
  // the TTL left in seconds; NotFound "lease <id> expired" when it is gone.
  virtual absl::StatusOr<int64_t> LeaseKeepAliveOnce(int64_t lease) = 0;
  // Revokes the lease, deleting every key attached to it. NotFound if gone.
  virtual absl::Status LeaseRevoke(int64_t lease) = 0;
  // Seconds left; NotFound "lease <id> expired" when it is gone.
  virtual absl::StatusOr<int64_t> LeaseTimeToLive(int64_t lease) = 0;

  // etcd's Maintenance.Status of the member that answers.
  virtual absl::StatusOr<EtcdHealth> Health() = 0;
  // Compacts the history up to `revision` (physical: waits for it).
  virtual absl::Status Compact(int64_t revision) = 0;

  // Starts a Watcher on `prefix`. from_revision 0: first read the prefix and
  // deliver it as a resync, then watch from the revision after it; else
  // deliver events from `from_revision` on (a resync if it is compacted).
  virtual std::unique_ptr<Watcher> Watch(std::string prefix, int64_t from_revision,
                                         WatchCallbacks callbacks) = 0;

 protected:
  explicit EtcdClient(EtcdClientOptions options) : options_(std::move(options)) {}

 private:
  EtcdClientOptions options_;
};

}  // namespace kvnode::cluster

#endif  // KVNODE_CLUSTER_ETCD_CLIENT_H_
