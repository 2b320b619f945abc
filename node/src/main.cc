// kvnode: the storage server process. Flags are copied into ServerOptions
// (server/include/kvnode/server/options.h documents each field).
#include <gflags/gflags.h>
#include <glog/logging.h>
#include <sys/stat.h>
#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "cluster_agent.h"
#include "kvnode/base/time_zone.h"
#include "kvnode/base/version.h"
#include "kvnode/node/node.h"
#include "kvnode/server/admin.h"
#include "kvnode/server/options.h"
#include "kvnode/server/server.h"
#include "kvnode/upgrade/fault.h"
#include "kvnode/upgrade/header.h"
#include "kvnode/upgrade/process.h"
#include "kvnode/upgrade/sd_notify.h"

DECLARE_bool(help);
DECLARE_string(helpmatch);

DEFINE_string(listen, "127.0.0.1:7000",
              "TCP address of the control listener, host:port or [v6]:port (port 0 = any free "
              "port; the chosen one is logged and shown by `kvctl ping`)");
DEFINE_string(advertise_address, "",
              "where a live upgrade sends clients: HOST, HOST:PORT, [IPV6] or [IPV6]:PORT (a host "
              "alone: the port listened on). Default: the listen address; required when --listen "
              "is a wildcard address (0.0.0.0, ::)");
DEFINE_string(rdma_device, "", "verbs device name, e.g. rxe0 or mlx5_0 (default: first ACTIVE)");
DEFINE_int32(rdma_port, 1, "port number of the verbs device");
DEFINE_int32(gid_index, -1, "GID index (-1: automatic, the IPv4-mapped RoCE v2 GID)");
DEFINE_string(db_path, "", "RocksDB directory (required; created if missing)");
DEFINE_bool(sync_writes, true, "fsync RocksDB's WAL before a write is acknowledged");
DEFINE_uint64(arena_size, uint64_t{256} << 20,
              "bytes of the shared-memory arena that clients READ (rounded to pages)");
DEFINE_string(arena_path, "",
              "put the arena in a file at this path (e.g. on a hugetlbfs mount) instead of a "
              "POSIX shm object");
DEFINE_string(shm_name, "kvnode-arena",
              "name of the arena's POSIX shm object (/dev/shm/NAME) when --arena_path is empty");
DEFINE_bool(keep_arena, false,
            "keep the arena segment at clean shutdown; the next start re-attaches it without a "
            "rebuild when its generation matches RocksDB");
DEFINE_uint32(
    max_chain_buckets, 16,
    "most buckets in one index chain (6 keys each; 1..64): a PUT of a new key whose "
    "chain is full is REJECTED, so keys aimed at one bucket cost the node a bounded amount");
DEFINE_uint32(upgrade_journal_mb, 32,
              "live upgrade: size of the write journal the new process makes writes durable in "
              "while RocksDB changes hands (2..4096); a write that does not fit waits (BUSY) for "
              "RocksDB. The serving process keeps a spare journal of that size in the database "
              "directory, which the new process takes by a rename before it says Ready");
DEFINE_string(auth_token_file, "",
              "file with the token clients must present (mode 0600; empty: no authentication)");
DEFINE_uint32(max_clients, 64, "most concurrent client sessions (each one QP and one window)");
DEFINE_uint32(rpc_credits, 8,
              "RPC receive buffers per client = most RPCs a client may have outstanding");
DEFINE_string(memory_windows, "auto",
              "serve the arena through a type-2 memory window per client: auto (when the device "
              "supports them), on, off (the arena MR's rkey)");
DEFINE_int64(handshake_timeout_ms, 5000, "cut a client that has not finished Hello..Ready by then");
DEFINE_int64(keepalive_ms, 1000, "keepalive interval on control connections (0 disables)");
DEFINE_uint32(keepalive_misses, 3, "cut a session silent for this many keepalive intervals");
DEFINE_int64(shutdown_timeout_ms, 10000, "bound on draining sessions at SIGTERM");
DEFINE_uint32(dedupe_window, 1024, "applied writes remembered per client id (>= 1024)");
DEFINE_uint32(max_client_records, 4096,
              "dedupe records of departed client ids kept for their reconnect (a client "
              "that closes for good takes its record with it)");
