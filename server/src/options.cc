#include "kvnode/server/options.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kvnode/base/own_dir.h"
#include "kvnode/proto/control.h"
#include "kvnode/storage/format.h"

namespace kvnode::server {
namespace {

absl::Status Bad(const char* flag, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat("--", flag, ": ", why));
}

// Creates `dir` with mode 0700 if missing; OK if it exists, is ours and is a
// directory that nobody else can access, and we can write it.
absl::Status EnsurePrivateDir(const std::string& dir) {
  if (absl::Status s = base::EnsureOwnDirectory("the default --admin_socket", dir, 0077); !s.ok()) {
    return s;
  }
  if (access(dir.c_str(), W_OK | X_OK) != 0) {
    return absl::PermissionDeniedError(absl::StrCat(dir, " is not writable"));
  }
  return absl::OkStatus();
}

// True for a numeric host that means "every address" (0.0.0.0 in any
// spelling inet_aton accepts, "::", "::ffff:0.0.0.0"). Names are not
// resolved: a name is taken as specific.
bool IsWildcardHost(const std::string& host) {
  addrinfo hints{};
  hints.ai_flags = AI_NUMERICHOST;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0) return false;
  bool any = false;
  for (const addrinfo* a = res; a != nullptr; a = a->ai_next) {
    if (a->ai_family == AF_INET) {
      any |= reinterpret_cast<const sockaddr_in*>(a->ai_addr)->sin_addr.s_addr == INADDR_ANY;
    } else if (a->ai_family == AF_INET6) {
      const in6_addr& v6 = reinterpret_cast<const sockaddr_in6*>(a->ai_addr)->sin6_addr;
      const uint8_t* b = v6.s6_addr;
      any |= IN6_IS_ADDR_UNSPECIFIED(&v6) ||
             (IN6_IS_ADDR_V4MAPPED(&v6) && (b[12] | b[13] | b[14] | b[15]) == 0);
    }
  }
  freeaddrinfo(res);
  return any;
}

// --advertise_address split up; port 0 = the port listened on.
absl::StatusOr<proto::HostPort> ParseAdvertise(const std::string& a) {
  // Room for ":65535" when the port is added (Move.endpoint's limit).
  if (a.size() > proto::kMaxEndpointSize - 6) {
    return absl::InvalidArgumentError(
        absl::StrCat("longer than ", proto::kMaxEndpointSize - 6, " bytes"));
  }
  if (absl::StatusOr<proto::HostPort> hp = proto::ParseHostPort(a); hp.ok()) return hp;
  proto::HostPort hp;
  if (a.size() > 2 && a.front() == '[' && a.back() == ']' &&
      a.find_first_of("[]", 1) == a.size() - 1) {
    hp.host = a.substr(1, a.size() - 2);
  } else if (!a.empty() && a.find_first_of(":[]") == std::string::npos) {
    hp.host = a;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("'", a.substr(0, 64),
                     "': expected HOST, HOST:PORT, [IPV6] or [IPV6]:PORT (port 1..65535)"));
  }
  for (const char c : hp.host) {
    if (c <= ' ' || c == '/' || c == 0x7f) {
      return absl::InvalidArgumentError(
          absl::StrCat("'", a.substr(0, 64), "': the host has a space, control character or '/'"));
    }
  }
  return hp;
}

std::string JoinHostPort(const std::string& host, uint16_t port) {
  return host.find(':') != std::string::npos ? absl::StrCat("[", host, "]:", port)
                                             : absl::StrCat(host, ":", port);
}

}  // namespace

