// Hot path of libkvclient: Submit, Poll, completion dispatch, the GET read
// path over RDMA READ, RPC send/response. No virtual calls, no locks, no
// allocation per operation (slot keys reserve their capacity once; the READ
// batch keeps its capacity). One clock reading per event: Submit reads the
// clock once, Poll once when it has something to do (an empty poll reads
// none), and everything that handles the event is given that reading.
#include <glog/logging.h>
#include <poll.h>

#include <algorithm>
#include <cstring>

#include "absl/functional/function_ref.h"
#include "absl/strings/str_cat.h"
#include "client_impl.h"

namespace kvnode::client {
namespace {

// A GET follows at most this many READs (chain, object, retries) before it
// asks the server.
constexpr uint32_t kMaxReadsPerGet = 2 * storage::kMaxChainLength + 8;

proto::Opcode ToOpcode(OpKind k) {
  switch (k) {
    case OpKind::kGet:
      return proto::Opcode::kGet;
    case OpKind::kPut:
      return proto::Opcode::kPut;
    case OpKind::kDelete:
      return proto::Opcode::kDelete;
    case OpKind::kPing:
      return proto::Opcode::kPing;
  }
  return proto::Opcode::kPing;
}

}  // namespace

Session* Client::Impl::SessionByEpoch(uint32_t epoch) {
  if (current_ != nullptr && current_->epoch == epoch) return current_.get();
  for (const std::unique_ptr<Session>& s : retiring_) {
    if (s->epoch == epoch) return s.get();
  }
  if (pending_ != nullptr && pending_->epoch == epoch) return pending_.get();
  return nullptr;
}

void Client::Impl::MarkBroken(Session* s, absl::Status why) {
  if (s == nullptr || s->broken) return;
  s->broken = true;
  s->broken_why = std::move(why);
}

absl::Status Client::Impl::Submit(const OpRequest& op) {
  if (closed_) return absl::UnavailableError("client is closed");
  if (current_ == nullptr && !need_reconnect_) {
    return absl::UnavailableError(
        absl::StrCat("connection lost (reconnect disabled): ", last_connect_error_.message()));
  }
  if (op.kind != OpKind::kPing) {
    if (op.key.empty() || op.key.size() > storage::kMaxKeySize) {
      return absl::InvalidArgumentError(
          absl::StrCat("key of ", op.key.size(), " bytes: must be 1..", storage::kMaxKeySize));
    }
  }
  if ((op.kind == OpKind::kPut || op.kind == OpKind::kPing) &&
      op.value.size() > storage::kMaxValueSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("value of ", op.value.size(), " bytes: must be <= ", storage::kMaxValueSize));
  }
  const bool write = IsWrite(op.kind);
  if (available(op.kind) == 0 || free_.empty()) {
    return absl::ResourceExhaustedError(write && available() > 0
                                            ? absl::StrCat("client has ", budget_.writes(),
                                                           " writes outstanding (", budget_.held(),
                                                           " held); Poll first")
                                            : absl::StrCat("client has ", options_.max_outstanding,
                                                           " operations outstanding; Poll first"));
  }
  const uint32_t idx = free_.back();
  free_.pop_back();
  budget_.Start(op.kind);
  Slot& s = slots_[idx];
  s.held = false;
  const absl::Time now = absl::Now();
  s.state = Slot::State::kQueued;
  s.kind = op.kind;
  s.user_data = op.user_data;
  s.submitted = now;
  s.deadline = op.deadline == absl::InfiniteFuture() ? now + options_.op_timeout : op.deadline;
  s.not_before = now;
  if (op.kind == OpKind::kPing) {
    s.key.clear();
  } else {
    s.key.assign(op.key.data(), op.key.size());
  }
  s.sequence = 0;
  s.send_len = 0;
  s.force_rpc = op.force_rpc || options_.rpc_get_only;
  s.use_rpc = op.kind != OpKind::kGet || s.force_rpc;
  s.read_attempts = 0;
  s.reads = 0;
  s.word_read = false;
  s.shard_slot = op.kind == OpKind::kGet && num_slots_ > 0 ? proto::SlotOf(op.key, num_slots_) : 0;
  s.awaiting_response = false;
  s.reported = false;
  s.sends = 0;
  s.busy_count = 0;
  s.internal_count = 0;
  s.status = absl::OkStatus();
  s.version = 0;
  s.value_off = 0;
  s.value_len = 0;
  s.via_rpc = false;
  if (s.use_rpc) {
    if (absl::Status st = EncodeRpc(idx, op.value); !st.ok()) {
      s.state = Slot::State::kFree;
      free_.push_back(idx);
      budget_.End(op.kind, /*held=*/false);
      return st;
    }
  }
  s.hashed = false;
  if (write && current_ != nullptr && current_->geometry.has_value() && location_cache_.enabled()) {
    // Our own write moves the value: forget where it was (the check on use
    // would catch it too, a round trip later).
    location_cache_.Erase(storage::HashKey(*current_->geometry, s.key));
  }
  Start(idx, now);
  return absl::OkStatus();
}

