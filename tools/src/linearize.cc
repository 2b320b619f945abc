#include "kvnode/load/linearize.h"

#include <algorithm>
#include <limits>
#include <tuple>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kvnode/base/errno.h"
#include "kvnode/load/rng.h"

namespace kvnode::load {
namespace {

using base::Av;

// Register states: a value id (>= 0, interned per key), or these.
constexpr int32_t kAbsent = -1;
constexpr int32_t kAnyState = -2;  // LinearizeOptions::Initial::kAny, not read yet
// A value no GET reads: all such values behave alike (a DELETE finds them,
// no read can tell them apart), so they share one state and the memo
// treats them as one.
constexpr int32_t kUnread = -3;
constexpr uint64_t kNever = std::numeric_limits<uint64_t>::max();

// What an operation requires of the register and does to it.
enum class Step : uint8_t {
  kGetValue,         // GET ok: holds `value`
  kGetAbsent,        // GET not_found: absent
  kPut,              // PUT: -> value
  kPutIfAbsent,      // failed PUT nobody read (rule 2): only on absent
  kDeleteOk,         // DELETE ok: existed -> absent
  kDeleteNotFound,   // DELETE not_found: absent -> absent
  kDeleteIfPresent,  // failed DELETE (rule 3): only on present
};

struct Op {
  Step step = Step::kPut;
  int32_t value = kAbsent;
  bool required = true;  // must be linearized (every known outcome, and rule 1)
  uint64_t call = 0;
  uint64_t ret = kNever;  // kNever: no return event (need not be linearized)
  size_t index = 0;       // into the caller's operations
};

// One call or return event in the doubly linked list of the search (Lowe's
// "dancing links": a lifted entry keeps its neighbours, so entries put back
// in the reverse order of their removal restore the list exactly).
struct Entry {
  uint32_t op = 0;
  bool is_return = false;
  int32_t match = -1;  // a call's return entry, -1 if it has none
  int32_t prev = -1;
  int32_t next = -1;
};

struct CacheKey {
  uint64_t a, b;
  int32_t state;
  bool operator==(const CacheKey&) const = default;
  template <typename H>
  friend H AbslHashValue(H h, const CacheKey& k) {
    return H::combine(std::move(h), k.a, k.b, k.state);
  }
};

class KeyChecker {
 public:
  KeyChecker(std::span<const HistoryOp> ops, const LinearizeOptions& options)
      : in_(ops), options_(options) {}

  KeyVerdict Run() {
    KeyVerdict v;
    if (!in_.empty()) v.key = in_[0].key;
    Prepare();
    v.ops = ops_.size();
    BuildEntries();
    const Result r = Search();
    v.steps = steps_;
    if (r == Result::kOk) return v;
    v.result = r == Result::kBudget ? KeyVerdict::Result::kUndecided
                                    : KeyVerdict::Result::kNotLinearizable;
    Explain(&v);
    return v;
  }

 private:
  enum class Result { kOk, kFail, kBudget };
  struct Frame {
    int32_t entry;
    int32_t prelude;  // a failed write (operation) applied just before, or -1
    int32_t state;    // before both
    bool forced;      // it left the state as it was: no sibling to try
    uint8_t pass;     // Search's pass it was chosen in
  };

  int32_t Intern(const std::string& value) {
    auto [it, inserted] = ids_.try_emplace(value, static_cast<int32_t>(names_.size()));
    if (inserted) names_.push_back(value);
    return it->second;
  }

