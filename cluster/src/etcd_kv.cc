// GrpcEtcdClient's key-value calls: Range, Put, DeleteRange, Txn, Compact.
#include "absl/strings/str_cat.h"
#include "etcd_impl.h"
#include "kvnode/base/errno.h"
#include "kvnode/cluster/keys.h"

namespace kvnode::cluster {

using base::Av;

absl::StatusOr<etcdserverpb::RangeResponse> GrpcEtcdClient::Range(
    const etcdserverpb::RangeRequest& req, std::string_view key) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  etcdserverpb::RangeResponse resp;
  auto s = FromGrpc(conn().kv->Range(&ctx, req, &resp), "Get", key);
  if (!s.ok()) {
    Failed(s);
    return s;
  }
  return resp;
}

absl::StatusOr<std::optional<KeyValue>> GrpcEtcdClient::Get(std::string_view key,
                                                            int64_t* revision) {
  etcdserverpb::RangeRequest req;
  req.set_key(std::string(key));
  auto resp = Range(req, key);
  if (!resp.ok()) return resp.status();
  if (revision != nullptr) *revision = resp->header().revision();
  if (resp->kvs_size() == 0) return std::nullopt;
  auto kv = FromProto(resp->kvs(0), options().max_value_size);
  if (!kv.ok()) return kv.status();
  return *kv;
}

absl::StatusOr<RangeResult> GrpcEtcdClient::GetPrefix(std::string_view prefix) {
  etcdserverpb::RangeRequest req;
  req.set_key(std::string(prefix));
  req.set_range_end(PrefixRangeEnd(prefix));
  auto resp = Range(req, prefix);
  if (!resp.ok()) return resp.status();
  RangeResult out;
  out.revision = resp->header().revision();
  for (const auto& kv : resp->kvs()) {
    auto one = FromProto(kv, options().max_value_size);
    if (!one.ok()) return one.status();
    out.kvs.push_back(std::move(*one));
  }
  return out;
}

absl::StatusOr<int64_t> GrpcEtcdClient::Put(std::string_view key, std::string_view value,
                                            int64_t lease) {
  etcdserverpb::PutRequest req;
  req.set_key(std::string(key));
  req.set_value(std::string(value));
  req.set_lease(lease);
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  etcdserverpb::PutResponse resp;
  auto s = FromGrpc(conn().kv->Put(&ctx, req, &resp), "Put", key);
  if (!s.ok()) {
    Failed(s);
    return s;
  }
  return resp.header().revision();
}

absl::StatusOr<int64_t> GrpcEtcdClient::Delete(std::string_view key) {
  etcdserverpb::DeleteRangeRequest req;
  req.set_key(std::string(key));
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  etcdserverpb::DeleteRangeResponse resp;
  auto s = FromGrpc(conn().kv->DeleteRange(&ctx, req, &resp), "Delete", key);
  if (!s.ok()) {
    Failed(s);
    return s;
  }
  return resp.deleted();
}

absl::StatusOr<CasResult> GrpcEtcdClient::PutIfModRevision(std::string_view key,
                                                           std::string_view value,
                                                           int64_t expected_mod_revision,
                                                           int64_t lease) {
  etcdserverpb::Compare cmp;
  cmp.set_target(etcdserverpb::Compare::MOD);
  cmp.set_mod_revision(expected_mod_revision);
  return PutIf(key, value, std::move(cmp), lease);
}

absl::StatusOr<CasResult> GrpcEtcdClient::PutIfCreateRevision(std::string_view key,
                                                              std::string_view value,
                                                              int64_t expected_create_revision,
                                                              int64_t lease) {
  etcdserverpb::Compare cmp;
  cmp.set_target(etcdserverpb::Compare::CREATE);
  cmp.set_create_revision(expected_create_revision);
  return PutIf(key, value, std::move(cmp), lease);
}

// Txn { if <compare> then put(key, value, lease) else get(key) }. A missing
// key compares as revision 0 (etcd compares it as an empty KeyValue).
absl::StatusOr<CasResult> GrpcEtcdClient::PutIf(std::string_view key, std::string_view value,
                                                etcdserverpb::Compare compare, int64_t lease) {
  etcdserverpb::TxnRequest req;
  compare.set_result(etcdserverpb::Compare::EQUAL);
  compare.set_key(std::string(key));
  *req.add_compare() = std::move(compare);
  auto* put = req.add_success()->mutable_request_put();
  put->set_key(std::string(key));
  put->set_value(std::string(value));
  put->set_lease(lease);
  req.add_failure()->mutable_request_range()->set_key(std::string(key));
  return Txn(req, key);
}

