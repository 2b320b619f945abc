// How many operations of each kind a Client may start (see client.h): the
// accounting behind available(), available(kind) and writes_held(), apart
// from the slots and verbs objects so that it can be tested without a device.
//
// Owned by the Client's thread; no locks.
#ifndef KVNODE_CLIENT_LIB_OP_BUDGET_H_
#define KVNODE_CLIENT_LIB_OP_BUDGET_H_

#include <algorithm>
#include <cstdint>

#include "kvnode/client/client.h"

namespace kvnode::client {

inline bool IsWrite(OpKind kind) { return kind == OpKind::kPut || kind == OpKind::kDelete; }

// Every operation in flight is either active (counts against
// max_outstanding) or a held write (answered BUSY, or with no session to be
// sent on: it waits outside max_outstanding). Invariants:
//   (1) active() <= max_outstanding; writes() <= max_writes;
//   (2) held() <= writes(), so max_outstanding + max_writes slots always
//       suffice and a held write never takes capacity a GET could use.
class OpBudget {
 public:
  // max_writes 0: max_outstanding.
  OpBudget(uint32_t max_outstanding, uint32_t max_writes)
      : max_(max_outstanding), max_writes_(max_writes == 0 ? max_outstanding : max_writes) {}

  uint32_t slots() const { return max_ + max_writes_; }
  uint32_t available() const { return max_ - active_; }
  uint32_t available(OpKind kind) const {
    return IsWrite(kind) ? std::min(available(), max_writes_ - writes_) : available();
  }
  uint32_t active() const { return active_; }
  uint32_t held() const { return held_; }
  uint32_t writes() const { return writes_; }

  // An operation starts; the caller checked available(kind) > 0.
  void Start(OpKind kind) {
    ++active_;
    if (IsWrite(kind)) ++writes_;
  }
  // A write leaves max_outstanding until it ends; true if it was not held
  // yet. Anything else stays where it is.
  bool Hold(OpKind kind, bool held) {
    if (held || !IsWrite(kind)) return false;
    --active_;
    ++held_;
    return true;
  }
  // An operation ends (its slot is free again).
  void End(OpKind kind, bool held) {
    if (held) {
      --held_;
    } else {
      --active_;
    }
    if (IsWrite(kind)) --writes_;
  }

 private:
  uint32_t max_;
  uint32_t max_writes_;
  uint32_t active_ = 0;
  uint32_t held_ = 0;
  uint32_t writes_ = 0;
};

}  // namespace kvnode::client

#endif  // KVNODE_CLIENT_LIB_OP_BUDGET_H_