  // Turns the caller's operations into Ops: failed GETs dropped, values
  // interned, the restrictions of linearize.h applied to failed writes.
  void Prepare() {
    std::vector<uint32_t> writers;     // PUTs per value id
    std::vector<uint64_t> first_read;  // earliest return of a GET ok per value id
    auto grow = [&](int32_t id) {
      if (static_cast<size_t>(id) >= writers.size()) {
        writers.resize(id + 1, 0);
        first_read.resize(id + 1, kNever);
      }
    };
    for (const HistoryOp& h : in_) {
      if (h.kind == HistoryOpKind::kPut) {
        const int32_t id = Intern(h.value);
        grow(id);
        ++writers[id];
      } else if (h.kind == HistoryOpKind::kGet && h.outcome == HistoryOutcome::kOk) {
        const int32_t id = Intern(h.value);
        grow(id);
        first_read[id] = std::min(first_read[id], h.return_ns);
      }
    }
    written_.assign(names_.size(), 0);
    for (size_t id = 0; id < writers.size(); ++id) written_[id] = writers[id] > 0;
    writer_line_.assign(names_.size(), 0);
    for (const HistoryOp& h : in_) {
      if (h.kind == HistoryOpKind::kPut) writer_line_[ids_.at(h.value)] = h.line;
    }
    for (size_t i = 0; i < in_.size(); ++i) {
      const HistoryOp& h = in_[i];
      const bool failed = h.outcome == HistoryOutcome::kFailed;
      if (h.kind == HistoryOpKind::kGet && failed) continue;  // says nothing
      Op op;
      op.index = i;
      op.call = h.call_ns;
      op.ret = h.return_ns;
      switch (h.kind) {
        case HistoryOpKind::kGet:
          if (h.outcome == HistoryOutcome::kOk) {
            op.step = Step::kGetValue;
            op.value = ids_.at(h.value);
          } else {
            op.step = Step::kGetAbsent;
          }
          break;
        case HistoryOpKind::kPut:
          op.step = Step::kPut;
          op.value = ids_.at(h.value);
          if (failed) PrepareFailedPut(&op, writers[op.value], first_read[op.value]);
          if (first_read[ids_.at(h.value)] == kNever) op.value = kUnread;
          break;
        case HistoryOpKind::kDelete:
          op.step = h.outcome == HistoryOutcome::kOk         ? Step::kDeleteOk
                    : h.outcome == HistoryOutcome::kNotFound ? Step::kDeleteNotFound
                                                             : Step::kDeleteIfPresent;
          if (failed) {
            op.required = false;
            op.ret = kNever;
            ++prelude_optional_;
          }
          break;
      }
      ops_.push_back(op);
    }
  }

  // linearize.h rules 1 and 2.
  void PrepareFailedPut(Op* op, uint32_t writers, uint64_t first_read) {
    if (writers == 1 && first_read != kNever) {
      op->required = true;  // rule 1: read, so applied before that read returned
      op->ret = std::max(op->call, first_read);
      return;
    }
    op->required = false;
    op->ret = kNever;
    if (first_read == kNever) {
      op->step = Step::kPutIfAbsent;  // rule 2
      ++prelude_optional_;
    } else {
      ++free_optional_;
    }
  }

  bool Apply(const Op& op, int32_t s, int32_t* next) const {
    const bool absent_ok = s == kAbsent || s == kAnyState;
    switch (op.step) {
      case Step::kGetValue:
        if (s == op.value) {
          *next = s;
          return true;
        }
        // An unknown initial value may be any value this history never writes.
        if (s == kAnyState && !written_[op.value]) {
          *next = op.value;
          return true;
        }
        return false;
      case Step::kGetAbsent:
      case Step::kDeleteNotFound:
        *next = kAbsent;
        return absent_ok;
      case Step::kPut:
        *next = op.value;
        return true;
      case Step::kPutIfAbsent:
        *next = op.value;
        return absent_ok;
      case Step::kDeleteOk:
      case Step::kDeleteIfPresent:
        *next = kAbsent;
        return s != kAbsent;
    }
    return false;
  }

  static bool IsPrelude(Step s) { return s == Step::kDeleteIfPresent || s == Step::kPutIfAbsent; }

