// When the control thread sends a client session its next Keepalive, and
// when it cuts the session as silent (--keepalive_ms, --keepalive_misses).
// Times are passed in, no clock is read, so the rule is unit-tested on its
// own (tests/server/liveness_test.cc).
//
// The silence that counts is the client's: from the later of the last frame
// it sent and the moment its session became ready. Between ClientQp and
// Ready the client has nothing to send; it waits for this node to connect
// its QP, which takes seconds on a node that is busy starting (a new process
// opening RocksDB during a live upgrade). The client starts its own
// keepalive clock at Ready, so the node does too.
//
// Thread safety: none; owned by the control thread with its connection.
#ifndef KVNODE_SERVER_LIVENESS_H_
#define KVNODE_SERVER_LIVENESS_H_

#include <algorithm>
#include <cstdint>

#include "absl/time/time.h"

namespace kvnode::server {

class Liveness {
 public:
  // interval <= 0: keepalives off, never silent.
  Liveness(absl::Duration interval, uint32_t misses) : interval_(interval), misses_(misses) {}

  // The connection was accepted (its handshake has a deadline of its own).
  void Accepted(absl::Time now) { heard_ = sent_ = now; }
  // Bytes arrived from the client.
  void Heard(absl::Time now) { heard_ = std::max(heard_, now); }
  // Ready was sent: both keepalive clocks start here.
  void Ready(absl::Time now) {
    heard_ = std::max(heard_, now);
    sent_ = now;
  }
  // A Keepalive was sent.
  void Sent(absl::Time now) { sent_ = now; }

  bool KeepaliveDue(absl::Time now) const {
    return interval_ > absl::ZeroDuration() && now - sent_ >= interval_;
  }
  // Nothing heard for `misses` intervals since the later of the last frame
  // and Ready.
  bool Silent(absl::Time now) const {
    return interval_ > absl::ZeroDuration() && SilentFor(now) > interval_ * misses_;
  }
  absl::Duration SilentFor(absl::Time now) const { return now - heard_; }
  uint32_t misses() const { return misses_; }

 private:
  absl::Duration interval_;
  uint32_t misses_;
  absl::Time heard_;
  absl::Time sent_;
};

}  // namespace kvnode::server

#endif  // KVNODE_SERVER_LIVENESS_H_