absl::Status Client::Impl::EncodeRpc(uint32_t idx, std::string_view value) {
  Slot& s = slots_[idx];
  proto::RequestView r;
  r.opcode = ToOpcode(s.kind);
  r.client_id = client_id_;
  r.sequence = next_sequence_;
  r.key = s.key;
  if (s.kind == OpKind::kPut || s.kind == OpKind::kPing) r.value = value;
  absl::StatusOr<size_t> n = proto::EncodeRequest(
      r, std::span<uint8_t>(reinterpret_cast<uint8_t*>(SendBuf(idx)), kSendBufSize));
  if (!n.ok()) return n.status();
  s.sequence = next_sequence_++;
  s.send_len = static_cast<uint32_t>(*n);
  return absl::OkStatus();
}

void Client::Impl::Requeue(uint32_t idx, absl::Time not_before) {
  Slot& s = slots_[idx];
  s.state = Slot::State::kQueued;
  s.not_before = not_before;
  if (!s.in_queue) {
    s.in_queue = true;
    queue_.push_back(idx);
  }
}

void Client::Impl::Hold(uint32_t idx) {
  Slot& s = slots_[idx];
  if (budget_.Hold(s.kind, s.held)) s.held = true;
}

void Client::Impl::Start(uint32_t idx, absl::Time now) {
  Slot& s = slots_[idx];
  if (!CanRead() || s.not_before > now || s.reads_outstanding > 0) {
    // (A READ of an earlier attempt still outstanding writes into this
    // slot's buffers: start again once it has completed.)
    if (!CanRead()) Hold(idx);
    Requeue(idx, s.not_before);
    return;
  }
  if (!s.use_rpc && current_->geometry.has_value()) {
    FirstStep(s);
    PostRead(idx, s, now);
    return;
  }
  if (!CanSend()) {  // moving: the RPC goes on the new session
    Hold(idx);
    Requeue(idx, s.not_before);
    return;
  }
  if (s.sequence == 0) {
    // A GET going by RPC (no geometry on this session, or fallback).
    s.use_rpc = true;
    if (absl::Status st = EncodeRpc(idx, {}); !st.ok()) {
      Finish(idx, st);
      return;
    }
  }
  SendRpc(idx, s, now);
}

const storage::KeyHash& Client::Impl::KeyHashOf(Slot& s, const storage::Geometry& g) {
  if (!s.hashed || s.hash_seed != g.hash_seed) {
    s.hash = storage::HashKey(g, s.key);
    s.hash_seed = g.hash_seed;
    s.hashed = true;
  }
  return s.hash;
}

void Client::Impl::FirstStep(Slot& s) {
  const storage::Geometry& g = *current_->geometry;
  const storage::KeyHash& h = KeyHashOf(s, g);
  if (location_cache_.enabled()) {
    location_cache_.ForArena(g.arena_id);
    storage::CachedLocation loc;
    if (location_cache_.Lookup(h, &loc)) {
      s.step = storage::CachedRead(g, loc);
      if (s.step.length != 0) return;
      location_cache_.Erase(h);
    }
  }
  s.step = storage::FirstRead(g, h);
}