  // The list holds every operation but the preludes (never tried alone):
  // those go, by call time, to a list per kind for FindPrelude.
  void BuildEntries() {
    std::vector<std::tuple<uint64_t, bool, uint32_t>> events;
    for (uint32_t i = 0; i < ops_.size(); ++i) {
      if (IsPrelude(ops_[i].step)) {
        (ops_[i].step == Step::kDeleteIfPresent ? prelude_deletes_ : prelude_puts_).push_back(i);
        continue;
      }
      events.emplace_back(ops_[i].call, false, i);
      if (ops_[i].required) events.emplace_back(ops_[i].ret, true, i);
    }
    // Time order; at equal times calls first (overlapping: the permissive
    // reading of a tie).
    std::sort(events.begin(), events.end());
    entries_.resize(events.size() + 1);  // entries_[0]: the head
    std::vector<int32_t> call_of(ops_.size(), -1);
    for (size_t k = 0; k < events.size(); ++k) {
      const int32_t e = static_cast<int32_t>(k + 1);
      Entry& en = entries_[e];
      en.op = std::get<2>(events[k]);
      en.is_return = std::get<1>(events[k]);
      en.prev = e - 1;
      en.next = k + 1 < events.size() ? e + 1 : -1;
      if (en.is_return) {
        entries_[call_of[en.op]].match = e;
      } else {
        call_of[en.op] = e;
      }
    }
    entries_[0].next = events.empty() ? -1 : 1;
    for (auto* l : {&prelude_deletes_, &prelude_puts_}) {
      std::sort(l->begin(), l->end(),
                [&](uint32_t a, uint32_t b) { return ops_[a].call < ops_[b].call; });
    }
    Rng rng(0x6b76686973746f72ull);  // fixed: verdicts are reproducible
    zobrist_.resize(ops_.size());
    for (auto& z : zobrist_) z = {rng.Next(), rng.Next()};
  }

  void Unlink(int32_t e) {
    const Entry& en = entries_[e];
    entries_[en.prev].next = en.next;
    if (en.next >= 0) entries_[en.next].prev = en.prev;
  }
  void Relink(int32_t e) {
    const Entry& en = entries_[e];
    entries_[en.prev].next = e;
    if (en.next >= 0) entries_[en.next].prev = e;
  }
  void Lift(int32_t call) {
    Unlink(call);
    if (entries_[call].match >= 0) Unlink(entries_[call].match);
  }
  void Unlift(int32_t call) {
    if (entries_[call].match >= 0) Relink(entries_[call].match);
    Relink(call);
  }

  // The memo: configurations (required operations linearized, register,
  // failed writes applied) already explored, each of which failed or is an
  // ancestor of the current one. A configuration is skipped when one with
  // the same required set and register and a SUBSET of its failed writes
  // applied is there: that one had every option it has, and more (a failed
  // write not yet applied can still be applied, or never).
  // Keyed by (Zobrist hash of the required set, register); each key holds a
  // short list of failed-write sets (mostly one, mostly empty) in a pool.
  class Memo {
   public:
    // Records the configuration; false if one that covers it is there.
    bool Insert(uint64_t a, uint64_t b, int32_t state, const std::vector<uint32_t>& applied,
                const std::vector<uint8_t>& is_applied) {
      auto [it, inserted] = heads_.try_emplace(CacheKey{a, b, state}, -1);
      for (int32_t r = it->second; !inserted && r >= 0; r = records_[r].next) {
        const Record& rec = records_[r];
        bool subset = true;
        for (uint32_t k = 0; k < rec.len && subset; ++k) subset = is_applied[pool_[rec.offset + k]];
        if (subset) return false;
      }
      records_.push_back(
          {it->second, static_cast<uint32_t>(pool_.size()), static_cast<uint32_t>(applied.size())});
      pool_.insert(pool_.end(), applied.begin(), applied.end());
      it->second = static_cast<int32_t>(records_.size() - 1);
      return true;
    }

   private:
    struct Record {
      int32_t next;  // the key's next record, -1 at the end
      uint32_t offset, len;
    };
    absl::flat_hash_map<CacheKey, int32_t> heads_;
    std::vector<Record> records_;
    std::vector<uint32_t> pool_;
  };

