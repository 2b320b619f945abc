// The pieces of libkvclient's session state machine (client/src/session.cc)
// that need no verbs device: state names and the non-blocking connect and
// frame I/O it is built on. The handshake itself (Connect opens the device
// before it dials) is tested against scripted peers in client_connect_test.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <unistd.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "client_impl.h"
#include "fake_node.h"
#include "kvnode/client/client.h"
#include "kvnode/client/errors.h"
#include "kvnode/proto/frame_io.h"

namespace kvnode::client {
namespace {

using fake::FakeNode;
using fake::WaitForClose;

TEST(SessionState, NamesEveryState) {
  for (SessionState s :
       {SessionState::kConnecting, SessionState::kAwaitWelcome, SessionState::kAwaitReady,
        SessionState::kUp, SessionState::kDraining, SessionState::kFlushing}) {
    EXPECT_STRNE(SessionStateName(s), "?");
  }
}

// --- the non-blocking plumbing ------------------------------------------------------

TEST(NonBlockingIo, ConnectStartsThenCompletes) {
  FakeNode node(WaitForClose);
  absl::StatusOr<Fd> fd = TcpConnectStart(node.endpoint());
  ASSERT_TRUE(fd.ok()) << fd.status();
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  absl::StatusOr<bool> done = false;
  while ((done = TcpConnectDone(fd->get(), node.endpoint())).ok() && !*done &&
         absl::Now() < deadline) {
    pollfd p{fd->get(), POLLOUT, 0};
    PollFds(std::span<pollfd>(&p, 1), deadline);
  }
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_TRUE(*done);
  ASSERT_TRUE(SendFrame(fd->get(), proto::Hello{}).ok());
}

TEST(NonBlockingIo, ReceiveKeepsTheFramesBeforeTheClose) {
  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  Fd a(sv[0]), b(sv[1]);
  ASSERT_EQ(fcntl(a.get(), F_SETFL, O_NONBLOCK), 0);
  proto::FrameAssembler assembler;
  EXPECT_TRUE(ReceiveAvailable(a.get(), &assembler).ok());  // nothing yet: no wait
  EXPECT_EQ(assembler.buffered(), 0u);
  ASSERT_TRUE(SendFrame(b.get(), proto::Keepalive{7}).ok());
  ASSERT_TRUE(SendFrame(b.get(), proto::Goodbye{}).ok());
  b.Reset();
  absl::Status st = ReceiveAvailable(a.get(), &assembler);
  EXPECT_TRUE(absl::IsUnavailable(st)) << st;
  absl::StatusOr<std::optional<proto::ControlMessage>> m = assembler.Next();
  ASSERT_TRUE(m.ok() && m->has_value());
  EXPECT_EQ(std::get<proto::Keepalive>(**m).nonce, 7u);
  m = assembler.Next();
  ASSERT_TRUE(m.ok() && m->has_value());
  EXPECT_TRUE(std::holds_alternative<proto::Goodbye>(**m));
}

TEST(NonBlockingIo, SendFrameNeverWaitsForAPeerThatDoesNotRead) {
  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  Fd a(sv[0]), b(sv[1]);
  ASSERT_EQ(fcntl(a.get(), F_SETFL, O_NONBLOCK), 0);
  // b never reads: the buffers fill, then SendFrame fails instead of waiting.
  absl::Status st;
  int sent = 0;
  for (; sent < 10000000 && st.ok(); ++sent) st = SendFrame(a.get(), proto::Keepalive{1});
  EXPECT_FALSE(st.ok());
  EXPECT_GT(sent, 1);
}

}  // namespace
}  // namespace kvnode::client