void Client::Impl::PostRead(uint32_t idx, Slot& s, absl::Time now) {
  Session* ses = current_.get();
  const uint64_t off = s.step.offset;
  const uint32_t len = s.step.length;
  if (len == 0 || len > kReadBufSize || off > ses->welcome.arena_size ||
      len > ses->welcome.arena_size - off || s.reads >= kMaxReadsPerGet) {
    // Not a READ we can or should do: ask the server.
    ++stats_.rpc_fallbacks;
    s.use_rpc = true;
    Start(idx, now);
    return;
  }
  if (!read_batch_.empty() && read_batch_epoch_ != ses->epoch) FlushReads(now);
  read_batch_epoch_ = ses->epoch;
  read_batch_slot_.push_back(idx);
  read_batch_.push_back(
      rdma::ReadWr{MakeWrId(ses->epoch, false, idx),
                   rdma::LocalBuf{slot_mr_.get(), uint64_t{idx} * kSlotStride + kSendBufSize, len},
                   ses->welcome.arena_remote_addr + off, ses->welcome.rkey});
  ++s.reads_outstanding;
  // The slot word after the data, in the same chain on the same QP, while
  // this client's map is older than the node's guard: the responder
  // executes an RC QP's READs in order, so a word read as 1 proves the node
  // served the slot when the data was read (docs/format.md "Slot words").
  // Both complete before OnReadDone looks at either.
  s.word_read =
      ses->slot_words_offset != 0 && num_slots_ > 0 && map_epoch_ < ses->check_below_epoch;
  if (s.word_read) {
    read_batch_slot_.push_back(idx);
    read_batch_.push_back(
        rdma::ReadWr{MakeWrId(ses->epoch, false, idx),
                     rdma::LocalBuf{slot_mr_.get(),
                                    uint64_t{idx} * kSlotStride + kSendBufSize + kReadBufSize, 8},
                     ses->welcome.arena_remote_addr + ses->slot_words_offset + (s.shard_slot & ~7u),
                     ses->welcome.rkey});
    ++s.reads_outstanding;
  }
  s.state = Slot::State::kReading;
  s.epoch = ses->epoch;
  ++s.reads;
}

size_t Client::Impl::PostChain(uint32_t epoch, size_t asked, const char* what,
                               absl::FunctionRef<absl::StatusOr<size_t>(rdma::Qp&)> post) {
  Session* ses = SessionByEpoch(epoch);
  if (ses == nullptr || ses != current_.get() || ses->broken) return 0;
  absl::StatusOr<size_t> n = post(*ses->qp);
  if (!n.ok()) {
    if (rdma::GetRdmaErrorKind(n.status()) != rdma::RdmaErrorKind::kQueueFull) {
      MarkBroken(ses,
                 absl::UnavailableError(absl::StrCat("post ", what, ": ", n.status().message())));
    }
    return 0;
  }
  // Fewer posted than asked with entries free: the device refused one
  // (rdma::Qp::PostReads); the QP is not to be trusted any more.
  if (*n < asked && ses->qp->send_slots_free() > 0) {
    MarkBroken(
        ses, absl::UnavailableError(absl::StrCat("post ", what, " chain: refused by the device")));
  }
  return *n;
}

void Client::Impl::FlushReads(absl::Time now) {
  if (read_batch_.empty()) return;
  const size_t posted = PostChain(read_batch_epoch_, read_batch_.size(), "READ",
                                  [&](rdma::Qp& qp) { return qp.PostReads(read_batch_); });
  stats_.reads_posted += posted;
  for (size_t i = posted; i < read_batch_.size(); ++i) {
    const uint32_t idx = read_batch_slot_[i];
    Slot& s = slots_[idx];
    if (s.reads_outstanding > 0) --s.reads_outstanding;
    if (s.state == Slot::State::kReading) Requeue(idx, now);
  }
  read_batch_.clear();
  read_batch_slot_.clear();
}