DEFINE_uint32(spin_us, 20,
              "busy-poll the CQ this long after activity before sleeping on the completion "
              "channel");
DEFINE_uint32(spin_max_us, 0,
              "adaptive busy polling: while requests follow each other within this many us, "
              "spin up to this long instead of --spin_us (CPU cost: up to this per quiet spell "
              "while clients are active); 0 keeps a fixed --spin_us");
DEFINE_bool(group_commit, true,
            "apply the PUTs and DELETEs of a poll round in one durable write (one WAL sync); "
            "false: each one alone as it arrives");
DEFINE_uint32(qp_timeout, 12,
              "local ACK timeout exponent of client QPs (4.096 us * 2^N per try, 0..31)");
DEFINE_uint32(qp_retry_cnt, 2, "transport retries of client QPs (0..7)");
DEFINE_string(pid_file, "", "write the pid here after startup (removed at exit)");
DEFINE_string(admin_socket, "",
              "Unix socket for kvctl (default /run/kvnode/admin.sock, else "
              "$XDG_RUNTIME_DIR/kvnode/admin.sock, else /tmp/kvnode-$UID/admin.sock)");
DEFINE_string(metrics_listen, "",
              "serve GET /metrics over HTTP (what `kvctl metrics` prints) on this TCP address, "
              "host:port or [v6]:port (port 0 = any free port); a live upgrade hands the "
              "socket to the new process. Default: none");
DEFINE_string(log_level, "info", "least severity logged: info, warning, error");
DEFINE_uint64(generation, 1, "upgrade generation of this process (set by the upgrade module)");
DEFINE_string(build_id, "",
              "build identification shown in stats and ping and logged by upgrades (default: the "
              "version and git build id, as --version prints them)");
DEFINE_bool(print_build_id, false,
            "print the build id this binary's node reports (--build_id or the built-in one) "
            "and exit; kvctl cluster roll runs it to learn a new binary's build");
DEFINE_string(upgrade_binary, "",
              "binary a live upgrade (SIGUSR2, kvctl upgrade) execs (default: the path this "
              "process was started from, resolved at start)");
DEFINE_string(upgrade_handoff, "",
              "internal: FD:PID of the handoff channel, given by the old process to the new one");
DEFINE_string(upgrade_fault, "",
              "tests: PHASE:ACTION[,...] fault injection in live upgrades (ACTION = crash | hang "
              "| fail; phases in docs/upgrade.md)");
DEFINE_string(upgrade_test_incompatible, "",
              "tests: make this binary incompatible for a handoff: layout | protocol | struct | "
              "capability");
DEFINE_int64(upgrade_move_deadline_ms, 5000,
             "live upgrade: a client that has not acknowledged Move by then is cut");
DEFINE_int64(upgrade_hello_deadline_ms, 30000,
             "live upgrade: the new process must have validated the header and said Hello by "
             "then (exec of a large binary is slow under emulation)");
DEFINE_int64(upgrade_ready_deadline_ms, 60000,
             "live upgrade: the new process must be registered and Ready by then");
DEFINE_int64(upgrade_pause_deadline_ms, 10000,
             "live upgrade: writes in flight must be finished this long after the pause");
DEFINE_int64(upgrade_owned_deadline_ms, 30000,
             "live upgrade: the new process must be the writer (Owned) this long after HandOver");
DEFINE_int64(upgrade_old_exit_deadline_ms, 30000,
             "live upgrade: the new process kills an old one still alive (or that has not "
             "released RocksDB) this long after Owned");
DEFINE_int64(upgrade_write_pause_limit_ms, 20000,
             "live upgrade: longest write pause; without Owned by then the old process rolls "
             "back (its watchdog does it if the upgrade thread is stuck)");
