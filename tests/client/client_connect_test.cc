// Client::Connect against in-process control peers that refuse, stay
// silent, answer wrongly or close (label rdma: Connect opens the verbs device
// before it dials, so the server's handshake deadline never pays for local
// setup). Every failed Connect must be typed and leave no verbs object.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/device_env.h"
#include "fake_node.h"
#include "kvnode/client/client.h"
#include "kvnode/client/errors.h"
#include "kvnode/proto/frame_io.h"
#include "kvnode/rdma/accounting.h"

namespace kvnode::client {
namespace {

using fake::FakeNode;
using fake::WaitForClose;

ClientOptions Options(const kvnode::testing::TestDevice& dev, const std::string& endpoint) {
  ClientOptions o;
  o.server = endpoint;
  o.rdma_device = dev.name;
  o.rdma_port = dev.port;
  o.auth_token = "tok3n";
  o.client_name = "session-test";
  o.connect_timeout = absl::Milliseconds(300);
  return o;
}

void ExpectNoVerbsObjects() {
  EXPECT_EQ(rdma::Accounting::Snapshot().total(), 0) << rdma::Accounting::Report();
}

TEST(ClientConnect, ServerRefusalIsRejectedAfterAHelloThatSaysWhoWeAre) {
  KVNODE_REQUIRE_DEVICE(dev);
  FakeNode node([](int c) {
    proto::Error e;
    e.code = proto::ErrorCode::kAuthFailed;
    e.message = "bad token";
    ASSERT_TRUE(proto::WriteControl(c, e, absl::Now() + absl::Seconds(5)).ok());
    // Closed right after the Error: the client must still read the Error.
  });
  absl::StatusOr<std::unique_ptr<Client>> c = Client::Connect(Options(dev, node.endpoint()));
  ASSERT_FALSE(c.ok());
  EXPECT_TRUE(IsRejected(c.status())) << c.status();
  EXPECT_NE(c.status().message().find("bad token"), std::string::npos) << c.status();
  std::optional<proto::Hello> h = node.hello();
  ASSERT_TRUE(h.has_value());
  EXPECT_EQ(h->client_id, 0u);
  EXPECT_EQ(h->auth_token, "tok3n");
  EXPECT_EQ(h->client_name, "session-test");
  ExpectNoVerbsObjects();
}

TEST(ClientConnect, UnknownClientIsNotFound) {
  KVNODE_REQUIRE_DEVICE(dev);
  FakeNode node([](int c) {
    proto::Error e;
    e.code = proto::ErrorCode::kUnknownClient;
    ASSERT_TRUE(proto::WriteControl(c, e, absl::Now() + absl::Seconds(5)).ok());
  });
  absl::StatusOr<std::unique_ptr<Client>> c = Client::Connect(Options(dev, node.endpoint()));
  ASSERT_FALSE(c.ok());
  EXPECT_TRUE(absl::IsNotFound(c.status())) << c.status();
  ExpectNoVerbsObjects();
}

TEST(ClientConnect, SilentServerFailsTheWelcomeStep) {
  KVNODE_REQUIRE_DEVICE(dev);
  FakeNode node(WaitForClose);
  absl::StatusOr<std::unique_ptr<Client>> c = Client::Connect(Options(dev, node.endpoint()));
  ASSERT_FALSE(c.ok());
  EXPECT_TRUE(IsConnectionLost(c.status())) << c.status();
  EXPECT_NE(c.status().message().find("waiting for Welcome"), std::string::npos) << c.status();
  EXPECT_TRUE(node.hello().has_value());
  ExpectNoVerbsObjects();
}

TEST(ClientConnect, CloseAfterHelloIsConnectionLost) {
  KVNODE_REQUIRE_DEVICE(dev);
  FakeNode node([](int) {});
  absl::StatusOr<std::unique_ptr<Client>> c = Client::Connect(Options(dev, node.endpoint()));
  ASSERT_FALSE(c.ok());
  EXPECT_TRUE(IsConnectionLost(c.status())) << c.status();
  EXPECT_NE(c.status().message().find("closed"), std::string::npos) << c.status();
  ExpectNoVerbsObjects();
}

TEST(ClientConnect, WrongAnswerToHelloIsConnectionLost) {
  KVNODE_REQUIRE_DEVICE(dev);
  FakeNode node([](int c) {
    ASSERT_TRUE(proto::WriteControl(c, proto::Ready{}, absl::Now() + absl::Seconds(5)).ok());
    WaitForClose(c);
  });
  absl::StatusOr<std::unique_ptr<Client>> c = Client::Connect(Options(dev, node.endpoint()));
  ASSERT_FALSE(c.ok());
  EXPECT_TRUE(IsConnectionLost(c.status())) << c.status();
  EXPECT_NE(c.status().message().find("answered Hello with"), std::string::npos) << c.status();
  ExpectNoVerbsObjects();
}

TEST(ClientConnect, WelcomeInPiecesIsAssembledBeforeTheNextStep) {
  KVNODE_REQUIRE_DEVICE(dev);
  // A Welcome sent one byte per send(): the client assembles it across reads
  // and moves on to the QP step (which then fails here: the peer closes
  // instead of answering ClientQp with Ready) - never a Welcome error. A
  // deadline long enough for one-byte sends in a loaded TCG guest.
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
  });
  ClientOptions o = Options(dev, node.endpoint());
  o.connect_timeout = absl::Seconds(30);
  absl::StatusOr<std::unique_ptr<Client>> c = Client::Connect(o);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().message().find("Welcome"), std::string::npos) << c.status();
  EXPECT_EQ(c.status().message().find("bad frame"), std::string::npos) << c.status();
  ExpectNoVerbsObjects();
}

TEST(ClientConnect, NobodyListeningIsConnectionLost) {
  KVNODE_REQUIRE_DEVICE(dev);
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
      Client::Connect(Options(dev, absl::StrCat("127.0.0.1:", ntohs(a.sin_port))));
  ASSERT_FALSE(c.ok());
  EXPECT_TRUE(IsConnectionLost(c.status())) << c.status();
  ExpectNoVerbsObjects();
}

}  // namespace
}  // namespace kvnode::client
