// Linearizability of a key-value history (history.h), one register per key.
//
// A history is linearizable when every operation can be given one instant
// inside its [call_ns, return_ns] at which it took effect, such that the
// operations in instant order are a correct sequential run of a register
// that holds a value or nothing:
//   PUT v            -> holds v
//   DELETE ok        the key existed  -> absent
//   DELETE not_found the key was absent -> absent
//   GET v            reads v;  GET not_found reads absent
// Keys are independent registers, so each key is checked on its own
// (P-compositionality: Horn & Kroening, "Faster linearizability checking
// via P-compositionality", 2015).
//
// Outcomes that are unknown: a failed GET is dropped. A failed PUT or DELETE
// may have taken effect at any instant after its call, or never (its return
// is infinity). Sound restrictions keep the search small (each keeps at
// least one linearization if any exists):
//  1. A failed PUT whose value id no other PUT writes and some GET read must
//     have taken effect before the earliest of those GETs returned: that is
//     its return, and it must be linearized.
//  2. A failed PUT whose value no GET read is only worth applying right
//     before a DELETE answered ok on an absent key; anywhere else its value
//     is overwritten unseen or breaks the next operation, and moving it
//     later (always allowed) up to such a DELETE changes nothing between.
//  3. A failed DELETE likewise, right before a not_found (GET or DELETE) on
//     a key that exists.
//  Failed writes under 2 and 3 that may take effect at a point behave
//  alike, so the search tries one of them there (a "prelude"), never each.
//  4. Values no GET reads behave alike: they share one register state.
// Other failed PUTs (a value some GET read that two PUTs write; kvload's
// values are unique) may be applied anywhere, or never.
//
// The search: Wing & Gong's, with Lowe's just-in-time linearization and
// memoization of (set of operations linearized, register) as in Porcupine
// (Athalye) and Knossos: the events (calls and returns) in time order, the
// first return whose operation is not linearized forces a backtrack. Ties of
// times count as overlapping. Two additions: a required operation that only
// reads the register (a GET, a DELETE not_found) and may take effect is
// taken without trying its siblings (it can always be moved to that point),
// and a configuration is skipped when one with the same set and register
// and a subset of the failed writes applied was explored. The set of
// required operations is identified by a 128-bit Zobrist hash: a collision
// could only make the checker miss a linearization (a false alarm, never a
// missed violation), with probability ~ steps^2/2^128. The test checks all
// this against brute force on random small histories.
//
// Cost: exponential in the operations in flight per key at worst; a history
// that is not linearizable is searched whole up to the violation.
#ifndef KVNODE_CLIENT_LOAD_LINEARIZE_H_
#define KVNODE_CLIENT_LOAD_LINEARIZE_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "kvnode/load/history.h"

namespace kvnode::load {

struct LinearizeOptions {
  // The register before the first operation. Default kAbsent (a node
  // started empty, or keys nobody wrote before). kAny: unknown; the first
  // GET may read any value no PUT of the history writes, or not_found.
  enum class Initial { kAbsent, kAny };
  Initial initial = Initial::kAbsent;
  // Search steps per key before giving up (verdict kUndecided). Default 2e8
  // (a minute or two); 0: no limit.
  uint64_t max_steps = 200000000;
  // Linearized operations shown before the point of failure. Default 4.
  size_t context = 4;
};

struct KeyVerdict {
  enum class Result { kLinearizable, kNotLinearizable, kUndecided };
  Result result = Result::kLinearizable;
  std::string key;
  size_t ops = 0;      // operations checked (failed GETs are not)
  uint64_t steps = 0;  // operations tried by the search
  // kNotLinearizable (and kUndecided: where the search had got to): the
  // window around the point where the search failed.
  // Indices into the operations passed to CheckKey.
  //   prefix_ops   how many operations the longest linearizable prefix found
  //                holds (the search's deepest point)
  //   tail         its last `context` operations, in linearization order
  //   state        the register after it: "absent", "any" or a value id
  //   stuck        the operations not in it that were called before the
  //                earliest return among them, by call time: none of them
  //                can be the next to take effect in any linearization
  //   reasons      per stuck operation, why not here (or that it could be,
  //                but no order of those after it passes the earliest return)
  size_t prefix_ops = 0;
  std::vector<size_t> tail;
  std::string state;
  std::vector<size_t> stuck;
  std::vector<std::string> reasons;
  size_t unused_failed_writes = 0;  // rules 2 and 3 ones called by then, not in `stuck`
};

// Checks the operations of ONE key (all with the same key).
KeyVerdict CheckKey(std::span<const HistoryOp> ops, const LinearizeOptions& options = {});

// The operations of each key, in key order (then in their given order).
std::map<std::string, std::vector<HistoryOp>> SplitByKey(std::vector<HistoryOp> ops);

// Human-readable verdict: one line, plus the window when not linearizable.
// `ops` are the operations CheckKey was given.
std::string DescribeVerdict(const KeyVerdict& v, std::span<const HistoryOp> ops);

// A synthetic history that is linearizable by construction (for tests and
// measuring the checker): `clients` x `depth` sequential slots issue
// operations on `keys` keys (uniform); each takes effect at a random instant
// of its interval; a fraction `failed` of the writes are reported failed
// (half of them applied, half never).
struct GenerateOptions {
  uint64_t ops = 100000;
  uint32_t keys = 6;
  uint32_t clients = 6;
  uint32_t depth = 4;
  double read_ratio = 0.5;
  double delete_ratio = 0.3;  // of the writes
  double failed = 0.001;      // of the writes
  uint64_t seed = 1;
};
std::vector<HistoryOp> GenerateHistory(const GenerateOptions& options);

}  // namespace kvnode::load

#endif  // KVNODE_CLIENT_LOAD_LINEARIZE_H_
