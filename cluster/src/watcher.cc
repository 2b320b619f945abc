// The Watcher: one etcd watch stream at a time on its own thread, reopened
// from the next revision when it breaks, and a re-read of the whole prefix
// (a resync) when that revision was compacted away.
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <thread>

#include "absl/strings/str_cat.h"
#include "etcd_impl.h"
#include "glog/logging.h"
#include "kvnode/base/annotated_mutex.h"
#include "kvnode/cluster/keys.h"

namespace kvnode::cluster {
namespace {

// A watch stream is reopened (from the next revision) at least this often,
// so that even a stream gRPC never reports broken cannot hang forever.
constexpr auto kStreamLifetime = std::chrono::minutes(5);
constexpr absl::Duration kMinBackoff = absl::Milliseconds(100);
constexpr absl::Duration kMaxBackoff = absl::Seconds(2);

// AnnotatedMutex in the shape std::condition_variable_any waits on.
struct Lockable {
  AnnotatedMutex* mu;
  void lock() ABSL_NO_THREAD_SAFETY_ANALYSIS { mu->Lock(); }
  void unlock() ABSL_NO_THREAD_SAFETY_ANALYSIS { mu->Unlock(); }
};

class WatcherImpl final : public Watcher {
 public:
  WatcherImpl(GrpcEtcdClient* client, std::string prefix, int64_t from_revision,
              WatchCallbacks callbacks)
      : client_(client),
        prefix_(std::move(prefix)),
        callbacks_(std::move(callbacks)),
        next_revision_(from_revision),
        thread_([this] { Run(); }) {}
  ~WatcherImpl() override { Stop(); }

  void Stop() override;
  int64_t resyncs() const override { return resyncs_.load(); }

 private:
  void Run();
  absl::Status Resync();
  absl::Status WatchOnce();
  etcdserverpb::WatchRequest CreateRequest() const;
  // False when the watch must be given up (compacted or canceled).
  bool Handle(const etcdserverpb::WatchResponse& resp, absl::Status* why);
  void Deliver(const etcdserverpb::WatchResponse& resp);
  void ReportState(const absl::Status& s);
  // Waits `d` or until Stop; false once stopped.
  bool Wait(absl::Duration d);
  bool stopped();

  GrpcEtcdClient* const client_;
  const std::string prefix_;
  const WatchCallbacks callbacks_;
  std::atomic<int64_t> resyncs_{0};
  // Owned by the watcher thread: 0 = resync needed before watching.
  int64_t next_revision_;
  bool reported_ok_ = false;