DEFINE_int64(upgrade_step_deadline_ms, 30000,
             "live upgrade: deadline of the old process's steps that have none of their own "
             "(memtable flush, RocksDB close); the watchdog rolls back 2 s after it");
DEFINE_string(cluster, "",
              "make this node a member of the cluster NAME ([A-Za-z0-9._-], 1..64 bytes) whose "
              "membership and shard map live in etcd (needs --etcd_endpoints): it serves only the "
              "slots the map gives it and keeps a leased member key; empty: a single node that "
              "serves every key, no etcd");
DEFINE_string(etcd_endpoints, "",
              "--cluster: etcd's client endpoints, host:port[,host:port...] (plain gRPC, no URL "
              "scheme). The node serves its last map from --db_path while etcd is unreachable");
DEFINE_string(node_id, "",
              "--cluster: this node's id in the shard map ([A-Za-z0-9._-], 1..64 bytes). Required "
              "at the first cluster start of a database, which records it (DB/cluster-identity); "
              "later starts may omit it, and a database of another node or cluster is refused");
DEFINE_int64(etcd_lease_ttl_s, 3,
             "--cluster: TTL of the member key's etcd lease, 2..60 s (renewed every third of "
             "it): a node that dies is gone from the cluster this long after");

namespace {

// Replaces this process by a cold start of the same binary and flags as
// `generation`: what a supervisor would do once nothing serves, done at once
// and under the same pid. Returns only if the exec failed.
void RestartCold(const std::vector<std::string>& start_argv, uint64_t generation) {
  std::vector<std::string> args = kvnode::upgrade::WithoutHandoffArg(start_argv);
  args.push_back(absl::StrCat("--generation=", generation));
  std::vector<char*> argvp = kvnode::upgrade::ExecArgv(args);
  google::FlushLogFiles(google::GLOG_INFO);
  execv("/proc/self/exe", argvp.data());
  PLOG(ERROR) << "kvnode: exec /proc/self/exe for a cold start";
}

// The cluster agent for `options` (--cluster): the server's own checks
// first, so that a node refused for its flags or token touches nothing,
// then the identity in the database directory and the persisted map.
absl::StatusOr<std::unique_ptr<kvnode::node::ClusterAgent>> CreateClusterAgent(
    const kvnode::server::ServerOptions& o, kvnode::node::ClusterAgentOptions options) {
  if (absl::Status s = o.Validate(); !s.ok()) return s;
  if (!o.auth_token_file.empty()) {
    if (absl::Status s = kvnode::server::ReadAuthTokenFile(o.auth_token_file).status(); !s.ok()) {
      return s;
    }
  }
  options.build_id = o.build_id;
  options.version = kvnode::base::kVersion;
  return kvnode::node::ClusterAgent::Create(std::move(options));
}

// The error counters a fleet roll's health gate watches (cluster/member.h).
kvnode::cluster::MemberHealth Health(kvnode::server::Server& server,
                                     const kvnode::upgrade::UpgradeMetrics& upgrade) {
  using kvnode::server::Counter;
  using kvnode::server::ErrorKind;
  const kvnode::server::CounterSnapshot c = server.metrics().Snapshot();
  kvnode::cluster::MemberHealth h;
  for (ErrorKind k : {ErrorKind::kRpcMalformed, ErrorKind::kRpcOversize, ErrorKind::kRpcWrongClient,
                      ErrorKind::kRpcUnknownOpcode, ErrorKind::kRpcTooOld}) {
    h.rejected += c.of(k);
  }
  h.qp_errors = c.of(ErrorKind::kQpError);
  h.upgrade_failures =
      c.of(Counter::kRollbacks) + upgrade.Get(kvnode::upgrade::UpgradeMetrics::kRefused);
  return h;
}

}  // namespace