void Client::Impl::SendRpc(uint32_t idx, Slot& s, absl::Time now) {
  Session* ses = current_.get();
  if (ses->rpcs_outstanding >= ses->credits) {
    Requeue(idx, now);  // no credit: wait for a response
    return;
  }
  if (s.send_len > ses->welcome.max_rpc_message_size) {
    Finish(idx, absl::InvalidArgumentError(absl::StrCat(
                    "request of ", s.send_len, " bytes exceeds the server's receive buffer of ",
                    ses->welcome.max_rpc_message_size)));
    return;
  }
  // The client id may have changed (resumed as a new client): patch it.
  storage::StoreU64(SendBuf(idx) + 8, client_id_);
  if (!send_batch_.empty() && send_batch_epoch_ != ses->epoch) FlushSends(now);
  send_batch_epoch_ = ses->epoch;
  send_batch_slot_.push_back(idx);
  send_batch_.push_back(
      rdma::SendWr{MakeWrId(ses->epoch, false, idx),
                   rdma::LocalBuf{slot_mr_.get(), uint64_t{idx} * kSlotStride, s.send_len}});
  s.state = Slot::State::kRpc;
  s.epoch = ses->epoch;
  s.awaiting_response = true;
  ++s.sends_outstanding;
  ++ses->rpcs_outstanding;
}

void Client::Impl::FlushSends(absl::Time now) {
  if (send_batch_.empty()) return;
  const size_t posted = PostChain(send_batch_epoch_, send_batch_.size(), "SEND",
                                  [&](rdma::Qp& qp) { return qp.PostSends(send_batch_); });
  stats_.rpcs_sent += posted;
  Session* ses = SessionByEpoch(send_batch_epoch_);
  for (size_t i = 0; i < send_batch_.size(); ++i) {
    const uint32_t idx = send_batch_slot_[i];
    Slot& s = slots_[idx];
    if (i < posted) {
      if (++s.sends > 1) ++stats_.rpc_resends;
      continue;
    }
    // Not sent: it gives its credit back and waits for the next try, unless
    // a retired session's teardown has requeued it already.
    if (s.state != Slot::State::kRpc || s.epoch != send_batch_epoch_) continue;
    if (s.sends_outstanding > 0) --s.sends_outstanding;
    if (ses != nullptr && ses->rpcs_outstanding > 0) --ses->rpcs_outstanding;
    s.awaiting_response = false;
    Requeue(idx, now);
  }
  send_batch_.clear();
  send_batch_slot_.clear();
}

void Client::Impl::FlushPosts(absl::Time now) {
  FlushReads(now);
  FlushSends(now);
}

void Client::Impl::Finish(uint32_t idx, absl::Status status) {
  Slot& s = slots_[idx];
  s.state = Slot::State::kDone;
  s.awaiting_response = false;
  s.reported = false;
  if (status.ok() || absl::IsNotFound(status)) {
    ++stats_.ops_completed;
  } else {
    ++stats_.ops_failed;
    if (absl::IsDeadlineExceeded(status)) ++stats_.timeouts;
  }
  s.status = std::move(status);
  done_.push_back(idx);
}

uint32_t Client::Impl::FailOutstanding(absl::FunctionRef<absl::Status(const Slot&)> status_of) {
  // What cannot be posted now goes back to the queue first: a slot finished
  // while still in a batch would keep its work request count.
  FlushPosts(absl::Now());
  uint32_t failed = 0;
  for (uint32_t i = 0; i < slots_.size(); ++i) {
    const Slot::State st = slots_[i].state;
    if (st == Slot::State::kQueued || st == Slot::State::kReading || st == Slot::State::kRpc) {
      Finish(i, status_of(slots_[i]));
      ++failed;
    }
  }
  return failed;
}

void Client::Impl::MaybeFree(uint32_t idx) {
  Slot& s = slots_[idx];
  if (s.state == Slot::State::kDone && s.reported && s.reads_outstanding == 0 &&
      s.sends_outstanding == 0) {
    s.state = Slot::State::kFree;
    free_.push_back(idx);
    budget_.End(s.kind, s.held);
    s.held = false;
  }
}

