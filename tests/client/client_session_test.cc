// The session state machine of libkvclient (client/lib/session.cc) up to the
// point where it needs a verbs device: non-blocking connect, Hello, Welcome
// awaited and checked, the server's refusals, silence and closes; and the
// non-blocking frame I/O it is built on. Against in-process TCP peers; no
// device needed (the device is opened on the first valid Welcome).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "client_impl.h"
#include "kvnode/client/client.h"
#include "kvnode/client/errors.h"
#include "kvnode/proto/frame_io.h"

namespace kvnode::client {
namespace {

// A node that accepts one connection, reads the Hello and then plays
// `script` on the connection. The listener is bound before the client starts.
class FakeNode {
 public:
  using Script = std::function<void(int conn)>;
  explicit FakeNode(Script script) : script_(std::move(script)) {
    fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    EXPECT_EQ(listen(fd_, 4), 0);
    socklen_t len = sizeof(a);
    getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] { Serve(); });
  }
  ~FakeNode() {
    shutdown(fd_, SHUT_RDWR);
    thread_.join();
    close(fd_);
  }
  std::string endpoint() const { return absl::StrCat("127.0.0.1:", port_); }
  std::optional<proto::Hello> hello() {
    std::lock_guard<std::mutex> l(mu_);
    return hello_;
  }

 private:
  void Serve() {
    pollfd p{fd_, POLLIN, 0};
    if (poll(&p, 1, 30000) <= 0) return;
    const int c = accept(fd_, nullptr, nullptr);
    if (c < 0) return;
    absl::StatusOr<proto::ControlMessage> m =
        proto::ReadControl(c, absl::Now() + absl::Seconds(30));
    if (m.ok()) {
      if (const auto* h = std::get_if<proto::Hello>(&*m)) {
        std::lock_guard<std::mutex> l(mu_);
        hello_ = *h;
      }
      script_(c);
    }
    close(c);
  }

  Script script_;
  int fd_ = -1;
  uint16_t port_ = 0;
  std::thread thread_;
  std::mutex mu_;
  std::optional<proto::Hello> hello_;
};

// Blocks until the client closes its end (the client gave up).
void WaitForClose(int conn) {
  char buf[256];
  while (read(conn, buf, sizeof(buf)) > 0) {
  }
}

ClientOptions Options(const std::string& endpoint) {
  ClientOptions o;
  o.server = endpoint;
  o.auth_token = "tok3n";
  o.client_name = "session-test";
  o.connect_timeout = absl::Milliseconds(300);
  return o;
}

TEST(SessionHandshake, ServerRefusalIsRejectedAfterAHelloThatSaysWhoWeAre) {
  FakeNode node([](int c) {
    proto::Error e;
    e.code = proto::ErrorCode::kAuthFailed;
    e.message = "bad token";
    ASSERT_TRUE(proto::WriteControl(c, e, absl::Now() + absl::Seconds(5)).ok());
    // Closed right after the Error: the client must still read the Error.
  });
  absl::StatusOr<std::unique_ptr<Client>> c = Client::Connect(Options(node.endpoint()));
  ASSERT_FALSE(c.ok());
  EXPECT_TRUE(IsRejected(c.status())) << c.status();
  EXPECT_NE(c.status().message().find("bad token"), std::string::npos) << c.status();
  std::optional<proto::Hello> h = node.hello();
  ASSERT_TRUE(h.has_value());
  EXPECT_EQ(h->client_id, 0u);
  EXPECT_EQ(h->auth_token, "tok3n");
  EXPECT_EQ(h->client_name, "session-test");
}

TEST(SessionHandshake, UnknownClientIsNotFound) {
  FakeNode node([](int c) {
    proto::Error e;
    e.code = proto::ErrorCode::kUnknownClient;
    ASSERT_TRUE(proto::WriteControl(c, e, absl::Now() + absl::Seconds(5)).ok());
  });
  absl::StatusOr<std::unique_ptr<Client>> c = Client::Connect(Options(node.endpoint()));
  ASSERT_FALSE(c.ok());
  EXPECT_TRUE(absl::IsNotFound(c.status())) << c.status();
}

TEST(SessionHandshake, SilentServerFailsTheWelcomeStep) {
  FakeNode node(WaitForClose);
  absl::StatusOr<std::unique_ptr<Client>> c = Client::Connect(Options(node.endpoint()));
  ASSERT_FALSE(c.ok());
  EXPECT_TRUE(IsConnectionLost(c.status())) << c.status();
  EXPECT_NE(c.status().message().find("waiting for Welcome"), std::string::npos) << c.status();
  EXPECT_TRUE(node.hello().has_value());
}

TEST(SessionHandshake, CloseAfterHelloIsConnectionLost) {
  FakeNode node([](int) {});
  absl::StatusOr<std::unique_ptr<Client>> c = Client::Connect(Options(node.endpoint()));
  ASSERT_FALSE(c.ok());
  EXPECT_TRUE(IsConnectionLost(c.status())) << c.status();
  EXPECT_NE(c.status().message().find("closed"), std::string::npos) << c.status();
}

TEST(SessionHandshake, WrongAnswerToHelloIsConnectionLost) {
  FakeNode node([](int c) {
    ASSERT_TRUE(proto::WriteControl(c, proto::Ready{}, absl::Now() + absl::Seconds(5)).ok());
    WaitForClose(c);
  });
  absl::StatusOr<std::unique_ptr<Client>> c = Client::Connect(Options(node.endpoint()));
  ASSERT_FALSE(c.ok());
  EXPECT_TRUE(IsConnectionLost(c.status())) << c.status();
  EXPECT_NE(c.status().message().find("answered Hello with"), std::string::npos) << c.status();
}

TEST(SessionHandshake, WelcomeInPiecesIsAssembledBeforeTheNextStep) {
  // A Welcome sent one byte per send(): the client assembles it across reads
  // and moves on to the QP step (which then fails here: no device on the
  // host, or nobody answers ClientQp with Ready) - never a Welcome error.
  FakeNode node([](int c) {
    proto::Welcome w;
    w.client_id = 5;
    w.server_generation = 1;
    w.server_qp.qpn = 17;
    w.server_qp.mtu = 3;
    w.arena_size = 1 << 20;
    w.max_rpc_credits = 4;
    w.max_rpc_message_size = 4096;
    std::string frame;
    absl::Status st = proto::EncodeControl(w, &frame);
    ASSERT_TRUE(st.ok()) << st;
    for (char ch : frame) ASSERT_EQ(send(c, &ch, 1, MSG_NOSIGNAL), 1);
    WaitForClose(c);
  });
  absl::StatusOr<std::unique_ptr<Client>> c = Client::Connect(Options(node.endpoint()));
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().message().find("Welcome"), std::string::npos) << c.status();
  EXPECT_EQ(c.status().message().find("bad frame"), std::string::npos) << c.status();
}

TEST(SessionHandshake, NobodyListeningIsConnectionLost) {
  // A port that was just bound and closed: refused.
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  socklen_t len = sizeof(a);
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  close(fd);
  absl::StatusOr<std::unique_ptr<Client>> c =
      Client::Connect(Options(absl::StrCat("127.0.0.1:", ntohs(a.sin_port))));
  ASSERT_FALSE(c.ok());
  EXPECT_TRUE(IsConnectionLost(c.status())) << c.status();
}

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