absl::Status ServerOptions::Validate() const {
  // Port 0 (any free port) is allowed for tests; ParseHostPort refuses it,
  // so the host is checked with a port it accepts.
  const bool any_port = listen.size() > 2 && listen.substr(listen.size() - 2) == ":0";
  absl::StatusOr<proto::HostPort> listen_hp =
      proto::ParseHostPort(any_port ? listen.substr(0, listen.size() - 1) + "1" : listen);
  if (!listen_hp.ok()) return Bad("listen", std::string(listen_hp.status().message()));
  if (!advertise_address.empty()) {
    absl::StatusOr<proto::HostPort> a = ParseAdvertise(advertise_address);
    if (!a.ok()) return Bad("advertise_address", std::string(a.status().message()));
    if (IsWildcardHost(a->host)) {
      return Bad("advertise_address",
                 absl::StrCat(a->host,
                              " is a wildcard address; give the address clients reach "
                              "this node at"));
    }
  } else if (IsWildcardHost(listen_hp->host)) {
    return Bad("advertise_address",
               absl::StrCat("required when --listen ", listen,
                            " is a wildcard address: a live upgrade tells every client where to "
                            "reconnect, and ",
                            listen_hp->host,
                            " would send a remote client to its own host; give the address "
                            "clients reach this node at, e.g. --advertise_address=192.0.2.10"));
  }
  if (!metrics_listen.empty()) {
    const bool any =
        metrics_listen.size() > 2 && metrics_listen.substr(metrics_listen.size() - 2) == ":0";
    absl::StatusOr<proto::HostPort> hp = proto::ParseHostPort(
        any ? metrics_listen.substr(0, metrics_listen.size() - 1) + "1" : metrics_listen);
    if (!hp.ok()) return Bad("metrics_listen", std::string(hp.status().message()));
  }
  if (rdma_port < 1 || rdma_port > 255) return Bad("rdma_port", "must be 1..255");
  if (gid_index < -1 || gid_index > 255) return Bad("gid_index", "must be -1 (auto) or 0..255");
  if (db_path.empty()) return Bad("db_path", "required (RocksDB directory)");
  if (arena_size < (uint64_t{1} << 20)) return Bad("arena_size", "must be at least 1 MiB");
  if (arena_size > (uint64_t{1} << 39)) return Bad("arena_size", "must be at most 512 GiB");
  if (max_chain_buckets < 1 || max_chain_buckets > storage::kMaxChainLength) {
    return Bad("max_chain_buckets", absl::StrCat("must be 1..", storage::kMaxChainLength));
  }
  if (upgrade_journal_mb < 2 || upgrade_journal_mb > 4096) {
    return Bad("upgrade_journal_mb", "must be 2..4096");
  }
  if (arena_path.empty() && (shm_name.empty() || shm_name.find('/') != std::string::npos)) {
    return Bad("shm_name", "must be a non-empty name without '/'");
  }
  if (max_clients < 1 || max_clients > 4096) return Bad("max_clients", "must be 1..4096");
  if (rpc_credits < 1 || rpc_credits > 256) return Bad("rpc_credits", "must be 1..256");
  if (!ParseWindowMode(memory_windows).ok()) {
    return Bad("memory_windows", "must be auto, on or off");
  }
  if (handshake_timeout <= absl::ZeroDuration() || handshake_timeout > absl::Minutes(10)) {
    return Bad("handshake_timeout_ms", "must be 1 ms .. 10 min");
  }
  if (keepalive_interval < absl::ZeroDuration()) {
    return Bad("keepalive_ms", "must be >= 0 (0 disables)");
  }
  if (keepalive_misses < 1 || keepalive_misses > 1000) {
    return Bad("keepalive_misses", "must be 1..1000");
  }
  if (shutdown_timeout <= absl::ZeroDuration() || shutdown_timeout > absl::Minutes(10)) {
    return Bad("shutdown_timeout_ms", "must be 1 ms .. 10 min");
  }
  if (dedupe_window < 1024 || dedupe_window > (1u << 20)) {
    return Bad("dedupe_window", "must be 1024..1048576 (the contract asks for >= 1024)");
  }
  if (max_client_records < max_clients) {
    return Bad("max_client_records", "must be >= --max_clients");
  }
  if (spin_us > 1000000) return Bad("spin_us", "must be <= 1000000");
  if (spin_max_us > 1000000) return Bad("spin_max_us", "must be <= 1000000");
  if (spin_max_us != 0 && spin_max_us <= spin_us) {
    return Bad("spin_max_us", "must be 0 (a fixed --spin_us) or greater than --spin_us");
  }
  if (qp_timeout > 31) return Bad("qp_timeout", "must be 0..31");
  if (qp_retry_cnt > 7) return Bad("qp_retry_cnt", "must be 0..7");
  if (generation == 0) return absl::InvalidArgumentError("generation must be >= 1");
  return absl::OkStatus();
}