absl::StatusOr<CasResult> GrpcEtcdClient::PutIfGuarded(std::string_view key, std::string_view value,
                                                       bool by_create, int64_t expected_revision,
                                                       const ValueGuard& guard, int64_t lease) {
  etcdserverpb::TxnRequest req;
  auto* rev = req.add_compare();
  rev->set_result(etcdserverpb::Compare::EQUAL);
  rev->set_key(std::string(key));
  if (by_create) {
    rev->set_target(etcdserverpb::Compare::CREATE);
    rev->set_create_revision(expected_revision);
  } else {
    rev->set_target(etcdserverpb::Compare::MOD);
    rev->set_mod_revision(expected_revision);
  }
  // A missing guard key fails this compare (etcd skips value compares on
  // absent keys as false), so the put needs the guard to exist.
  auto* val = req.add_compare();
  val->set_result(etcdserverpb::Compare::EQUAL);
  val->set_key(guard.key);
  val->set_target(etcdserverpb::Compare::VALUE);
  val->set_value(guard.value);
  auto* put = req.add_success()->mutable_request_put();
  put->set_key(std::string(key));
  put->set_value(std::string(value));
  put->set_lease(lease);
  req.add_failure()->mutable_request_range()->set_key(std::string(key));
  req.add_failure()->mutable_request_range()->set_key(guard.key);
  return Txn(req, key);
}

absl::StatusOr<CasResult> GrpcEtcdClient::PutIfModRevisions(std::string_view key,
                                                            std::string_view value,
                                                            int64_t expected_mod_revision,
                                                            std::string_view guard_key,
                                                            int64_t guard_mod_revision) {
  etcdserverpb::TxnRequest req;
  for (auto [k, rev] : {std::pair{key, expected_mod_revision}, {guard_key, guard_mod_revision}}) {
    auto* cmp = req.add_compare();
    cmp->set_result(etcdserverpb::Compare::EQUAL);
    cmp->set_key(std::string(k));
    cmp->set_target(etcdserverpb::Compare::MOD);
    cmp->set_mod_revision(rev);
  }
  auto* put = req.add_success()->mutable_request_put();
  put->set_key(std::string(key));
  put->set_value(std::string(value));
  req.add_failure()->mutable_request_range()->set_key(std::string(key));
  req.add_failure()->mutable_request_range()->set_key(std::string(guard_key));
  return Txn(req, key);
}

absl::StatusOr<CasResult> GrpcEtcdClient::PutBothIfModRevisions(const RevisionedPut& first,
                                                                const RevisionedPut& second) {
  etcdserverpb::TxnRequest req;
  for (const RevisionedPut* p : {&first, &second}) {
    auto* cmp = req.add_compare();
    cmp->set_result(etcdserverpb::Compare::EQUAL);
    cmp->set_key(p->key);
    cmp->set_target(etcdserverpb::Compare::MOD);
    cmp->set_mod_revision(p->expected_mod_revision);
    auto* put = req.add_success()->mutable_request_put();
    put->set_key(p->key);
    put->set_value(p->value);
  }
  req.add_failure()->mutable_request_range()->set_key(first.key);
  req.add_failure()->mutable_request_range()->set_key(second.key);
  return Txn(req, first.key);
}

absl::StatusOr<CasResult> GrpcEtcdClient::DeleteUnlessExists(std::string_view key,
                                                             std::string_view unless_key) {
  etcdserverpb::TxnRequest req;
  auto* cmp = req.add_compare();
  cmp->set_result(etcdserverpb::Compare::EQUAL);
  cmp->set_key(std::string(unless_key));
  cmp->set_target(etcdserverpb::Compare::CREATE);
  cmp->set_create_revision(0);
  req.add_success()->mutable_request_delete_range()->set_key(std::string(key));
  req.add_failure()->mutable_request_range()->set_key(std::string(unless_key));
  return Txn(req, key);
}

absl::StatusOr<CasResult> GrpcEtcdClient::Txn(const etcdserverpb::TxnRequest& req,
                                              std::string_view key) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  etcdserverpb::TxnResponse resp;
  auto s = FromGrpc(conn().kv->Txn(&ctx, req, &resp), "Txn", key);
  if (!s.ok()) {
    Failed(s);
    return s;
  }
  return CasFromResponse(resp, key);
}

absl::StatusOr<CasResult> GrpcEtcdClient::CasFromResponse(const etcdserverpb::TxnResponse& resp,
                                                          std::string_view key) {
  CasResult out;
  out.applied = resp.succeeded();
  out.revision = resp.header().revision();
  if (out.applied) return out;
  const int n = resp.responses_size();
  if (n < 1 || n > 2) {
    return absl::InternalError(absl::StrCat("etcd Txn ", Av(key), ": unexpected failure answer"));
  }
  for (int i = 0; i < n; ++i) {
    if (!resp.responses(i).has_response_range()) {
      return absl::InternalError(absl::StrCat("etcd Txn ", Av(key), ": unexpected failure answer"));
    }
    const auto& range = resp.responses(i).response_range();
    if (range.kvs_size() == 0) continue;
    auto kv = FromProto(range.kvs(0), options().max_value_size);
    if (!kv.ok()) return kv.status();
    (i == 0 ? out.current : out.guard) = std::move(*kv);
  }
  return out;
}

absl::Status GrpcEtcdClient::Compact(int64_t revision) {
  etcdserverpb::CompactionRequest req;
  req.set_revision(revision);
  req.set_physical(true);
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  etcdserverpb::CompactionResponse resp;
  auto s = FromGrpc(conn().kv->Compact(&ctx, req, &resp), "Compact",
                    absl::StrCat("revision ", revision));
  Failed(s);
  return s;
}

}  // namespace kvnode::cluster