void Client::Impl::RepostRecv(Session* s, uint32_t i) {
  if (s->broken) return;
  absl::Status st =
      s->qp->PostRecv(MakeWrId(s->epoch, true, i),
                      rdma::LocalBuf{s->recv_mr, uint64_t{i} * kRecvBufSize, kRecvBufSize});
  if (!st.ok()) MarkBroken(s, absl::UnavailableError(absl::StrCat("repost RECV: ", st.message())));
}

int Client::Impl::PollCq(absl::Time now) {
  if (cq_ == nullptr) return 0;
  rdma::Completion comps[kPollBatch];
  int total = 0;
  for (;;) {
    absl::StatusOr<int> n = cq_->Poll(std::span<rdma::Completion>(comps, kPollBatch));
    if (!n.ok()) {
      LOG(ERROR) << "kvclient: poll CQ: " << n.status();
      MarkBroken(current_.get(), n.status());
      return total;
    }
    for (int i = 0; i < *n; ++i) OnCompletion(comps[i], now);
    total += *n;
    if (*n < kPollBatch) return total;
  }
}

void Client::Impl::OnCompletion(const rdma::Completion& c, absl::Time now) {
  const uint32_t epoch = WrEpoch(c.wr_id);
  Session* ses = SessionByEpoch(epoch);
  if (WrIsRecv(c.wr_id)) {
    if (ses == nullptr) return;
    if (!c.ok()) {
      MarkBroken(ses, c.ToStatus());
      return;
    }
    OnResponse(ses, WrIndex(c.wr_id), c.byte_len, now);
    return;
  }
  const uint32_t idx = WrIndex(c.wr_id);
  if (idx >= slots_.size()) return;
  Slot& s = slots_[idx];
  const bool is_read = c.kind == rdma::WrKind::kRead;
  if (is_read) {
    if (s.reads_outstanding > 0) --s.reads_outstanding;
  } else {
    if (s.sends_outstanding > 0) --s.sends_outstanding;
  }
  if (!c.ok()) {
    // The QP is in ERR now: a remote access or retry error means "move or
    // reconnect", never data.
    MarkBroken(ses, absl::UnavailableError(
                        absl::StrCat(is_read ? "READ" : "SEND", ": ", c.ToStatus().message())));
    if (is_read && s.state == Slot::State::kReading && s.epoch == epoch) Requeue(idx, now);
    MaybeFree(idx);
    return;
  }
  if (is_read && s.state == Slot::State::kReading && s.epoch == epoch && ses != nullptr &&
      s.reads_outstanding == 0) {
    OnReadDone(idx, s, now);
    return;
  }
  MaybeFree(idx);
}

