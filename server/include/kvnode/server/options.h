// Configuration of a kvnode process. main() copies the gflags into a
// ServerOptions; everything below the flags layer takes this struct.
//
// Every field states its default. Validate() rejects nonsense with a message
// that names the flag (--name) the field comes from.
#ifndef KVNODE_SERVER_OPTIONS_H_
#define KVNODE_SERVER_OPTIONS_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kvnode/server/shard_gate.h"

namespace kvnode::server {

struct ServerOptions {
  // --listen. TCP address of the control listener, "host:port" or
  // "[v6]:port". Default "127.0.0.1:7000". Port 0 picks a free port (tests).
  std::string listen = "127.0.0.1:7000";
  // --advertise_address. Where clients are told to go when a live upgrade
  // moves them (Move.endpoint): "host:port", "[v6]:port", or a host alone
  // ("host", "[v6]") for the port actually listened on. Default "": the bound
  // listen address, which must then be specific: a wildcard --listen
  // (0.0.0.0, ::) is refused without it, since a remote client told to move
  // to 0.0.0.0 would connect to its own host.
  std::string advertise_address = "";
  // --rdma_device. Verbs device name. Default "": the first ACTIVE device.
  std::string rdma_device = "";
  // --rdma_port. Port of the device. Default 1.
  int rdma_port = 1;
  // --gid_index. Default -1: automatic (IPv4-mapped RoCE v2 GID).
  int gid_index = -1;

  // --db_path. RocksDB directory. Required (no default). It must be this
  // uid's own directory, not a symbolic link, that group and others cannot
  // write (base::EnsureOwnDirectory with 0022); created 0700 when missing.
  std::string db_path = "";
  // --sync_writes. fsync the WAL before a write is acknowledged. Default true.
  bool sync_writes = true;
  // --arena_size. Bytes of the shared-memory arena. Default 256 MiB.
  uint64_t arena_size = uint64_t{256} << 20;
  // --arena_path. If set, the arena is a file at this path (e.g. on a
  // hugetlbfs mount) instead of a POSIX shm object. Default "".
  std::string arena_path = "";
  // --shm_name. Name of the POSIX shm object (/dev/shm/<name>) when
  // arena_path is empty. Default "kvnode-arena".
  std::string shm_name = "kvnode-arena";
  // --keep_arena. Keep the arena segment at clean shutdown (a clean arena
  // whose generation matches RocksDB is re-attached at the next start without
  // a rebuild). Default false: the segment is removed.
  bool keep_arena = false;
  // --max_chain_buckets. Most buckets in one index chain (home + overflow),
  // 1..64; a PUT of a new key past it is REJECTED (docs/format.md). Default 16.
  uint32_t max_chain_buckets = 16;
  // --upgrade_journal_mb. Size of the write journal a new process writes to
  // during a live upgrade's writer switch, created (allocated) before it
  // says Ready; a write that does not fit waits (BUSY) for RocksDB. 2..4096.
  // Default 32.
  uint32_t upgrade_journal_mb = 32;

  // --auth_token_file. File holding the token clients must present (trailing
  // newline stripped). Must not be group/world readable. Default "": no auth
  // (a warning is logged).
  std::string auth_token_file = "";
  // --max_clients. Concurrent client sessions (each one QP, one window,
  // 3 x rpc_credits RPC buffers). Default 64.
  uint32_t max_clients = 64;
  // --rpc_credits. RPC receive buffers posted per client = the most RPCs a
  // client may have outstanding. Default 8.
  uint32_t rpc_credits = 8;
  // --memory_windows. Serve the arena through a type-2 window per client when
  // the device supports them ("auto"), always ("on": fail without), or never
  // ("off": the arena MR's rkey, REMOTE_READ). Default "auto".
  std::string memory_windows = "auto";

