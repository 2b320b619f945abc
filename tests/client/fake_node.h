// A scripted control peer for the client's tests: accepts one connection,
// reads the Hello and then plays a script on the connection.
#pragma once

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
#include "kvnode/proto/frame_io.h"

namespace kvnode::client::fake {

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
inline void WaitForClose(int conn) {
  char buf[256];
  while (read(conn, buf, sizeof(buf)) > 0) {
  }
}

}  // namespace kvnode::client::fake