  AnnotatedMutex mu_;
  std::condition_variable_any cv_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  grpc::ClientContext* stream_ctx_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::thread thread_;  // last: starts once everything above is built
};

void WatcherImpl::Stop() {
  {
    AnnotatedLock l(&mu_);
    stop_ = true;
    if (stream_ctx_ != nullptr) stream_ctx_->TryCancel();
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

bool WatcherImpl::stopped() {
  AnnotatedLock l(&mu_);
  return stop_;
}

bool WatcherImpl::Wait(absl::Duration d) {
  const auto until = std::chrono::steady_clock::now() + absl::ToChronoNanoseconds(d);
  AnnotatedLock l(&mu_);
  Lockable lk{&mu_};
  while (!stop_) {
    if (cv_.wait_until(lk, until) == std::cv_status::timeout) break;
  }
  return !stop_;
}

void WatcherImpl::ReportState(const absl::Status& s) {
  reported_ok_ = s.ok();
  if (callbacks_.on_state) callbacks_.on_state(s);
}

void WatcherImpl::Run() {
  absl::Duration backoff = kMinBackoff;
  while (!stopped()) {
    absl::Status s = next_revision_ == 0 ? Resync() : WatchOnce();
    if (s.ok()) {
      backoff = kMinBackoff;
      continue;
    }
    if (stopped()) break;
    LOG(WARNING) << "etcd watch of " << prefix_ << ": " << s << "; retrying in " << backoff;
    ReportState(s);
    if (!Wait(backoff)) break;
    backoff = std::min(backoff * 2, kMaxBackoff);
  }
}

absl::Status WatcherImpl::Resync() {
  auto range = client_->GetPrefix(prefix_);
  if (!range.ok()) return range.status();
  WatchUpdate update;
  update.resync = true;
  update.revision = range->revision;
  update.snapshot = std::move(range->kvs);
  resyncs_.fetch_add(1);
  if (callbacks_.on_update) callbacks_.on_update(update);
  next_revision_ = range->revision + 1;
  return absl::OkStatus();
}

etcdserverpb::WatchRequest WatcherImpl::CreateRequest() const {
  etcdserverpb::WatchRequest req;
  auto* create = req.mutable_create_request();
  create->set_key(prefix_);
  create->set_range_end(PrefixRangeEnd(prefix_));
  create->set_start_revision(next_revision_);
  create->set_progress_notify(true);
  return req;
}

// One stream's life. OK when it ended for a reason that needs no backoff
// (compaction: resync next; lifetime reached: reopen).
absl::Status WatcherImpl::WatchOnce() {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + kStreamLifetime);
  ctx.set_wait_for_ready(true);  // see GrpcEtcdClient::SetDeadline
  {
    AnnotatedLock l(&mu_);
    if (stop_) return absl::CancelledError("watcher stopped");
    stream_ctx_ = &ctx;
  }
  auto stream = client_->conn().watch->Watch(&ctx);
  absl::Status why;
  bool given_up = false;  // by Handle: the server's side is still open
  if (stream->Write(CreateRequest())) {
    etcdserverpb::WatchResponse resp;
    while (!given_up && stream->Read(&resp)) given_up = !Handle(resp, &why);
  }
  if (given_up) ctx.TryCancel();
  grpc::Status end = stream->Finish();
  {
    AnnotatedLock l(&mu_);
    stream_ctx_ = nullptr;
  }
  if (!why.ok() || next_revision_ == 0) return why;
  if (end.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED && reported_ok_) {
    return absl::OkStatus();
  }
  absl::Status s = FromGrpc(end, "Watch", prefix_);
  client_->Failed(s);
  return s.ok() ? absl::UnavailableError(absl::StrCat("etcd Watch ", prefix_, ": stream ended"))
                : s;
}

bool WatcherImpl::Handle(const etcdserverpb::WatchResponse& resp, absl::Status* why) {
  if (resp.compact_revision() > 0) {
    LOG(INFO) << "etcd watch of " << prefix_ << ": revision " << next_revision_
              << " was compacted (now " << resp.compact_revision() << "); re-reading";
    next_revision_ = 0;
    return false;
  }
  if (resp.canceled()) {
    *why = absl::UnavailableError(
        absl::StrCat("etcd Watch ", prefix_, ": canceled: ", resp.cancel_reason()));
    return false;
  }
  if (resp.created()) {
    // A store behind the revisions already delivered lost its data (or is
    // another etcd cluster): a watch from our revision would wait for a
    // future that never matches the past, so re-read instead.
    if (resp.header().revision() < next_revision_ - 1) {
      LOG(WARNING) << "etcd watch of " << prefix_ << ": the store is at revision "
                   << resp.header().revision() << ", behind " << next_revision_ - 1
                   << " already seen; re-reading";
      next_revision_ = 0;
      return false;
    }
    if (!reported_ok_) ReportState(absl::OkStatus());
    return true;
  }
  if (resp.events_size() == 0) {  // progress notification: nothing up to header
    next_revision_ = std::max(next_revision_, resp.header().revision() + 1);
    return true;
  }
  Deliver(resp);
  return true;
}

void WatcherImpl::Deliver(const etcdserverpb::WatchResponse& resp) {
  WatchUpdate update;
  for (const auto& ev : resp.events()) {
    WatchEvent out;
    out.type =
        ev.type() == mvccpb::Event::DELETE ? WatchEvent::Type::kDelete : WatchEvent::Type::kPut;
    auto kv = FromProto(ev.kv(), client_->options().max_value_size);
    if (kv.ok()) {
      out.kv = std::move(*kv);
    } else {  // delivered without its value: the receiver's parse names the key
      ReportState(kv.status());
      out.kv.key = ev.kv().key();
      out.kv.mod_revision = ev.kv().mod_revision();
    }
    next_revision_ = std::max(next_revision_, out.kv.mod_revision + 1);
    update.events.push_back(std::move(out));
  }
  update.revision = next_revision_ - 1;
  if (callbacks_.on_update) callbacks_.on_update(update);
}

}  // namespace

std::unique_ptr<Watcher> StartWatcher(GrpcEtcdClient* client, std::string prefix,
                                      int64_t from_revision, WatchCallbacks callbacks) {
  return std::make_unique<WatcherImpl>(client, std::move(prefix), from_revision,
                                       std::move(callbacks));
}

}  // namespace kvnode::cluster
