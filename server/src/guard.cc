// The node's guard (docs/cluster.md "Slot migration"): when it is up, every
// session that can READ the arena checks the slot words, so the node may
// stop serving a slot of its current map (a migration's freeze) without a
// client reading the slot's records unchecked. Control thread only.
#include "server_impl.h"

namespace kvnode::server {

uint64_t ServerImpl::CheckBelowEpoch() const {
  if (guard_.up) return proto::kGuardUp;
  return opt_.shard_gate != nullptr ? opt_.shard_gate->epoch() : 0;
}

std::optional<std::string> ServerImpl::GuardBlocksUpgrade() const {
  if (!guard_.up) return std::nullopt;
  return std::string(
      "the node's guard is up (a slot migration is moving slots away from it): no live upgrade "
      "until it is lowered");
}

void ServerImpl::RaiseGuard(absl::Duration ack_timeout, GuardDone done) {
  if (opt_.shard_gate == nullptr) {
    done(absl::FailedPreconditionError("not a cluster node: no slot words to guard"));
    return;
  }
  if (upgrade_in_progress_.load()) {
    done(absl::FailedPreconditionError("a live upgrade is in progress: raise the guard after it"));
    return;
  }
  guard_.done.push_back(std::move(done));
  if (guard_.up) {
    // Raised already: this caller is answered once it holds.
    if (guard_.waiting.empty()) FinishGuard();
    return;
  }
  guard_.up = true;
  ++guard_.nonce;
  guard_.deadline = absl::Now() + ack_timeout;
  guard_.acked = 0;
  guard_.cut = 0;
  const proto::Guard g{guard_.nonce, proto::kGuardUp};
  std::vector<uint64_t> ids;
  for (const auto& [id, c] : conns_) ids.push_back(id);
  for (uint64_t id : ids) {
    Conn* c = FindConn(id);
    if (c == nullptr) continue;
    // A session can READ from its Welcome on. One whose Welcome went out
    // before the guard cannot be told it in order with its handshake: it
    // is cut, and its next Welcome carries the guard.
    const bool welcomed = c->session.state() != SessionState::kAwaitHello &&
                          c->session.state() != SessionState::kAwaitWelcome;
    if (!welcomed) continue;
    if (c->ready && c->session.slot_words_feature() && c->session.SendGuard(g).ok()) {
      guard_.waiting.insert(id);
      FlushConn(*c);  // may close it (CloseConn leaves the waiting set)
      continue;
    }
    CutForGuard(*c, c->session.slot_words_feature()
                        ? "its handshake was under way when the guard went up"
                        : "it does not check slot words (an older client, or slot words off)");
  }
  LOG(INFO) << "guard up: " << guard_.waiting.size() << " session(s) told to check the slot "
            << "words, " << guard_.cut << " cut; waiting at most "
            << absl::FormatDuration(ack_timeout) << " for their acknowledgements";
  if (guard_.waiting.empty()) FinishGuard();
}

void ServerImpl::LowerGuard() {
  if (!guard_.up) return;
  // A raise that has not held yet: its callers learn it never did.
  guard_.waiting.clear();
  for (GuardDone& d : std::exchange(guard_.done, {})) {
    d(absl::AbortedError("the guard was lowered before every session acknowledged it"));
  }
  guard_.up = false;
  ++guard_.nonce;
  const proto::Guard g{guard_.nonce, CheckBelowEpoch()};
  std::vector<uint64_t> ids;
  for (const auto& [id, c] : conns_) {
    if (c->ready && c->session.slot_words_feature()) ids.push_back(id);
  }
  for (uint64_t id : ids) {
    Conn* c = FindConn(id);
    if (c != nullptr && c->session.SendGuard(g).ok()) FlushConn(*c);
  }
  LOG(INFO) << "guard down: clients on a shard map older than epoch " << g.check_below_epoch
            << " go on checking the slot words (" << ids.size() << " session(s) told)";
}

void ServerImpl::OnGuardAck(Conn& c, uint64_t nonce) {
  if (!guard_.up || nonce != guard_.nonce || !guard_.waiting.erase(c.id)) return;
  ++guard_.acked;
  if (guard_.waiting.empty()) FinishGuard();
}

void ServerImpl::GuardLeft(uint64_t conn_id) {
  if (!guard_.up || !guard_.waiting.erase(conn_id)) return;
  ++guard_.cut;  // gone before acknowledging: it READs no more either
  if (guard_.waiting.empty()) FinishGuard();
}

void ServerImpl::GuardTimers(absl::Time now) {
  if (!guard_.up || guard_.waiting.empty() || now < guard_.deadline) return;
  const std::vector<uint64_t> late(guard_.waiting.begin(), guard_.waiting.end());
  for (uint64_t id : late) {
    if (Conn* c = FindConn(id); c != nullptr) {
      CutForGuard(*c, "it did not acknowledge the guard in time");
    }
  }
}

void ServerImpl::CutForGuard(Conn& c, std::string_view why) {
  LOG(WARNING) << "guard: client " << c.client_id << " (" << c.peer << ") cut: " << why;
  c.session.Goodbye(proto::GoodbyeReason::kGuardCut,
                    absl::StrCat("the node's slot ownership is about to change and ",
                                 std::string(why), "; connect again"));
  const bool waited = guard_.waiting.erase(c.id) > 0;
  ++guard_.cut;
  CloseConn(c, false);
  if (waited && guard_.waiting.empty()) FinishGuard();
}

void ServerImpl::FinishGuard() {
  // The cut sessions' teardown (their QPs and windows) was posted to the
  // data thread before this: the round trip through it answers only once
  // none of them can READ any more. Only the latest round trip answers (a
  // session may be cut, or told, after an earlier one started).
  const uint64_t seq = ++guard_.finish_seq;
  data_->Post([this, seq] {
    control_tasks_->Post([this, seq] {
      if (seq != guard_.finish_seq || !guard_.up || !guard_.waiting.empty()) return;
      const GuardRaised r{guard_.acked, guard_.cut};
      if (guard_.done.empty()) return;
      LOG(INFO) << "guard up and held: " << r.acknowledged << " session(s) acknowledged, " << r.cut
                << " cut";
      for (GuardDone& d : std::exchange(guard_.done, {})) d(r);
    });
  });
}

}  // namespace kvnode::server
