// The data plane's hot path: one completion at a time; a GET or PING is
// handled at once, a PUT or DELETE is staged and the poll round's writes
// are applied as one group commit (one synced RocksDB write), then answered
// in the order received. Answers go on the wire at the end of the round, one
// chain per session. No locks, no allocation on the success path once
// the staging vectors have grown, no virtual call per work request.
#include <glog/logging.h>

#include <algorithm>
#include <span>

#include "absl/strings/str_cat.h"
#include "data_plane.h"
#include "data_plane_internal.h"
#include "kvnode/proto/rpc.h"
#include "kvnode/rdma/errors.h"

namespace kvnode::server {

uint64_t DataPlane::RecvOffset(const Session& s, uint32_t slot) const {
  return (uint64_t{s.block} * 3 * config_.credits + slot) * RpcBufferStride();
}

uint64_t DataPlane::SendOffset(const Session& s, uint32_t slot) const {
  return (uint64_t{s.block} * 3 * config_.credits + config_.credits + slot) * RpcBufferStride();
}

absl::Status DataPlane::PostRecvSlot(Session& s, uint32_t slot) {
  return s.qp->PostRecv(MakeWrId(s.serial, WrTag::kRecv, slot),
                        rdma::LocalBuf{res_.pool_mr.get(), RecvOffset(s, slot),
                                       static_cast<uint32_t>(proto::kMaxRpcMessageSize)});
}

void DataPlane::HandleCompletion(const rdma::Completion& c) {
  auto it = by_serial_.find(WrSerial(c.wr_id));
  if (it == by_serial_.end()) return;  // its session was reaped already
  Session& s = *it->second;
  if (c.qp != s.qp.get()) return;  // stale (cannot happen with unique serials)
  if (!c.ok()) {
    // Any error completion means the QP is in ERR (a bad rkey from the
    // client, a dead peer, a too-long SEND, or our own flush): reap it.
    const bool flushed = c.status == IBV_WC_WR_FLUSH_ERR;
    Reap(s,
         absl::StrCat("QP in error: ", ibv_wc_status_str(c.status), " (vendor_err ", c.vendor_err,
                      ") on ", WrKindOf(c.wr_id) == WrTag::kRecv ? "receive" : "send",
                      flushed ? "; the QP went to ERR, e.g. the client READ with a bad rkey or "
                                "its SEND was too long"
                              : ""),
         ErrorKind::kQpError, /*notify=*/true);
    return;
  }
  switch (WrKindOf(c.wr_id)) {
    case WrTag::kRecv:
      HandleRequest(s, WrSlot(c.wr_id), c.byte_len);
      return;
    case WrTag::kSend: {
      s.free_send.push_back(WrSlot(c.wr_id));
      while (!s.deferred.empty() && !s.free_send.empty()) {
        const auto [slot, len] = s.deferred.front();
        s.deferred.pop_front();
        if (!HandleRequest(s, slot, len)) return;  // reaped
      }
      return;
    }
    case WrTag::kBind:
      return;  // ConnectSession waits for it with Qp::WaitFor
  }
}

RpcContext DataPlane::ContextFor(ClientRecord& record) const {
  return RpcContext{record.client_id, &record.window, backend_,
                    writes_paused_,   metrics_,       &record.secret};
}

bool DataPlane::HandleRequest(Session& s, uint32_t recv_slot, uint32_t byte_len) {
  if (s.free_send.empty()) {
    // Every response buffer is still in flight; answer once one completes.
    s.deferred.emplace_back(recv_slot, byte_len);
    return true;
  }
  const uint32_t send_slot = s.free_send.back();
  s.free_send.pop_back();
  const std::span<const uint8_t> request(res_.pool_base + RecvOffset(s, recv_slot), byte_len);
  const std::span<uint8_t> response(res_.pool_base + SendOffset(s, send_slot),
                                    proto::kMaxRpcMessageSize);
  WriteRequest write;
  RpcContext ctx = ContextFor(*s.record);
  if (config_.shard_gate != nullptr) {
    RefreshShardView();
    ctx.sharded = true;
    ctx.shard = shard_view_.get();
    ctx.shard_map_feature = s.shard_map_feature;
  }
  RpcResult r = HandleRpc(request, ctx, response, config_.group_commit ? &write : nullptr);
  if (r.staged) {
    // A retry of a write staged in this round (a client may send a sequence
    // again): the first is applied and remembered before this one is
    // looked at, so it is answered from the dedupe window.
    const bool again =
        std::any_of(staged_requests_.begin(), staged_requests_.end(), [&](const WriteRequest& w) {
          return w.tag.client_id == s.client_id && w.tag.sequence == write.tag.sequence;
        });
    if (!again) {
      staged_.push_back(
          StagedWrite{s.serial, recv_slot, send_slot, byte_len, s.record, response.data()});
      staged_requests_.push_back(write);
      return true;
    }
    FlushWrites();
    r = HandleRpc(request, ctx, response);
  }
  return Respond(s, recv_slot, send_slot, byte_len, r);
}

void DataPlane::FlushWrites() {
  if (staged_.empty()) return;
  staged_replies_.assign(staged_.size(), WriteReply{});
  backend_->Write(staged_requests_, staged_replies_);
  for (size_t i = 0; i < staged_.size(); ++i) {
    const StagedWrite& w = staged_[i];
    // The session may have been reaped since (a later completion of the
    // round): the write is applied all the same, and its client's window
    // must remember it for a retry. Its record and buffers outlive the
    // session until a task trims or reuses them, which runs after this.
    const RpcResult r = AnswerWrite(staged_requests_[i], staged_replies_[i], ContextFor(*w.record),
                                    std::span<uint8_t>(w.response, proto::kMaxRpcMessageSize));
    if (auto it = by_serial_.find(w.serial); it != by_serial_.end()) {
      (void)Respond(*it->second, w.recv_slot, w.send_slot, w.byte_len, r);
    }
  }
  staged_.clear();
  staged_requests_.clear();
}

bool DataPlane::Respond(Session& s, uint32_t recv_slot, uint32_t send_slot, uint32_t byte_len,
                        const RpcResult& r) {
  ++s.ops;
  metrics_->Add(Counter::kBytesIn, byte_len);
  metrics_->Add(Counter::kBytesOut, r.response_size);
  // The receive buffer goes back BEFORE the response that returns the
  // client's credit (contract): the client can never overrun us.
  if (absl::Status st = PostRecvSlot(s, recv_slot); !st.ok()) {
    Reap(s, absl::StrCat("re-posting a receive failed: ", st.ToString()), ErrorKind::kQpError,
         /*notify=*/true);
    return false;
  }
  answers_.push_back(Answer{s.serial, send_slot, static_cast<uint32_t>(r.response_size)});
  return true;
}

void DataPlane::FlushRound() {
  FlushWrites();
  PostAnswers();
}

void DataPlane::PostAnswers() {
  if (answers_.empty()) return;
  std::stable_sort(answers_.begin(), answers_.end(),
                   [](const Answer& a, const Answer& b) { return a.serial < b.serial; });
  for (size_t first = 0, end = 0; first < answers_.size(); first = end) {
    const uint32_t serial = answers_[first].serial;
    while (end < answers_.size() && answers_[end].serial == serial) ++end;
    // A session reaped since its answers were queued: its client is gone.
    auto it = by_serial_.find(serial);
    if (it == by_serial_.end()) continue;
    Session& s = *it->second;
    chain_.clear();
    for (size_t i = first; i < end; ++i) {
      const Answer& a = answers_[i];
      chain_.push_back(
          rdma::SendWr{MakeWrId(serial, WrTag::kSend, a.send_slot),
                       rdma::LocalBuf{res_.pool_mr.get(), SendOffset(s, a.send_slot), a.size}});
    }
    // Credits bound a session's answers below its send queue: a shorter
    // chain than asked means the device refused one.
    absl::StatusOr<size_t> posted = s.qp->PostSends(chain_);
    if (!posted.ok() || *posted != chain_.size()) {
      Reap(s,
           absl::StrCat("posting ", chain_.size(), " response(s) failed: ",
                        posted.ok() ? absl::StrCat("only ", *posted, " posted")
                                    : posted.status().ToString()),
           ErrorKind::kQpError, /*notify=*/true);
    }
  }
  answers_.clear();
}

}  // namespace kvnode::server