  // Tries, at each configuration, the operations that may take effect next
  // (calls before the first pending return): the required ones that may
  // (pass 0), then those a failed write applied just before would let take
  // effect (pass 1, FindPrelude), then failed PUTs of a value some GET read
  // but other PUTs write too (pass 2, rare: kvload's values are unique).
  // Failed writes are never applied otherwise. Trying "no failed write
  // applied" first lets the memo cover the configurations that apply one.
  Result Search() {
    state_ = options_.initial == LinearizeOptions::Initial::kAny ? kAnyState : kAbsent;
    for (const Op& op : ops_) remaining_ += op.required;
    is_applied_.assign(ops_.size(), 0);
    Memo memo;
    (void)memo.Insert(0, 0, state_, applied_, is_applied_);
    int32_t e = entries_[0].next;
    uint8_t pass = 0;
    while (remaining_ > 0) {
      // A required operation's return entry is always in the list, after
      // its call: `e` cannot run off the end while any remains.
      const Entry& en = entries_[e];
      if (en.is_return) {
        if (pass == 0 && prelude_optional_ > 0) {
          pass = 1;
          e = entries_[0].next;
        } else if (pass <= 1 && free_optional_ > 0) {
          pass = 2;
          e = entries_[0].next;
        } else if (!Backtrack(&e, &pass)) {  // undo the last choice
          return Result::kFail;
        }
        continue;
      }
      const Op& op = ops_[en.op];
      int32_t next;
      int32_t prelude = -1;
      bool move;
      switch (pass) {
        case 0:
          move = op.required && Applies(op, &next);
          break;
        case 1:
          move = op.required && !Applies(op, &next) && FindPrelude(op, &prelude, &next);
          break;
        default:
          move = !op.required && op.step == Step::kPut && Applies(op, &next);
          break;
      }
      if (!move) {
        e = en.next;
        continue;
      }
      if (++steps_ > options_.max_steps && options_.max_steps != 0) return Result::kBudget;
      // A required operation that only reads the register (a GET, a DELETE
      // not_found: absent stays absent) and may take effect now may as well
      // take effect now: in any linearization from here it
      // can be moved to this point (it changes nothing, and everything that
      // returned before its call is linearized already). So this
      // configuration has a linearization iff that child has: no sibling
      // needs trying (a forced frame), and a child in the memo (it failed)
      // fails this configuration too.
      const bool forced = op.required && prelude < 0 && next == state_ && ReadsOnly(op.step);
      const auto [za, zb] = zobrist_[en.op];
      const uint64_t na = op.required ? ha_ ^ za : ha_, nb = op.required ? hb_ ^ zb : hb_;
      if (prelude >= 0) MarkApplied(prelude);
      if (!op.required) MarkApplied(en.op);
      const bool fresh = memo.Insert(na, nb, next, applied_, is_applied_);
      if (!fresh) {
        if (!op.required) UnmarkApplied(en.op);
        if (prelude >= 0) UnmarkApplied(prelude);
      }
      if (fresh) {
        Push({e, prelude, state_, forced, pass});
        state_ = next;
        ha_ = na;
        hb_ = nb;
        remaining_ -= op.required;
        Lift(e);
        e = entries_[0].next;
        pass = 0;
      } else if (forced) {
        if (!Backtrack(&e, &pass)) return Result::kFail;
      } else {
        e = en.next;
      }
    }
    return Result::kOk;
  }

  static bool ReadsOnly(Step s) {
    return s == Step::kGetValue || s == Step::kGetAbsent || s == Step::kDeleteNotFound;
  }

  void MarkApplied(uint32_t o) {
    is_applied_[o] = 1;
    applied_.push_back(o);
  }
  void UnmarkApplied(uint32_t o) {
    is_applied_[o] = 0;
    applied_.pop_back();
  }

  // Whether `op` may take effect now; a failed write that would change
  // nothing is not worth applying.
  bool Applies(const Op& op, int32_t* next) const {
    if (!Apply(op, state_, next)) return false;
    return op.required || *next != state_;
  }

  // A failed write that lets required `op` take effect right after it:
  // a failed DELETE before a not_found (GET or DELETE) on a present key, a
  // failed PUT nobody read before a DELETE ok on an absent key. Only there
  // are they worth applying (linearize.h rules 2 and 3: anywhere else their
  // effect is unseen or breaks the next operation, and moving one later, up
  // to the operation it serves, is always allowed). All such failed writes
  // that may take effect now (called by the first pending return) behave
  // alike, so the earliest called one not applied yet serves.
  // Sets *prelude (the operation) and *next (the register after both).
  bool FindPrelude(const Op& op, int32_t* prelude, int32_t* next) const {
    const std::vector<uint32_t>* kind;
    if ((op.step == Step::kGetAbsent || op.step == Step::kDeleteNotFound) &&
        (state_ >= 0 || state_ == kUnread)) {
      kind = &prelude_deletes_;
    } else if (op.step == Step::kDeleteOk && state_ == kAbsent) {
      kind = &prelude_puts_;
    } else {
      return false;
    }
    int32_t x = entries_[0].next;
    while (x >= 0 && !entries_[x].is_return) x = entries_[x].next;
    const uint64_t horizon = x >= 0 ? ops_[entries_[x].op].ret : kNever;
    for (uint32_t o : *kind) {
      if (ops_[o].call > horizon) break;
      if (!is_applied_[o]) {
        *prelude = static_cast<int32_t>(o);
        *next = kAbsent;
        return true;
      }
    }
    return false;
  }

