#include "kvnode/server/liveness.h"

#include <gtest/gtest.h>

namespace kvnode::server {
namespace {

constexpr absl::Duration kInterval = absl::Seconds(1);
const absl::Time kT0 = absl::FromUnixSeconds(1000);

absl::Time At(double seconds) { return kT0 + absl::Seconds(seconds); }

TEST(Liveness, SilentAfterMissesIntervals) {
  Liveness l(kInterval, 3);
  l.Accepted(At(0));
  l.Ready(At(0));
  EXPECT_FALSE(l.Silent(At(3)));
  EXPECT_TRUE(l.Silent(At(3.001)));
  EXPECT_EQ(l.SilentFor(At(3.5)), absl::Seconds(3.5));
}

TEST(Liveness, AnyFrameCounts) {
  Liveness l(kInterval, 3);
  l.Accepted(At(0));
  l.Ready(At(0));
  l.Heard(At(2.5));
  EXPECT_FALSE(l.Silent(At(5)));
  EXPECT_TRUE(l.Silent(At(5.6)));
}

// The client sent ClientQp at 0 and this node took 2.5 s to connect its QP
// (a new process busy opening RocksDB): the client was not silent for those
// 2.5 s, and its keepalive clock starts at Ready.
TEST(Liveness, SlowQpConnectIsNotTheClientsSilence) {
  Liveness l(kInterval, 3);
  l.Accepted(At(0));
  l.Heard(At(0));  // Hello, then ClientQp
  l.Ready(At(2.5));
  EXPECT_FALSE(l.Silent(At(3.1)));
  EXPECT_FALSE(l.Silent(At(5.5)));
  EXPECT_TRUE(l.Silent(At(5.6)));
}

TEST(Liveness, KeepaliveDueOneIntervalAfterReadyThenAfterEachSend) {
  Liveness l(kInterval, 3);
  l.Accepted(At(0));
  l.Ready(At(2));
  EXPECT_FALSE(l.KeepaliveDue(At(2.9)));
  EXPECT_TRUE(l.KeepaliveDue(At(3)));
  l.Sent(At(3));
  EXPECT_FALSE(l.KeepaliveDue(At(3.5)));
  EXPECT_TRUE(l.KeepaliveDue(At(4)));
}

TEST(Liveness, ZeroIntervalTurnsKeepalivesOff) {
  Liveness l(absl::ZeroDuration(), 3);
  l.Accepted(At(0));
  l.Ready(At(0));
  EXPECT_FALSE(l.Silent(At(3600)));
  EXPECT_FALSE(l.KeepaliveDue(At(3600)));
}

}  // namespace
}  // namespace kvnode::server
