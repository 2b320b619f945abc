// Client::Connect against in-process control peers that misbehave (label
// rdma: Connect opens the verbs device before it dials). Every failed
// Connect must be typed and must leave no verbs object behind.
#include <glog/logging.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <thread>

#include "common/device_env.h"
#include "kvnode/client/client.h"
#include "kvnode/proto/frame_io.h"
#include "kvnode/rdma/accounting.h"

namespace kvnode::client {
namespace {

struct Peer {
  enum class Mode { kRefuseAuth, kSilent };
  int fd = -1;
  uint16_t port = 0;
  std::thread thread;
  int conn = -1;
  explicit Peer(Mode mode) {
    fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    EXPECT_EQ(listen(fd, 4), 0);
    socklen_t len = sizeof(a);
    getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    port = ntohs(a.sin_port);
    thread = std::thread([this, mode] {
      int c = accept(fd, nullptr, nullptr);
      if (c < 0) return;
      conn = c;
      absl::StatusOr<proto::ControlMessage> m =
          proto::ReadControl(c, absl::Now() + absl::Seconds(30));
      if (mode == Mode::kRefuseAuth && m.ok() && std::holds_alternative<proto::Hello>(*m)) {
        proto::Error e;
        e.code = proto::ErrorCode::kAuthFailed;
        e.message = "wrong token";
        (void)proto::WriteControl(c, e, absl::Now() + absl::Seconds(5));
      } else if (mode == Mode::kSilent) {
        char ch;
        while (read(c, &ch, 1) > 0) {
        }
      }
      close(c);
    });
  }
  ~Peer() {
    shutdown(fd, SHUT_RDWR);
    if (conn >= 0) shutdown(conn, SHUT_RDWR);
    thread.join();
    close(fd);
  }
};

ClientOptions Options(const kvnode::testing::TestDevice& dev, uint16_t port) {
  ClientOptions o;
  o.server = absl::StrCat("127.0.0.1:", port);
  o.rdma_device = dev.name;
  o.rdma_port = dev.port;
  o.connect_timeout = absl::Milliseconds(300);
  return o;
}

TEST(ClientConnect, WrongTokenIsRejectedAndLeavesNothing) {
  KVNODE_REQUIRE_DEVICE(dev);
  Peer peer(Peer::Mode::kRefuseAuth);
  absl::StatusOr<std::unique_ptr<Client>> c = Client::Connect(Options(dev, peer.port));
  ASSERT_FALSE(c.ok());
  EXPECT_TRUE(IsRejected(c.status())) << c.status();
  EXPECT_NE(c.status().message().find("wrong token"), std::string::npos) << c.status();
  EXPECT_EQ(rdma::Accounting::Snapshot().total(), 0) << rdma::Accounting::Report();
}

TEST(ClientConnect, SilentServerIsConnectionLost) {
  KVNODE_REQUIRE_DEVICE(dev);
  Peer peer(Peer::Mode::kSilent);
  const absl::Time t0 = absl::Now();
  absl::StatusOr<std::unique_ptr<Client>> c = Client::Connect(Options(dev, peer.port));
  ASSERT_FALSE(c.ok());
  EXPECT_TRUE(IsConnectionLost(c.status())) << c.status();
  LOG(INFO) << "silent server noticed after " << absl::FormatDuration(absl::Now() - t0);
  EXPECT_EQ(rdma::Accounting::Snapshot().total(), 0) << rdma::Accounting::Report();
}

TEST(ClientConnect, NobodyListeningIsConnectionLost) {
  KVNODE_REQUIRE_DEVICE(dev);
  uint16_t port;
  {
    Peer p(Peer::Mode::kSilent);
    port = p.port;
  }
  absl::StatusOr<std::unique_ptr<Client>> c = Client::Connect(Options(dev, port));
  ASSERT_FALSE(c.ok());
  EXPECT_TRUE(IsConnectionLost(c.status())) << c.status();
  EXPECT_EQ(rdma::Accounting::Snapshot().total(), 0) << rdma::Accounting::Report();
}

}  // namespace
}  // namespace kvnode::client
