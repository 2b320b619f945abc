// GrpcEtcdClient's lease calls and the maintenance status.
#include "absl/strings/str_cat.h"
#include "etcd_impl.h"

namespace kvnode::cluster {
namespace {

std::string LeaseName(int64_t lease) { return absl::StrCat("lease ", lease); }

absl::Status Expired(int64_t lease) {
  return absl::NotFoundError(absl::StrCat("etcd lease ", lease, " expired"));
}

}  // namespace

absl::StatusOr<LeaseGrantResult> GrpcEtcdClient::LeaseGrant(int64_t ttl_s) {
  etcdserverpb::LeaseGrantRequest req;
  req.set_ttl(ttl_s);
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  etcdserverpb::LeaseGrantResponse resp;
  auto s = FromGrpc(conn().lease->LeaseGrant(&ctx, req, &resp), "LeaseGrant",
                    absl::StrCat("ttl ", ttl_s, " s"));
  if (!s.ok()) {
    Failed(s);
    return s;
  }
  if (!resp.error().empty()) {
    return absl::UnavailableError(absl::StrCat("etcd LeaseGrant: ", resp.error()));
  }
  return LeaseGrantResult{resp.id(), resp.ttl()};
}

// A keepalive stream per call: a stream bound to one endpoint would have to be
// torn down and rebuilt on every etcd failure anyway, and one round trip per
// ttl/3 costs nothing.
absl::StatusOr<int64_t> GrpcEtcdClient::LeaseKeepAliveOnce(int64_t lease) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  auto stream = conn().lease->LeaseKeepAlive(&ctx);
  etcdserverpb::LeaseKeepAliveRequest req;
  req.set_id(lease);
  etcdserverpb::LeaseKeepAliveResponse resp;
  bool got = stream->Write(req) && stream->WritesDone() && stream->Read(&resp);
  if (got) {
    ctx.TryCancel();  // the server keeps its side open; we have our answer
    stream->Finish().ok();
    if (resp.ttl() <= 0) return Expired(lease);
    return resp.ttl();
  }
  auto s = FromGrpc(stream->Finish(), "LeaseKeepAlive", LeaseName(lease));
  if (s.ok()) s = absl::UnavailableError("etcd LeaseKeepAlive: stream closed without an answer");
  Failed(s);
  return s;
}

absl::Status GrpcEtcdClient::LeaseRevoke(int64_t lease) {
  etcdserverpb::LeaseRevokeRequest req;
  req.set_id(lease);
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  etcdserverpb::LeaseRevokeResponse resp;
  auto s = FromGrpc(conn().lease->LeaseRevoke(&ctx, req, &resp), "LeaseRevoke", LeaseName(lease));
  Failed(s);
  return s;
}

absl::StatusOr<int64_t> GrpcEtcdClient::LeaseTimeToLive(int64_t lease) {
  etcdserverpb::LeaseTimeToLiveRequest req;
  req.set_id(lease);
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  etcdserverpb::LeaseTimeToLiveResponse resp;
  auto s = FromGrpc(conn().lease->LeaseTimeToLive(&ctx, req, &resp), "LeaseTimeToLive",
                    LeaseName(lease));
  if (!s.ok()) {
    Failed(s);
    return s;
  }
  if (resp.ttl() < 0) return Expired(lease);
  return resp.ttl();
}

absl::StatusOr<EtcdHealth> GrpcEtcdClient::Health() {
  const EtcdConn& c = conn();
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  etcdserverpb::StatusResponse resp;
  auto s = FromGrpc(c.maintenance->Status(&ctx, etcdserverpb::StatusRequest(), &resp), "Status",
                    c.endpoint);
  if (!s.ok()) {
    Failed(s);
    return s;
  }
  return EtcdHealth{c.endpoint, resp.version(), resp.header().revision(), resp.dbsize(),
                    resp.leader()};
}

std::unique_ptr<Watcher> GrpcEtcdClient::Watch(std::string prefix, int64_t from_revision,
                                               WatchCallbacks callbacks) {
  return StartWatcher(this, std::move(prefix), from_revision, std::move(callbacks));
}

}  // namespace kvnode::cluster
