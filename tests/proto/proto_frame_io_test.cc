// Whole frames over a real socketpair: partial writes and reads, deadlines,
// a peer that closes, a peer that sends garbage.
#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <thread>

#include "gtest/gtest.h"
#include "kvnode/proto/frame_io.h"

namespace kvnode::proto {
namespace {

class SocketPair {
 public:
  SocketPair() {
    int fds[2];
    EXPECT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
    a_ = fds[0];
    b_ = fds[1];
  }
  ~SocketPair() {
    CloseA();
    CloseB();
  }
  int a() const { return a_; }
  int b() const { return b_; }
  void CloseA() {
    if (a_ >= 0) close(a_);
    a_ = -1;
  }
  void CloseB() {
    if (b_ >= 0) close(b_);
    b_ = -1;
  }

 private:
  int a_ = -1;
  int b_ = -1;
};

void SetNonBlocking(int fd) { ASSERT_EQ(fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK), 0); }

absl::Time In(absl::Duration d) { return absl::Now() + d; }

Welcome BigWelcome() {
  Welcome w;
  w.client_id = 3;
  w.server_qp.qpn = 17;
  w.server_qp.mtu = 5;
  w.max_rpc_credits = 8;
  w.index_geometry.assign(kMaxIndexGeometrySize, 'g');
  return w;
}

TEST(FrameIoTest, WholeFramesBothWays) {
  SocketPair sp;
  Hello h;
  h.auth_token = "secret";
  ASSERT_TRUE(WriteControl(sp.a(), h, In(absl::Seconds(10))).ok());
  absl::StatusOr<ControlMessage> got = ReadControl(sp.b(), In(absl::Seconds(10)));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, ControlMessage(h));
  ASSERT_TRUE(WriteControl(sp.b(), BigWelcome(), absl::InfiniteFuture()).ok());
  got = ReadControl(sp.a(), absl::InfiniteFuture());
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, ControlMessage(BigWelcome()));
}

// The writer sends a stream of frames one byte per send() call while the
// reader assembles them: every read sees partial frames.
TEST(FrameIoTest, FramesDribbledOneByteAtATime) {
  SocketPair sp;
  std::string stream;
  for (uint64_t i = 0; i < 20; ++i) ASSERT_TRUE(EncodeControl(Keepalive{i}, &stream).ok());
  ASSERT_TRUE(EncodeControl(BigWelcome(), &stream).ok());
  std::thread writer([&] {
    for (char c : stream) {
      const uint8_t b = static_cast<uint8_t>(c);
      ASSERT_TRUE(WriteAll(sp.a(), std::span<const uint8_t>(&b, 1), In(absl::Seconds(30))).ok());
    }
  });
  for (uint64_t i = 0; i < 20; ++i) {
    absl::StatusOr<ControlMessage> got = ReadControl(sp.b(), In(absl::Seconds(30)));
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(*got, ControlMessage(Keepalive{i}));
  }
  absl::StatusOr<ControlMessage> got = ReadControl(sp.b(), In(absl::Seconds(30)));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, ControlMessage(BigWelcome()));
  writer.join();
}

// A small send buffer on a non-blocking socket forces partial send()s and
// EAGAIN: WriteAll must wait for room and finish every frame.
TEST(FrameIoTest, PartialWritesOnANonBlockingSocket) {
  SocketPair sp;
  const int small = 4096;
  ASSERT_EQ(setsockopt(sp.a(), SOL_SOCKET, SO_SNDBUF, &small, sizeof(small)), 0);
  ASSERT_EQ(setsockopt(sp.b(), SOL_SOCKET, SO_RCVBUF, &small, sizeof(small)), 0);
  SetNonBlocking(sp.a());
  SetNonBlocking(sp.b());
  constexpr int kFrames = 200;
  std::thread writer([&] {
    for (int i = 0; i < kFrames; ++i) {
      ASSERT_TRUE(WriteControl(sp.a(), BigWelcome(), In(absl::Seconds(30))).ok());
    }
  });
  for (int i = 0; i < kFrames; ++i) {
    absl::StatusOr<ControlMessage> got = ReadControl(sp.b(), In(absl::Seconds(30)));
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_EQ(*got, ControlMessage(BigWelcome()));
  }
  writer.join();
}