  // Undoes the last choice that has siblings left (popping forced frames
  // on the way); false when there is none: not linearizable.
  bool Backtrack(int32_t* e, uint8_t* pass) {
    for (;;) {
      if (stack_.empty()) return false;
      const Frame f = Pop();
      const uint32_t o = entries_[f.entry].op;
      if (ops_[o].required) {
        ha_ ^= zobrist_[o].first;
        hb_ ^= zobrist_[o].second;
        ++remaining_;
      } else {
        UnmarkApplied(o);
      }
      Unlift(f.entry);
      if (f.prelude >= 0) UnmarkApplied(f.prelude);
      state_ = f.state;
      *e = entries_[f.entry].next;
      *pass = f.pass;
      if (!f.forced) return true;
    }
  }

  // The deepest stack seen is kept in best_ (for Explain) without copying
  // it whole each time: best_[0, same_) always equals stack_[0, same_).
  void Push(const Frame& f) {
    stack_.push_back(f);
    if (stack_.size() > best_.size()) {
      best_.resize(stack_.size());
      std::copy(stack_.begin() + same_, stack_.end(), best_.begin() + same_);
      same_ = stack_.size();
    }
  }
  Frame Pop() {
    const Frame f = stack_.back();
    stack_.pop_back();
    same_ = std::min(same_, stack_.size());
    return f;
  }

  std::string StateName(int32_t s) const {
    if (s == kAbsent) return "absent";
    if (s == kAnyState) return "any (initial, unknown)";
    if (s == kUnread) return "a value no GET reads";
    return names_[s];
  }

  std::string WhyNot(const Op& op, int32_t s) const {
    const std::string holds = absl::StrCat("the register holds ", StateName(s));
    switch (op.step) {
      case Step::kGetValue:
        return absl::StrCat("reads ", names_[op.value],
                            writer_line_[op.value] == 0
                                ? std::string(" (no PUT writes it)")
                                : absl::StrCat(" (written by line ", writer_line_[op.value], ")"),
                            ", ", holds);
      case Step::kGetAbsent:
        return absl::StrCat("reads not_found, ", holds);
      case Step::kPut:
        return "";
      case Step::kPutIfAbsent:
        return "a failed PUT no GET read: applied only right before a DELETE ok it explains";
      case Step::kDeleteOk:
        return "answered ok (the key existed), but the key is absent";
      case Step::kDeleteNotFound:
        return absl::StrCat("answered not_found, ", holds);
      case Step::kDeleteIfPresent:
        return "a failed DELETE: applied only right before a not_found it explains";
    }
    return "";
  }