void Client::Impl::OnReadDone(uint32_t idx, Slot& s, absl::Time now) {
  Session* ses = SessionByEpoch(s.epoch);
  if (ses == nullptr || !ses->geometry.has_value()) {
    Requeue(idx, now);
    return;
  }
  if (s.word_read && WordBuf(idx)[s.shard_slot % 8] == 0) {
    // The node did not serve the key's slot when the word was read, nor
    // (the READs ran in order) necessarily when the data was: whatever the
    // bytes say, the node is asked, and it answers WRONG_SHARD.
    ++stats_.reads_not_served;
    if (s.hashed) location_cache_.Erase(s.hash);
    s.use_rpc = true;
    if (!CanRead() || ses != current_.get()) {
      Requeue(idx, now);
    } else {
      Start(idx, now);
    }
    return;
  }
  const char* buf = ReadBuf(idx);
  const std::string_view bytes(buf, s.step.length);
  if (s.step.kind == storage::ReadStep::Kind::kCached) {
    const storage::ReadResult r = storage::DecodeCached(*ses->geometry, s.key, s.step, bytes);
    if (r.outcome == storage::ReadResult::Outcome::kFound) {
      s.version = r.version;
      s.value_off = static_cast<uint32_t>(r.value.data() - buf);
      s.value_len = static_cast<uint32_t>(r.value.size());
      s.via_rpc = false;
      ++stats_.gets_by_read;
      ++stats_.location_hits;
      Finish(idx, absl::OkStatus());
      return;
    }
    // Overwritten, deleted, moved, or another key's entry: the bucket says.
    ++stats_.location_stale;
    if (s.hashed) location_cache_.Erase(s.hash);
    if (!CanRead() || ses != current_.get()) {
      Requeue(idx, now);  // restarts from FirstStep on the next session
      return;
    }
    s.step = storage::FirstRead(*ses->geometry, KeyHashOf(s, *ses->geometry));
    PostRead(idx, s, now);
    return;
  }
  const storage::ReadResult r = storage::Decode(*ses->geometry, s.key, s.step, bytes);
  switch (r.outcome) {
    case storage::ReadResult::Outcome::kFound:
      if (s.step.kind == storage::ReadStep::Kind::kObject && s.hashed && ses == current_.get()) {
        location_cache_.Insert(s.hash, storage::CachedLocation{r.slot, r.slot_word});
      }
      s.version = r.version;
      s.value_off = static_cast<uint32_t>(r.value.data() - buf);
      s.value_len = static_cast<uint32_t>(r.value.size());
      s.via_rpc = false;
      ++stats_.gets_by_read;
      Finish(idx, absl::OkStatus());
      return;
    case storage::ReadResult::Outcome::kNotFound:
      ++stats_.gets_by_read;
      Finish(idx, absl::NotFoundError("key not found"));
      return;
    case storage::ReadResult::Outcome::kNext:
      s.step = r.next;
      break;
    case storage::ReadResult::Outcome::kRetry:
      ++stats_.read_retries;
      if (++s.read_attempts > options_.max_read_retries) {
        ++stats_.rpc_fallbacks;
        s.use_rpc = true;
      } else if (ses == current_.get()) {
        s.step = storage::FirstRead(*ses->geometry, KeyHashOf(s, *ses->geometry));
      }
      break;
    case storage::ReadResult::Outcome::kSlowPath:
      ++stats_.rpc_fallbacks;
      s.use_rpc = true;
      break;
  }
  if (!CanRead() || ses != current_.get()) {
    Requeue(idx, now);  // restarts from FirstRead on the next session
    return;
  }
  if (s.use_rpc) {
    Start(idx, now);
  } else {
    PostRead(idx, s, now);
  }
}

void Client::Impl::OnResponse(Session* ses, uint32_t i, uint32_t byte_len, absl::Time now) {
  if (ses->rpcs_outstanding > 0) --ses->rpcs_outstanding;
  if (i >= ses->recv_buffers || byte_len > kRecvBufSize) {
    MarkBroken(ses, absl::UnavailableError("receive completion out of range"));
    return;
  }
  const uint8_t* msg = ses->recv_base + size_t{i} * kRecvBufSize;
  absl::StatusOr<proto::ResponseView> r = proto::DecodeResponse({msg, byte_len});
  if (!r.ok()) {
    LOG(WARNING) << "kvclient: undecodable RPC response (" << byte_len << " bytes): " << r.status();
    MarkBroken(ses, absl::UnavailableError(
                        absl::StrCat("undecodable RPC response: ", r.status().message())));
    return;
  }
  uint32_t idx = UINT32_MAX;
  for (uint32_t k = 0; k < slots_.size(); ++k) {
    const Slot& s = slots_[k];
    if (s.awaiting_response && s.sequence == r->sequence && s.epoch == ses->epoch &&
        s.state == Slot::State::kRpc) {
      idx = k;
      break;
    }
  }
  if (idx == UINT32_MAX) {
    ++stats_.stale_responses;
    RepostRecv(ses, i);
    return;
  }
  Slot& s = slots_[idx];
  s.awaiting_response = false;
  switch (r->status) {
    case proto::RpcStatus::kOk:
      s.version = r->version;
      if (s.kind == OpKind::kGet || s.kind == OpKind::kPing) {
        const size_t n = std::min<size_t>(r->value.size(), kReadBufSize);
        std::memcpy(ReadBuf(idx), r->value.data(), n);
        s.value_off = 0;
        s.value_len = static_cast<uint32_t>(n);
      }
      if (s.kind == OpKind::kGet) {
        s.via_rpc = true;
        ++stats_.gets_by_rpc;
      }
      Finish(idx, absl::OkStatus());
      break;
    case proto::RpcStatus::kNotFound:
      s.version = r->version;
      if (s.kind == OpKind::kGet) {
        s.via_rpc = true;
        ++stats_.gets_by_rpc;
      }
      Finish(idx, absl::NotFoundError("key not found"));
      break;
    case proto::RpcStatus::kRejected:
      Finish(idx, absl::InvalidArgumentError(absl::StrCat("server rejected ", OpKindName(s.kind),
                                                          ": ", std::string(r->value))));
      break;
    case proto::RpcStatus::kWrongShard:
      // Only sent to a session that asked for shard maps (kFeatureShardMap):
      // nothing was applied, and ClusterClient reroutes the op by the epoch.
      Finish(idx, WrongShardSignal(r->version, OpKindName(s.kind)));
      break;
    case proto::RpcStatus::kBusy: {
      ++stats_.busy;
      Hold(idx);
      const int shift = static_cast<int>(std::min<uint32_t>(s.busy_count++, 10));
      Requeue(idx,
              now + std::min(options_.busy_backoff_min * (1 << shift), options_.busy_backoff_max));
      break;
    }
    case proto::RpcStatus::kInternal:
      if (++s.internal_count >= 3) {
        Finish(idx, absl::InternalError(absl::StrCat("server failed ", OpKindName(s.kind),
                                                     " 3 times: ", std::string(r->value))));
      } else {
        Requeue(idx, now + options_.busy_backoff_max);
      }
      break;
  }
  RepostRecv(ses, i);
}