  // --handshake_timeout_ms. A client that has not completed Hello..Ready in
  // this time is cut. Default 5000.
  absl::Duration handshake_timeout = absl::Seconds(5);
  // --keepalive_ms. Interval of the server's Keepalive frames; a session that
  // has sent nothing for keepalive_misses intervals is cut. 0 disables.
  // Default 1000.
  absl::Duration keepalive_interval = absl::Seconds(1);
  // --keepalive_misses. Default 3.
  uint32_t keepalive_misses = 3;
  // --shutdown_timeout_ms. Bound on the whole drain at SIGTERM (per QP drains
  // are bounded by it too). Default 10000.
  absl::Duration shutdown_timeout = absl::Seconds(10);
  // --dedupe_window. Applied writes remembered per client id (answers to
  // retried (client id, sequence) pairs). Default 1024 (the contract's floor).
  uint32_t dedupe_window = 1024;
  // --max_client_records. Dedupe records of departed clients kept for their
  // reconnect (oldest dropped first; a client that closes for good, Goodbye
  // reason 6, takes its record with it). Default 4096.
  uint32_t max_client_records = 4096;
  // --spin_us. After activity the data-plane thread busy-polls its CQ this
  // long before sleeping on the completion channel. Default 20.
  uint32_t spin_us = 20;
  // --spin_max_us. Adaptive busy polling: while requests arrive less than
  // this long after the previous completion (a recent mean, e.g. a client
  // with one request outstanding), the data thread spins up to this long
  // (twice that mean, at least --spin_us) instead of --spin_us, so the next
  // request finds it awake. Costs up to this much CPU per quiet spell while
  // clients are active; an idle node still sleeps. 0 (default) or <= --spin_us:
  // a fixed --spin_us. At most 1000000.
  uint32_t spin_max_us = 0;
  // --group_commit. The writes of a poll round are applied in one durable
  // write (docs/server.md, "Group commit"); false: each write alone, as
  // received. Default true.
  bool group_commit = true;
  // --qp_timeout. Local ACK timeout exponent of client QPs: 4.096 us *
  // 2^qp_timeout per try (the responses and window binds this node sends).
  // Default 12 (~16.8 ms), 0..31. Raise it where round trips jitter by more
  // (an emulated or congested link), or QPs fail with "transport retry
  // counter exceeded" and their clients reconnect needlessly.
  uint32_t qp_timeout = 12;
  // --qp_retry_cnt. Transport retries of client QPs. Default 2, 0..7 (7 is
  // "forever" on rxe).
  uint32_t qp_retry_cnt = 2;

  // --pid_file. Written after startup (replaced by rename, never through a
  // symbolic link), removed at exit. Its directory must pass EnsureNodeFileDir.
  // Default "".
  std::string pid_file = "";
  // --admin_socket. Unix socket for kvctl. Default "": /run/kvnode/admin.sock
  // if /run/kvnode can be used, else $XDG_RUNTIME_DIR/kvnode/admin.sock, else
  // /tmp/kvnode-$UID/admin.sock (directories created 0700).
  std::string admin_socket = "";
  // Upgrade generation of this process (1 for a cold start; the upgrade
  // module passes the old one's + 1). Default 1.
  uint64_t generation = 1;
  // Free-form build identification shown in stats. Default: set by main().
  std::string build_id = "";
  // Cluster membership (no flag: node/ sets it for --cluster). Default null:
  // a single node, serving every key, behaving exactly as without clusters.
  // Set: the node serves only the slots of the gate's current view (others
  // are answered WRONG_SHARD, or REJECTED to a session without
  // kFeatureShardMap; everything while no map is published), and pushes each
  // published map to the control sessions that negotiated kFeatureShardMap
  // (docs/protocol.md, "Shard map").
  std::shared_ptr<ShardGate> shard_gate;

  [[nodiscard]] absl::Status Validate() const;
};

// The endpoint a Move names for a node whose listener is bound to
// `bound_listen` (Server::listen_address(), "host:port" with the real port),
// given its --advertise_address `advertise`: `advertise` with the bound port
// when it has none, or `bound_listen` when it is empty. FailedPrecondition,
// naming --advertise_address, when the result would be a wildcard address.
[[nodiscard]] absl::StatusOr<std::string> AdvertisedEndpoint(const std::string& advertise,
                                                             const std::string& bound_listen);

// "always" | "never" | "auto" from ServerOptions::memory_windows.
enum class WindowMode { kAuto, kOn, kOff };
[[nodiscard]] absl::StatusOr<WindowMode> ParseWindowMode(const std::string& s);

// The default admin socket path as described for ServerOptions::admin_socket
// (creating the chosen 0700 directory). Error when none is usable.
[[nodiscard]] absl::StatusOr<std::string> DefaultAdminSocketPath();

// The directory of an explicit --admin_socket `socket_path` (its dirname,
// "." without a slash) must be private to this process's user: created 0700
// if missing; PermissionDenied, naming the directory, its owner and mode, if
// it is not a directory (a symlink included), is owned by another uid, or
// grants group/others any access. Whoever can write that directory could
// replace the socket and impersonate the node to kvctl.
[[nodiscard]] absl::Status EnsureAdminSocketDir(const std::string& socket_path);

// The same check for any file the node creates by name (the admin socket, the
// pid file), `flag` naming the option in the message: whoever can write the
// directory could replace the file or plant a symbolic link under its name.
[[nodiscard]] absl::Status EnsureNodeFileDir(const char* flag, const std::string& path);

// Reads the auth token file; refuses a file that is group/world readable or
// not a regular file. Trailing '\n'/'\r' are stripped. Empty token refused.
[[nodiscard]] absl::StatusOr<std::string> ReadAuthTokenFile(const std::string& path);

}  // namespace kvnode::server

#endif  // KVNODE_SERVER_OPTIONS_H_