  void Explain(KeyVerdict* v) const {
    std::vector<uint8_t> in_best(ops_.size(), 0);
    int32_t state = options_.initial == LinearizeOptions::Initial::kAny ? kAnyState : kAbsent;
    std::vector<uint32_t> order;  // the prefix's operations, preludes included
    for (const Frame& f : best_) {
      if (f.prelude >= 0) order.push_back(f.prelude);
      order.push_back(entries_[f.entry].op);
    }
    for (uint32_t o : order) {
      in_best[o] = 1;
      int32_t next = kAbsent;
      (void)Apply(ops_[o], state, &next);  // succeeded in the search
      state = next;
    }
    v->prefix_ops = order.size();
    v->state = StateName(state);
    const size_t from = order.size() > options_.context ? order.size() - options_.context : 0;
    for (size_t i = from; i < order.size(); ++i) v->tail.push_back(ops_[order[i]].index);
    uint64_t first_ret = kNever;
    size_t first_ret_op = 0;
    for (size_t o = 0; o < ops_.size(); ++o) {
      if (!in_best[o] && ops_[o].required && ops_[o].ret < first_ret) {
        first_ret = ops_[o].ret;
        first_ret_op = o;
      }
    }
    std::vector<size_t> stuck;
    for (size_t o = 0; o < ops_.size(); ++o) {
      if (in_best[o] || ops_[o].call > first_ret) continue;
      if (IsPrelude(ops_[o].step)) {
        ++v->unused_failed_writes;
      } else {
        stuck.push_back(o);
      }
    }
    std::sort(stuck.begin(), stuck.end(),
              [&](size_t a, size_t b) { return ops_[a].call < ops_[b].call; });
    for (size_t o : stuck) {
      v->stuck.push_back(ops_[o].index);
      std::string why = WhyNot(ops_[o], state);
      int32_t next;
      const bool alone = ops_[o].required || ops_[o].step == Step::kPut;
      if (alone && Apply(ops_[o], state, &next)) {
        why = absl::StrCat("could take effect here, but then no order of the others passes the ",
                           o == first_ret_op ? "return of this one" : "earliest return");
      }
      v->reasons.push_back(std::move(why));
    }
  }

