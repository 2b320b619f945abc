#include "node_internal.h"

#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "kvnode/proto/control.h"

namespace kvnode::upgrade {

absl::Status WithContext(const absl::Status& s, const std::string& what) {
  return absl::Status(s.code(), absl::StrCat(what, ": ", s.message()));
}

absl::Status UnexpectedMessage(const HandoffMessage& m, const char* expected) {
  return absl::FailedPreconditionError(absl::StrCat(
      "expected ", expected, ", received ", HandoffTypeName(static_cast<uint16_t>(TypeOf(m)))));
}

absl::Status OnControl(server::Server* s, std::function<void(server::Server*)> f,
                       absl::Duration timeout) {
  auto n = std::make_shared<absl::Notification>();
  s->RunOnControlThread([s, f = std::move(f), n] {
    f(s);
    n->Notify();
  });
  if (!n->WaitForNotificationWithTimeout(timeout)) {
    return absl::DeadlineExceededError("the control thread did not run the task in time");
  }
  return absl::OkStatus();
}

absl::Status OnControlWithDone(server::Server* s,
                               std::function<void(server::Server*, std::function<void()>)> f,
                               absl::Duration timeout) {
  auto n = std::make_shared<absl::Notification>();
  s->RunOnControlThread([s, f = std::move(f), n] { f(s, [n] { n->Notify(); }); });
  if (!n->WaitForNotificationWithTimeout(timeout)) {
    return absl::DeadlineExceededError(
        absl::StrCat("not done within ", absl::FormatDuration(timeout)));
  }
  return absl::OkStatus();
}

absl::StatusOr<server::RecordsExport> ExportSessionsBlocking(server::Server* s,
                                                             uint64_t changed_after, bool with_live,
                                                             absl::Duration timeout) {
  struct State {
    absl::Notification n;
    server::RecordsExport records;
  };
  auto st = std::make_shared<State>();
  s->RunOnControlThread([s, st, changed_after, with_live] {
    s->ExportSessions(changed_after, with_live, [st](server::RecordsExport r) {
      st->records = std::move(r);
      st->n.Notify();
    });
  });
  if (!st->n.WaitForNotificationWithTimeout(timeout)) {
    return absl::DeadlineExceededError("exporting the session table timed out");
  }
  return std::move(st->records);
}

MoveResult MoveClientsBlocking(server::Server* s, const std::string& endpoint,
                               uint64_t new_generation, absl::Duration deadline) {
  struct State {
    absl::Mutex mu;
    uint64_t sent = 0;
    uint64_t acked = 0;
    size_t pending = 1;  // until the first query
    bool queried = false;
  };
  auto st = std::make_shared<State>();
  proto::Move mv;
  mv.reason = proto::MoveReason::kUpgrade;
  mv.endpoint = endpoint;
  mv.new_generation = new_generation;
  mv.deadline_ms = static_cast<uint32_t>(absl::ToInt64Milliseconds(deadline));
  s->RunOnControlThread([s, st, mv] {
    const size_t sent = s->SendMoveToAll(mv, [s, st](uint64_t) {
      absl::MutexLock l(&st->mu);
      ++st->acked;
      st->pending = s->PendingMoveAcks();
    });
    absl::MutexLock l(&st->mu);
    st->sent = sent;
    st->pending = s->PendingMoveAcks();
    st->queried = true;
  });
  const absl::Time end = absl::Now() + deadline;
  // Acks arrive through the callback; a client that closes without one only
  // changes PendingMoveAcks(), so the count is re-read on the control thread
  // every 20 ms until it is zero or the deadline passes.
  for (;;) {
    {
      absl::MutexLock l(&st->mu);
      st->mu.AwaitWithDeadline(
          absl::Condition(
              +[](State* x) { return x->queried && x->pending == 0; }, st.get()),
          std::min(end, absl::Now() + absl::Milliseconds(20)));
      if (st->queried && st->pending == 0) break;
    }
    if (absl::Now() >= end) break;
    s->RunOnControlThread([s, st] {
      absl::MutexLock l(&st->mu);
      st->pending = s->PendingMoveAcks();
    });
  }
  absl::MutexLock l(&st->mu);
  return MoveResult{st->sent, st->acked};
}

SessionTable ToSessionTable(const std::vector<server::ClientRecordExport>& records) {
  SessionTable t;
  t.next_client_id = 1;  // ids are random per node; kept for the format
  for (const server::ClientRecordExport& r : records) {
    if (r.client_id == 0) continue;
    SessionRecord sr;
    sr.client_id = r.client_id;
    sr.resume_secret = r.secret;
    // The field carries the window's floor (the highest forgotten sequence;
    // 0 = nothing forgotten), so that N refuses what O would refuse.
    bool has_floor = r.window.has_floor;
    uint64_t floor = r.window.floor;
    // Entries are oldest first. A window larger than the format allows (not
    // reachable: --dedupe_window <= kMaxDedupeWindow) keeps its newest
    // entries, the ones a client may still retry, and the floor rises over
    // the others so that they are refused as too old, never applied again.
    const size_t n = r.window.entries.size();
    const size_t skip = n > kMaxDedupeWindow ? n - kMaxDedupeWindow : 0;
    sr.window.reserve(n - skip);
    for (size_t i = 0; i < n; ++i) {
      const server::DedupeEntry& e = r.window.entries[i];
      if (i < skip) {
        if (!has_floor || e.sequence > floor) floor = e.sequence;
        has_floor = true;
        continue;
      }
      sr.window.push_back(DedupeEntry{e.sequence, e.opcode, e.status, e.version});
    }
    sr.highest_sequence = has_floor ? floor : 0;
    t.sessions.push_back(std::move(sr));
  }
  return t;
}

std::vector<server::ClientRecordExport> FromSessionRecords(const std::vector<SessionRecord>& t) {
  std::vector<server::ClientRecordExport> out;
  out.reserve(t.size());
  for (const SessionRecord& sr : t) {
    server::ClientRecordExport r;
    r.client_id = sr.client_id;
    r.secret = sr.resume_secret;
    r.window.has_floor = sr.highest_sequence != 0;
    r.window.floor = sr.highest_sequence;
    r.window.entries.reserve(sr.window.size());
    for (const DedupeEntry& e : sr.window) {
      r.window.entries.push_back(server::DedupeEntry{e.sequence, e.opcode, e.status, e.version});
    }
    out.push_back(std::move(r));
  }
  return out;
}

CounterSnapshot ToCounters(const std::vector<std::pair<std::string, uint64_t>>& v) {
  CounterSnapshot c;
  for (const auto& [k, val] : v) {
    if (k.empty() || k.size() > kMaxCounterNameSize || c.counters.size() >= kMaxCounters) continue;
    c.counters.push_back(Counter{k, val});
  }
  return c;
}

std::vector<std::pair<std::string, uint64_t>> FromCounters(const CounterSnapshot& c) {
  std::vector<std::pair<std::string, uint64_t>> v;
  for (const Counter& x : c.counters) v.emplace_back(x.name, x.value);
  return v;
}

}  // namespace kvnode::upgrade