void Client::Impl::RunQueue(absl::Time now) {
  for (size_t n = queue_.size(); n > 0 && !queue_.empty(); --n) {
    const uint32_t idx = queue_.front();
    queue_.pop_front();
    Slot& s = slots_[idx];
    s.in_queue = false;
    if (s.state != Slot::State::kQueued) continue;
    if (s.not_before > now || !CanRead()) {
      s.in_queue = true;
      queue_.push_back(idx);
      continue;
    }
    Start(idx, now);
  }
}

void Client::Impl::CheckDeadlines(absl::Time now) {
  for (uint32_t i = 0; i < slots_.size(); ++i) {
    Slot& s = slots_[i];
    if (s.state != Slot::State::kQueued && s.state != Slot::State::kReading &&
        s.state != Slot::State::kRpc) {
      continue;
    }
    if (s.deadline > now) continue;
    const std::string what = absl::StrCat(OpKindName(s.kind), " '", s.key, "'");
    if (current_ == nullptr || current_->broken) {
      Finish(i, absl::UnavailableError(absl::StrCat(
                    what, ": connection lost and not re-established before the deadline: ",
                    last_connect_error_.message())));
    } else {
      Finish(i, absl::DeadlineExceededError(absl::StrCat(
                    what, ": deadline passed after ", absl::FormatDuration(now - s.submitted), " (",
                    s.sends, " sends, ", s.reads, " READs)")));
    }
  }
}