  std::span<const HistoryOp> in_;
  const LinearizeOptions options_;
  absl::flat_hash_map<std::string, int32_t> ids_;
  std::vector<std::string> names_;
  std::vector<uint8_t> written_;       // per value id: some PUT writes it
  std::vector<uint64_t> writer_line_;  // per value id: a PUT's line writing it (0: none)
  std::vector<Op> ops_;
  std::vector<Entry> entries_;
  std::vector<std::pair<uint64_t, uint64_t>> zobrist_;
  // The search's configuration: register, Zobrist hash of the required
  // operations linearized, how many required remain, failed writes applied
  // (in order, and as a flag per operation).
  int32_t state_ = kAbsent;
  uint64_t ha_ = 0, hb_ = 0;
  size_t remaining_ = 0;
  size_t prelude_optional_ = 0;            // failed writes applied only as preludes
  std::vector<uint32_t> prelude_deletes_;  // kDeleteIfPresent, by call time
  std::vector<uint32_t> prelude_puts_;     // kPutIfAbsent, by call time
  size_t free_optional_ = 0;               // failed PUTs tried on their own (pass 2)
  std::vector<uint32_t> applied_;
  std::vector<uint8_t> is_applied_;
  std::vector<Frame> stack_;
  std::vector<Frame> best_;
  size_t same_ = 0;
  uint64_t steps_ = 0;
};

std::string Seconds(uint64_t ns) {
  return absl::StrFormat("%d.%09d", ns / 1000000000, ns % 1000000000);
}

std::string OpLine(const HistoryOp& h) {
  std::string what = absl::StrCat(Av(HistoryOpKindName(h.kind)));
  if (h.kind == HistoryOpKind::kPut) absl::StrAppend(&what, " ", h.value);
  absl::StrAppend(&what, " -> ", Av(HistoryOutcomeName(h.outcome)));
  if (h.kind == HistoryOpKind::kGet && h.outcome == HistoryOutcome::kOk) {
    absl::StrAppend(&what, " ", h.value);
  }
  return absl::StrFormat("line %-8d client %-3d %-28s call %s  return %s", h.line, h.client, what,
                         Seconds(h.call_ns), Seconds(h.return_ns));
}

}  // namespace

KeyVerdict CheckKey(std::span<const HistoryOp> ops, const LinearizeOptions& options) {
  return KeyChecker(ops, options).Run();
}

std::map<std::string, std::vector<HistoryOp>> SplitByKey(std::vector<HistoryOp> ops) {
  std::map<std::string, std::vector<HistoryOp>> by_key;
  for (HistoryOp& op : ops) by_key[op.key].push_back(std::move(op));
  return by_key;
}

std::string DescribeVerdict(const KeyVerdict& v, std::span<const HistoryOp> ops) {
  const char* what = v.result == KeyVerdict::Result::kLinearizable      ? "linearizable"
                     : v.result == KeyVerdict::Result::kNotLinearizable ? "NOT LINEARIZABLE"
                                                                        : "UNDECIDED (step limit)";
  std::string out =
      absl::StrFormat("key %s: %s (%d operations, %d search steps)\n", v.key, what, v.ops, v.steps);
  if (v.result == KeyVerdict::Result::kLinearizable) return out;
  if (v.result == KeyVerdict::Result::kUndecided) {
    absl::StrAppend(&out, "  the search stopped; the deepest point it had reached:\n");
  }
  absl::StrAppendFormat(&out, "  longest linearizable prefix found: %d operations; its last %d:\n",
                        v.prefix_ops, v.tail.size());
  for (size_t i : v.tail) absl::StrAppend(&out, "    ", OpLine(ops[i]), "\n");
  absl::StrAppend(&out, "  register after them: ", v.state, "\n");
  absl::StrAppend(&out, "  none of these can take effect next:\n");
  if (v.unused_failed_writes > 0) {
    absl::StrAppendFormat(&out,
                          "    (nor help %d failed writes called by then and not applied: one "
                          "only ever takes effect right before an answer it explains)\n",
                          v.unused_failed_writes);
  }
  for (size_t k = 0; k < v.stuck.size(); ++k) {
    absl::StrAppend(&out, "    ", OpLine(ops[v.stuck[k]]), "\n      ", v.reasons[k], "\n");
  }
  return out;
}

std::vector<HistoryOp> GenerateHistory(const GenerateOptions& o) {
  Rng rng(o.seed);
  const uint32_t slots = std::max<uint32_t>(1, o.clients * o.depth);
  std::vector<uint64_t> slot_free(slots, 0);
  std::vector<HistoryOp> ops(o.ops);
  std::vector<uint64_t> at(o.ops);      // the instant each takes effect
  std::vector<uint8_t> applied(o.ops);  // a failed write that took effect
  for (uint64_t i = 0; i < o.ops; ++i) {
    const uint32_t s = static_cast<uint32_t>(i % slots);
    HistoryOp& h = ops[i];
    h.client = s % std::max<uint32_t>(1, o.clients);
    h.key = absl::StrFormat("k%05d", rng.Uniform(std::max<uint32_t>(1, o.keys)));
    h.call_ns = slot_free[s] + rng.Uniform(200);
    h.return_ns = h.call_ns + 500 + rng.Uniform(5000);
    slot_free[s] = h.return_ns;
    at[i] = h.call_ns + rng.Uniform(h.return_ns - h.call_ns + 1);
    applied[i] = 1;
    if (rng.NextDouble() < o.read_ratio) {
      h.kind = HistoryOpKind::kGet;
      continue;
    }
    h.kind = rng.NextDouble() < o.delete_ratio ? HistoryOpKind::kDelete : HistoryOpKind::kPut;
    if (rng.NextDouble() < o.failed) {
      h.outcome = HistoryOutcome::kFailed;
      applied[i] = rng.Uniform(2);
    }
  }
  std::vector<size_t> order(o.ops);
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return at[a] < at[b]; });
  absl::flat_hash_map<std::string, std::string> reg;  // absent: not in the map
  absl::flat_hash_map<std::string, uint64_t> versions;
  for (size_t i : order) {
    HistoryOp& h = ops[i];
    auto it = reg.find(h.key);
    switch (h.kind) {
      case HistoryOpKind::kGet:
        h.outcome = it == reg.end() ? HistoryOutcome::kNotFound : HistoryOutcome::kOk;
        if (it != reg.end()) h.value = it->second;
        break;
      case HistoryOpKind::kPut:
        h.value = absl::StrCat(++versions[h.key]);
        if (applied[i]) reg[h.key] = h.value;
        break;
      case HistoryOpKind::kDelete:
        if (h.outcome != HistoryOutcome::kFailed) {
          h.outcome = it == reg.end() ? HistoryOutcome::kNotFound : HistoryOutcome::kOk;
        }
        if (applied[i] && it != reg.end()) reg.erase(it);
        break;
    }
  }
  for (size_t i = 0; i < ops.size(); ++i) ops[i].line = i + 2;  // as if after the header
  return ops;
}

}  // namespace kvnode::load
