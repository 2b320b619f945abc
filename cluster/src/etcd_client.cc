#include "kvnode/cluster/etcd_client.h"

#include <chrono>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "etcd_impl.h"
#include "kvnode/base/errno.h"
#include "kvnode/cluster/keys.h"

namespace kvnode::cluster {
namespace {

using base::Av;

absl::Status CheckEndpoint(std::string_view ep) {
  if (ep.find("://") != std::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--etcd_endpoints: '", Av(ep), "' is a URL; give host:port (etcd's client port)"));
  }
  size_t colon = ep.rfind(':');
  uint32_t port = 0;
  if (colon == std::string_view::npos || colon == 0 ||
      !absl::SimpleAtoi(Av(ep.substr(colon + 1)), &port) || port == 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--etcd_endpoints: '", Av(ep), "' is not host:port"));
  }
  return absl::OkStatus();
}

// Keepalive pings find a dead connection under an idle watch; short
// reconnect backoff lets a restarted etcd be used within a second or so
// (gRPC's default backoff grows to two minutes). gRPC also takes the minimum
// backoff as each connection attempt's deadline: 1 s lets a busy etcd finish
// its handshake.
grpc::ChannelArguments ChannelArgs() {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5000);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 0);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 1000);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  args.SetInt(GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH, 64 << 20);
  return args;
}

EtcdConn MakeConn(const std::string& endpoint) {
  EtcdConn c;
  c.endpoint = endpoint;
  c.channel =
      grpc::CreateCustomChannel(endpoint, grpc::InsecureChannelCredentials(), ChannelArgs());
  c.kv = etcdserverpb::KV::NewStub(c.channel);
  c.lease = etcdserverpb::Lease::NewStub(c.channel);
  c.watch = etcdserverpb::Watch::NewStub(c.channel);
  c.maintenance = etcdserverpb::Maintenance::NewStub(c.channel);
  return c;
}

}  // namespace

absl::Status EtcdClientOptions::Validate() const {
  if (endpoints.empty()) return absl::InvalidArgumentError("--etcd_endpoints is empty");
  for (const auto& ep : endpoints) {
    if (auto s = CheckEndpoint(ep); !s.ok()) return s;
  }
  if (rpc_deadline <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("etcd rpc deadline must be positive");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> ParseEndpoints(std::string_view list) {
  std::vector<std::string> out;
  for (absl::string_view ep : absl::StrSplit(Av(list), ',', absl::SkipWhitespace())) {
    std::string e(ep);
    if (auto s = CheckEndpoint(e); !s.ok()) return s;
    out.push_back(std::move(e));
  }
  if (out.empty()) return absl::InvalidArgumentError("--etcd_endpoints is empty");
  return out;
}

absl::Status FromGrpc(const grpc::Status& s, std::string_view op, std::string_view key) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                      absl::StrCat("etcd ", Av(op), " ", Av(key), ": ", s.error_message()));
}

absl::StatusOr<KeyValue> FromProto(const mvccpb::KeyValue& kv, size_t max_value_size) {
  if (kv.value().size() > max_value_size) {
    return absl::ResourceExhaustedError(
        absl::StrCat("etcd value at ", kv.key(), " has ", kv.value().size(),
                     " bytes, above the limit of ", max_value_size));
  }
  return KeyValue{kv.key(),          kv.value(),   kv.create_revision(),
                  kv.mod_revision(), kv.version(), kv.lease()};
}

absl::StatusOr<std::unique_ptr<EtcdClient>> EtcdClient::Connect(const EtcdClientOptions& options) {
  if (auto s = options.Validate(); !s.ok()) return s;
  std::vector<EtcdConn> conns;
  for (const auto& ep : options.endpoints) conns.push_back(MakeConn(ep));
  return std::unique_ptr<EtcdClient>(new GrpcEtcdClient(options, std::move(conns)));
}

GrpcEtcdClient::GrpcEtcdClient(EtcdClientOptions options, std::vector<EtcdConn> conns)
    : EtcdClient(std::move(options)), conns_(std::move(conns)) {}

void GrpcEtcdClient::Failed(const absl::Status& s) {
  if (conns_.size() > 1 &&
      (absl::IsUnavailable(s) || absl::IsDeadlineExceeded(s) || absl::IsCancelled(s))) {
    current_.fetch_add(1);
  }
}

// wait_for_ready: a call made while the channel is reconnecting waits (up to
// its deadline) instead of failing at once. It matters beyond latency: with
// gRPC's synchronous API a connection attempt only makes progress while some
// call polls, so fail-fast calls against a channel in TRANSIENT_FAILURE can
// keep it from ever reconnecting.
void GrpcEtcdClient::SetDeadline(grpc::ClientContext* ctx) const {
  ctx->set_wait_for_ready(true);
  ctx->set_deadline(std::chrono::system_clock::now() +
                    absl::ToChronoNanoseconds(options().rpc_deadline));
}

}  // namespace kvnode::cluster
