// kvnode: the storage server process. Flags are copied into ServerOptions
// (server/include/kvnode/server/options.h documents each field).
#include <gflags/gflags.h>
#include <glog/logging.h>
#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <iostream>

#include "absl/time/time.h"
#include "kvnode/server/server.h"

DEFINE_string(listen, "127.0.0.1:7000",
              "TCP address of the control listener, host:port or [v6]:port (port 0 = any free "
              "port; the chosen one is logged and shown by `kvctl ping`)");
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
              "dedupe records of disconnected client ids kept for their reconnect");
DEFINE_uint32(spin_us, 20,
              "busy-poll the CQ this long after activity before sleeping on the completion "
              "channel");
DEFINE_string(pid_file, "", "write the pid here after startup (removed at exit)");
DEFINE_string(admin_socket, "",
              "Unix socket for kvctl (default /run/kvnode/admin.sock, else "
              "$XDG_RUNTIME_DIR/kvnode/admin.sock, else /tmp/kvnode-$UID/admin.sock)");
DEFINE_string(log_level, "info", "least severity logged: info, warning, error");
DEFINE_uint64(generation, 1, "upgrade generation of this process (set by the upgrade module)");
DEFINE_string(build_id, "", "build identification shown in stats (default: version)");

#ifndef KVNODE_VERSION
#define KVNODE_VERSION "dev"
#endif

int main(int argc, char** argv) {
  gflags::SetUsageMessage(
      "kvnode: RDMA key-value storage node.\n"
      "  kvnode --db_path DIR [--listen HOST:PORT] [--admin_socket PATH] ...\n"
      "GETs are served by one-sided RDMA READs of a shared-memory arena; PUT/DELETE by RPC\n"
      "into RocksDB. SIGTERM/SIGINT stop it cleanly. Flags:");
  gflags::SetVersionString(KVNODE_VERSION);
  gflags::ParseCommandLineFlags(&argc, &argv, true);
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
  google::InitGoogleLogging(argv[0]);
  if (argc > 1) {
    LOG(ERROR) << "unexpected argument '" << argv[1] << "' (see --help)";
    return 2;
  }

  kvnode::server::ServerOptions o;
  o.listen = FLAGS_listen;
  o.rdma_device = FLAGS_rdma_device;
  o.rdma_port = FLAGS_rdma_port;
  o.gid_index = FLAGS_gid_index;
  o.db_path = FLAGS_db_path;
  o.sync_writes = FLAGS_sync_writes;
  o.arena_size = FLAGS_arena_size;
  o.arena_path = FLAGS_arena_path;
  o.shm_name = FLAGS_shm_name;
  o.keep_arena = FLAGS_keep_arena;
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
  o.pid_file = FLAGS_pid_file;
  o.admin_socket = FLAGS_admin_socket;
  o.generation = FLAGS_generation;
  o.build_id = FLAGS_build_id.empty() ? std::string(KVNODE_VERSION) : FLAGS_build_id;

  absl::StatusOr<std::unique_ptr<kvnode::server::Server>> server =
      kvnode::server::Server::Create(o);
  if (!server.ok()) {
    LOG(ERROR) << "kvnode: cannot start: " << server.status();
    return 1;
  }
  absl::Status s = (*server)->Run();
  server->reset();
  if (!s.ok()) {
    LOG(ERROR) << "kvnode: unclean exit: " << s;
    return 3;
  }
  LOG(INFO) << "kvnode: exit 0";
  return 0;
}