size_t Client::Impl::Poll(std::span<OpResult> out) {
  if (closed_) return 0;
  // READs and SENDs queued by Submit go out first (what cannot go is
  // retried at once: no clock reading needed for that).
  if (!read_batch_.empty() || !send_batch_.empty()) FlushPosts(absl::InfinitePast());
  // Nothing completed and nothing else to do: no clock read. Every
  // kIdlePolls-th empty poll still runs the timers below (keep-alive,
  // deadlines, session steps).
  rdma::Completion first[kPollBatch];
  int got = 0;
  if (cq_ != nullptr) {
    absl::StatusOr<int> n = cq_->Poll(std::span<rdma::Completion>(first, kPollBatch));
    if (!n.ok()) {
      LOG(ERROR) << "kvclient: poll CQ: " << n.status();
      MarkBroken(current_.get(), n.status());
    } else {
      got = *n;
    }
  }
  const bool busy = got > 0 || !done_.empty() || !queue_.empty() || pending_ != nullptr ||
                    !retiring_.empty() || current_ == nullptr || current_->broken ||
                    current_->moving;
  if (!busy && ++idle_polls_ < kIdlePolls) return 0;
  idle_polls_ = 0;
  const absl::Time now = absl::Now();
  for (int i = 0; i < got; ++i) OnCompletion(first[i], now);
  if (got == kPollBatch) PollCq(now);
  FlushPosts(now);
  if (now >= next_control_check_) {
    next_control_check_ = now + absl::Microseconds(200);
    if (current_ != nullptr) PollControl(current_.get(), now);
  }
  ProgressSessions(now);
  if (!queue_.empty()) RunQueue(now);
  FlushPosts(now);
  if (now >= next_deadline_check_) {
    next_deadline_check_ = now + absl::Milliseconds(1);
    CheckDeadlines(now);
  }
  size_t n = 0;
  while (n < out.size() && !done_.empty()) {
    const uint32_t idx = done_.front();
    done_.pop_front();
    Slot& s = slots_[idx];
    OpResult& r = out[n++];
    r.user_data = s.user_data;
    r.kind = s.kind;
    r.status = s.status;
    r.version = s.version;
    r.value = s.status.ok() ? std::string_view(ReadBuf(idx) + s.value_off, s.value_len)
                            : std::string_view();
    r.via_rpc = s.via_rpc;
    r.read_retries = s.read_attempts;
    r.sends = s.sends;
    r.submitted = s.submitted;
    r.completed = now;
    s.reported = true;
    MaybeFree(idx);
  }
  return n;
}

void Client::Impl::AppendWaitFds(std::vector<pollfd>* fds, absl::Time* until) {
  const absl::Time now = absl::Now();
  if (closed_) return;
  FlushPosts(now);
  if (!done_.empty()) {
    *until = now;
    return;
  }
  if (cq_ != nullptr) {
    // Consume pending events, arm, and look once more: a completion that
    // arrived before arming raises no event.
    for (;;) {
      absl::StatusOr<bool> ev = cq_->WaitForEvent(rdma::Clock::now());
      if (!ev.ok() || !*ev) break;
    }
    if (absl::Status st = cq_->RequestNotify(); !st.ok()) {
      *until = std::min(*until, now + absl::Milliseconds(1));
    }
    if (PollCq(now) > 0 || !done_.empty()) {
      *until = now;
      return;
    }
    fds->push_back(pollfd{cq_->channel_fd(), POLLIN, 0});
  }
  if (Session* s = current_.get(); s != nullptr) {
    fds->push_back(pollfd{s->fd.get(), POLLIN, 0});
    *until = std::min(*until, s->last_tx + options_.keepalive_interval);
    if (s->broken) *until = now;
  }
  if (Session* s = pending_.get(); s != nullptr) {
    const bool connecting = s->state == SessionState::kConnecting;
    fds->push_back(pollfd{s->fd.get(), static_cast<short>(connecting ? POLLOUT : POLLIN), 0});
    *until = std::min(*until, s->step_deadline);
  }
  for (const std::unique_ptr<Session>& s : retiring_) {
    // Draining: completions wake us (CQ channel), else its deadline.
    // Flushing: the next non-blocking drain step soon.
    *until = std::min(*until, s->state == SessionState::kDraining ? s->step_deadline
                                                                  : now + absl::Milliseconds(1));
  }
  // The next handshake attempt (a Move's, or a reconnection with work to do).
  const bool attempt_due =
      pending_ == nullptr &&
      (current_ != nullptr ? current_->moving : need_reconnect_ && outstanding() > 0);
  if (!queue_.empty() || attempt_due) {
    absl::Time t = attempt_due ? next_reconnect_ : now + absl::Milliseconds(1);
    if (CanSend()) {
      for (uint32_t idx : queue_) t = std::min(t, slots_[idx].not_before);
    }
    *until = std::min(*until, std::max(t, now));
  }
  for (const Slot& s : slots_) {
    if (s.state == Slot::State::kQueued || s.state == Slot::State::kReading ||
        s.state == Slot::State::kRpc) {
      *until = std::min(*until, s.deadline);
    }
  }
}

void Client::Impl::Wait(absl::Time until) {
  std::vector<pollfd> fds;
  AppendWaitFds(&fds, &until);
  PollFds(std::span<pollfd>(fds), until);
}

}  // namespace kvnode::client