absl::StatusOr<std::string> AdvertisedEndpoint(const std::string& advertise,
                                               const std::string& bound_listen) {
  absl::StatusOr<proto::HostPort> bound = proto::ParseHostPort(bound_listen);
  if (!bound.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("bound listen address: ", bound.status().message()));
  }
  if (advertise.empty()) {
    if (IsWildcardHost(bound->host)) {
      return absl::FailedPreconditionError(
          absl::StrCat("--advertise_address is required: the listener is bound to the wildcard "
                       "address ",
                       bound_listen, ", which is no address to send clients to"));
    }
    return bound_listen;
  }
  absl::StatusOr<proto::HostPort> a = ParseAdvertise(advertise);
  if (!a.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("--advertise_address: ", a.status().message()));
  }
  if (IsWildcardHost(a->host)) {
    return absl::FailedPreconditionError(
        absl::StrCat("--advertise_address: ", a->host, " is a wildcard address"));
  }
  return JoinHostPort(a->host, a->port != 0 ? a->port : bound->port);
}

absl::StatusOr<WindowMode> ParseWindowMode(const std::string& s) {
  if (s == "auto") return WindowMode::kAuto;
  if (s == "on") return WindowMode::kOn;
  if (s == "off") return WindowMode::kOff;
  return absl::InvalidArgumentError(absl::StrCat("unknown window mode '", s, "'"));
}

absl::StatusOr<std::string> DefaultAdminSocketPath() {
  if (EnsurePrivateDir("/run/kvnode").ok()) return std::string("/run/kvnode/admin.sock");
  if (const char* xdg = std::getenv("XDG_RUNTIME_DIR"); xdg != nullptr && xdg[0] == '/') {
    const std::string dir = absl::StrCat(xdg, "/kvnode");
    if (EnsurePrivateDir(dir).ok()) return dir + "/admin.sock";
  }
  const std::string dir = absl::StrCat("/tmp/kvnode-", geteuid());
  if (absl::Status s = EnsurePrivateDir(dir); !s.ok()) return s;
  return dir + "/admin.sock";
}

absl::Status EnsureAdminSocketDir(const std::string& socket_path) {
  return EnsureNodeFileDir("--admin_socket", socket_path);
}

absl::Status EnsureNodeFileDir(const char* flag, const std::string& path) {
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? std::string(".")
                          : slash == 0               ? std::string("/")
                                                     : path.substr(0, slash);
  return base::EnsureOwnDirectory(absl::StrCat(flag, " ", path), dir, 0077);
}

absl::StatusOr<std::string> ReadAuthTokenFile(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) {
    return absl::NotFoundError(
        absl::StrCat("--auth_token_file ", path, ": open: ", strerror(errno)));
  }
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return absl::InvalidArgumentError(
        absl::StrCat("--auth_token_file ", path, ": not a regular file"));
  }
  if ((st.st_mode & 0077) != 0) {
    close(fd);
    return absl::PermissionDeniedError(absl::StrCat("--auth_token_file ", path, ": mode ",
                                                    absl::StrFormat("%03o", st.st_mode & 0777),
                                                    " lets group/others access it; chmod 600 it"));
  }
  std::string token;
  char buf[1024];
  for (;;) {
    const ssize_t n = read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      close(fd);
      return absl::InternalError(absl::StrCat("--auth_token_file ", path, ": ", strerror(err)));
    }
    if (n == 0) break;
    token.append(buf, static_cast<size_t>(n));
    if (token.size() > proto::kMaxAuthTokenSize + 2) break;
  }
  close(fd);
  while (!token.empty() && (token.back() == '\n' || token.back() == '\r')) token.pop_back();
  if (token.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("--auth_token_file ", path, ": empty token"));
  }
  if (token.size() > proto::kMaxAuthTokenSize) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--auth_token_file ", path, ": token longer than ", proto::kMaxAuthTokenSize, " bytes"));
  }
  return token;
}

}  // namespace kvnode::server