int main(int argc, char** argv) {
  // Everything the node creates is its user's only: RocksDB's directory and
  // files (which follow the umask: 0755/0644 under the usual 022 would let any
  // local user read every value), the pid file, sockets. Set before anything
  // is created, so RocksDB's threads and an upgrade's exec inherit it. Files
  // that must be private whatever the umask (arena, admin socket) also set
  // their mode explicitly.
  umask(077);
  // So that no log line reads /etc/localtime under glibc's time-zone lock
  // (base/time_zone.h); an upgrade's exec inherits TZ.
  kvnode::base::PinLocalTimeZone();
  // The argv a live upgrade restarts with (before gflags removes anything).
  const std::vector<std::string> start_argv(argv, argv + argc);
  gflags::SetUsageMessage(
      "RDMA key-value storage node.\n"
      "  kvnode --db_path DIR [--listen HOST:PORT] [--admin_socket PATH] ...\n"
      "  kvnode --db_path DIR --cluster NAME --etcd_endpoints HOST:PORT --node_id ID ...\n"
      "GETs are served by one-sided RDMA READs of a shared-memory arena; PUT/DELETE by RPC\n"
      "into RocksDB. SIGTERM/SIGINT stop it cleanly. Flags:");
  gflags::SetVersionString(kvnode::base::kVersionString);
  // --help lists this program's own flags; --helpfull adds gflags' and glog's.
  gflags::ParseCommandLineNonHelpFlags(&argc, &argv, true);
  if (FLAGS_help) {
    FLAGS_help = false;
    FLAGS_helpmatch = __FILE__;
  }
  gflags::HandleCommandLineHelpFlags();
  FLAGS_logtostderr = true;
  if (FLAGS_log_level == "info") {
    FLAGS_minloglevel = 0;
  } else if (FLAGS_log_level == "warning") {
    FLAGS_minloglevel = 1;
  } else if (FLAGS_log_level == "error") {
    FLAGS_minloglevel = 2;
  } else {
    std::cerr << "--log_level: must be info, warning or error\n";
    return 2;
  }
  if (FLAGS_print_build_id) {
    std::cout << (FLAGS_build_id.empty() ? kvnode::base::kVersionString : FLAGS_build_id) << "\n";
    return 0;
  }
  google::InitGoogleLogging(argv[0]);
  if (argc > 1) {
    LOG(ERROR) << "unexpected argument '" << argv[1] << "' (see --help)";
    return 2;
  }

  kvnode::server::ServerOptions o;
  o.listen = FLAGS_listen;
  o.advertise_address = FLAGS_advertise_address;
  o.rdma_device = FLAGS_rdma_device;
  o.rdma_port = FLAGS_rdma_port;
  o.gid_index = FLAGS_gid_index;
  o.db_path = FLAGS_db_path;
  o.sync_writes = FLAGS_sync_writes;
  o.arena_size = FLAGS_arena_size;
  o.arena_path = FLAGS_arena_path;
  o.shm_name = FLAGS_shm_name;
  o.keep_arena = FLAGS_keep_arena;
  o.max_chain_buckets = FLAGS_max_chain_buckets;
  o.upgrade_journal_mb = FLAGS_upgrade_journal_mb;
  o.auth_token_file = FLAGS_auth_token_file;
  o.max_clients = FLAGS_max_clients;
  o.rpc_credits = FLAGS_rpc_credits;
  o.memory_windows = FLAGS_memory_windows;
  o.handshake_timeout = absl::Milliseconds(FLAGS_handshake_timeout_ms);
  o.keepalive_interval = absl::Milliseconds(FLAGS_keepalive_ms);
  o.keepalive_misses = FLAGS_keepalive_misses;
  o.shutdown_timeout = absl::Milliseconds(FLAGS_shutdown_timeout_ms);
  o.dedupe_window = FLAGS_dedupe_window;
  o.max_client_records = FLAGS_max_client_records;
  o.spin_us = FLAGS_spin_us;
  o.spin_max_us = FLAGS_spin_max_us;
  o.group_commit = FLAGS_group_commit;
  o.qp_timeout = FLAGS_qp_timeout;
  o.qp_retry_cnt = FLAGS_qp_retry_cnt;
  o.pid_file = FLAGS_pid_file;
  o.admin_socket = FLAGS_admin_socket;
  o.metrics_listen = FLAGS_metrics_listen;
  o.generation = FLAGS_generation;
  o.build_id = FLAGS_build_id.empty() ? std::string(kvnode::base::kVersionString) : FLAGS_build_id;

  namespace up = kvnode::upgrade;
  absl::StatusOr<up::FaultPlan> plan = up::FaultPlan::Parse(FLAGS_upgrade_fault);
  if (!plan.ok()) {
    LOG(ERROR) << "--upgrade_fault: " << plan.status();
    return 2;
  }
  up::SetFaultPlan(*plan);
  up::NodeUpgradeOptions uo;
  absl::StatusOr<up::Compat> compat = up::NodeCompat(FLAGS_upgrade_test_incompatible);
  if (!compat.ok()) {
    LOG(ERROR) << "--upgrade_test_incompatible: " << compat.status();
    return 2;
  }
  uo.compat = *compat;
  uo.argv = start_argv;
  uo.build_id = o.build_id;
  uo.shm_name = o.shm_name;
  uo.move_deadline = absl::Milliseconds(FLAGS_upgrade_move_deadline_ms);
  uo.hello_deadline = absl::Milliseconds(FLAGS_upgrade_hello_deadline_ms);
  uo.ready_deadline = absl::Milliseconds(FLAGS_upgrade_ready_deadline_ms);
  uo.pause_deadline = absl::Milliseconds(FLAGS_upgrade_pause_deadline_ms);
  uo.owned_deadline = absl::Milliseconds(FLAGS_upgrade_owned_deadline_ms);
  uo.old_exit_deadline = absl::Milliseconds(FLAGS_upgrade_old_exit_deadline_ms);
  uo.write_pause_limit = absl::Milliseconds(FLAGS_upgrade_write_pause_limit_ms);
  uo.step_deadline = absl::Milliseconds(FLAGS_upgrade_step_deadline_ms);
  absl::StatusOr<std::string> binary = FLAGS_upgrade_binary.empty()
                                           ? up::ResolveStartBinary(start_argv[0])
                                           : up::CheckUpgradeBinary(FLAGS_upgrade_binary);
  if (binary.ok()) {
    uo.binary = *binary;
  } else {
    LOG(WARNING) << "live upgrades without an explicit binary are refused: " << binary.status();
  }
  if (absl::Status s = uo.Validate(); !s.ok()) {
    LOG(ERROR) << "kvnode: upgrade options: " << s;
    return 2;
  }

  // Cluster membership: identity and the persisted map before anything
  // listens (the listener serves that map even when etcd is down).
  kvnode::node::ClusterFlags cluster_flags;
  cluster_flags.cluster = FLAGS_cluster;
  cluster_flags.etcd_endpoints = FLAGS_etcd_endpoints;
  cluster_flags.node_id = FLAGS_node_id;
  cluster_flags.etcd_lease_ttl_s = FLAGS_etcd_lease_ttl_s;
  cluster_flags.etcd_lease_ttl_given =
      !gflags::GetCommandLineFlagInfoOrDie("etcd_lease_ttl_s").is_default;
  absl::StatusOr<std::optional<kvnode::node::ClusterAgentOptions>> cluster_options =
      kvnode::node::ClusterOptionsFromFlags(cluster_flags, o.db_path);
  if (!cluster_options.ok()) {
    LOG(ERROR) << cluster_options.status();
    return 2;
  }
  std::unique_ptr<kvnode::node::ClusterAgent> agent;
  if (cluster_options->has_value()) {
    absl::StatusOr<std::unique_ptr<kvnode::node::ClusterAgent>> created =
        CreateClusterAgent(o, **cluster_options);
    if (!created.ok()) {
      LOG(ERROR) << "kvnode: cannot start: " << created.status();
      return 2;
    }
    agent = std::move(*created);
    o.shard_gate = agent->gate();
    uo.cluster = agent.get();
  }

  up::UpgradeMetrics upgrade_metrics;
  std::unique_ptr<kvnode::server::Server> server;
  std::unique_ptr<up::NewSideTail> tail;
  if (!FLAGS_upgrade_handoff.empty()) {
    auto taken = up::TakeOver(o, FLAGS_upgrade_handoff, uo, &upgrade_metrics);
    if (!taken.ok()) {
      // Nothing of the old process's was disturbed; leave without running
      // destructors that could touch the shared arena.
      LOG(ERROR) << "kvnode: not taking over: " << taken.status();
      if (std::optional<uint64_t> g = up::ColdStartGeneration(taken.status())) {
        // The old process died before HandOver and the takeover failed
        // (e.g. O died inside the arena's heap allocator): a cold start
        // rebuilds the arena from RocksDB and serves the same port.
        LOG(WARNING) << "kvnode: nothing serves: starting again cold as generation " << *g;
        RestartCold(start_argv, *g);
      }
      google::FlushLogFiles(google::GLOG_INFO);
      _exit(absl::IsFailedPrecondition(taken.status()) ? 2 : 4);
    }
    server = std::move(taken->first);
    tail = std::move(taken->second);
  } else {
    // A header left by a process that crashed mid-upgrade is stale now.
    if (absl::StatusOr<std::string> h = up::HandoffHeaderShmName(o.shm_name); h.ok()) {
      (void)up::RemoveHandoffHeader(*h);
    }
    absl::StatusOr<std::unique_ptr<kvnode::server::Server>> created =
        kvnode::server::Server::Create(o);
    if (!created.ok()) {
      LOG(ERROR) << "kvnode: cannot start: " << created.status();
      return 1;
    }
    server = std::move(*created);
    if (agent != nullptr) {
      absl::StatusOr<std::string> endpoint = server->advertised_endpoint();
      absl::Status s = endpoint.status();
      if (s.ok()) s = agent->Start(*endpoint, server->generation());
      if (!s.ok()) {
        LOG(ERROR) << "kvnode: cannot start the cluster membership: " << s;
        return 1;
      }
    }
    (void)up::SdNotifyReady();
  }
  up::OldSide old_side(server.get(), uo, &upgrade_metrics);
  old_side.Install();
  if (agent != nullptr) {
    server->SetExtraStats([&upgrade_metrics, a = agent.get()] {
      std::vector<kvnode::server::ExtraStat> rows = upgrade_metrics.Render();
      std::vector<kvnode::server::ExtraStat> more = a->Stats();
      rows.insert(rows.end(), more.begin(), more.end());
      return rows;
    });
    // A new process says "serving" once the old one is gone (NewSideTail).
    if (tail == nullptr) server->RunOnControlThread([a = agent.get()] { a->MarkServing(); });
    agent->SetHealth(
        [&upgrade_metrics, srv = server.get()] { return Health(*srv, upgrade_metrics); });
    agent->SetUpgrade([&old_side](const std::string& binary, std::function<void(std::string)> r) {
      old_side.Request(binary, std::move(r));
    });
    agent->SetGuard([srv = server.get()](bool up, std::function<void(absl::Status)> done) {
      srv->RunOnControlThread([srv, up, done = std::move(done)]() mutable {
        if (!up) {
          srv->LowerGuard();
          done(absl::OkStatus());
          return;
        }
        srv->RaiseGuard(absl::Seconds(kvnode::server::kDefaultGuardAckTimeoutS), std::move(done));
      });
    });
  }
  if (tail != nullptr) tail->Start(old_side.busy_flag());
  const uint64_t generation = server->generation();
  absl::Status s = server->Run();
  const int code = old_side.FinishAfterRun(s);
  tail.reset();
  // Revokes the lease (the member key goes at once) unless a new process
  // took it over.
  if (agent != nullptr) agent->Stop();
  server.reset();
  if (!s.ok()) LOG(ERROR) << "kvnode: unclean exit: " << s;
  LOG(INFO) << "kvnode: exit " << code << " (pid " << getpid() << ", generation " << generation
            << ")";
  return code;
}