TEST(FrameIoTest, ReadDeadlinePasses) {
  SocketPair sp;
  absl::StatusOr<ControlMessage> got = ReadControl(sp.b(), In(absl::Milliseconds(20)));
  ASSERT_FALSE(got.ok());
  EXPECT_TRUE(absl::IsDeadlineExceeded(got.status())) << got.status();
  // Half a frame, then silence.
  std::string f;
  ASSERT_TRUE(EncodeControl(Keepalive{1}, &f).ok());
  ASSERT_TRUE(WriteAll(sp.a(), AsBytes(f).first(15), In(absl::Seconds(10))).ok());
  got = ReadControl(sp.b(), In(absl::Milliseconds(20)));
  EXPECT_TRUE(absl::IsDeadlineExceeded(got.status())) << got.status();
  // A deadline already in the past fails without blocking even on a
  // blocking socket.
  got = ReadControl(sp.b(), absl::Now() - absl::Seconds(1));
  EXPECT_TRUE(absl::IsDeadlineExceeded(got.status())) << got.status();
}

TEST(FrameIoTest, WriteDeadlinePassesWhenThePeerDoesNotRead) {
  SocketPair sp;
  std::string frame;
  ASSERT_TRUE(EncodeControl(BigWelcome(), &frame).ok());
  absl::Status s;
  // The socket buffer fills up after a bounded number of frames.
  for (int i = 0; i < 100000 && s.ok(); ++i) {
    s = WriteAll(sp.a(), AsBytes(frame), In(absl::Milliseconds(20)));
  }
  EXPECT_TRUE(absl::IsDeadlineExceeded(s)) << s;
}

TEST(FrameIoTest, PeerClosedBetweenFrames) {
  SocketPair sp;
  sp.CloseA();
  absl::StatusOr<ControlMessage> got = ReadControl(sp.b(), In(absl::Seconds(10)));
  ASSERT_FALSE(got.ok());
  EXPECT_TRUE(absl::IsUnavailable(got.status())) << got.status();
}

TEST(FrameIoTest, PeerClosedMidFrame) {
  SocketPair sp;
  std::string f;
  ASSERT_TRUE(EncodeControl(BigWelcome(), &f).ok());
  ASSERT_TRUE(WriteAll(sp.a(), AsBytes(f).first(100), In(absl::Seconds(10))).ok());
  sp.CloseA();
  absl::StatusOr<ControlMessage> got = ReadControl(sp.b(), In(absl::Seconds(10)));
  ASSERT_FALSE(got.ok());
  EXPECT_TRUE(absl::IsUnavailable(got.status())) << got.status();
  EXPECT_NE(got.status().message().find("mid-frame"), std::string_view::npos) << got.status();
}

// MSG_NOSIGNAL: writing to a closed peer is an error value, not SIGPIPE.
TEST(FrameIoTest, WritingToAClosedPeerIsAnError) {
  SocketPair sp;
  sp.CloseB();
  absl::Status s = WriteControl(sp.a(), Ready{}, In(absl::Seconds(10)));
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(absl::IsUnavailable(s)) << s;
}

TEST(FrameIoTest, GarbageIsADecodeError) {
  SocketPair sp;
  const std::string junk = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
  ASSERT_TRUE(WriteAll(sp.a(), AsBytes(junk), In(absl::Seconds(10))).ok());
  absl::StatusOr<ControlMessage> got = ReadControl(sp.b(), In(absl::Seconds(10)));
  ASSERT_FALSE(got.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(got.status())) << got.status();
}

TEST(FrameIoTest, OversizeLengthIsRefusedWithoutReadingThePayload) {
  SocketPair sp;
  std::string f;
  ASSERT_TRUE(EncodeControl(Ready{}, &f).ok());
  f[8] = f[9] = f[10] = f[11] = '\xff';
  ASSERT_TRUE(WriteAll(sp.a(), AsBytes(f), In(absl::Seconds(10))).ok());
  // No payload follows: a reader that trusted the length would block here.
  absl::StatusOr<ControlMessage> got = ReadControl(sp.b(), In(absl::Seconds(10)));
  ASSERT_FALSE(got.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(got.status())) << got.status();
}

}  // namespace
}  // namespace kvnode::proto
