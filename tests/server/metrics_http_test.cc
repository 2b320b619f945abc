// MetricsHttpServer: GET /metrics answered with the render callback's text,
// 404/405 otherwise, 503 when the callback does not answer in time, 500 on
// its error; Pause/Resume; and the live upgrade's property: Stop leaves the
// listening socket listening, so a connection made meanwhile is answered by
// the next server started on the same socket.
#include "kvnode/server/metrics_http.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <memory>
#include <mutex>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "kvnode/base/unique_fd.h"

namespace kvnode::server {
namespace {

// A listening TCP socket on 127.0.0.1, any free port.
base::UniqueFd Listener(uint16_t* port) {
  base::UniqueFd fd(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(bind(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  EXPECT_EQ(listen(fd.get(), 16), 0);
  socklen_t len = sizeof(a);
  EXPECT_EQ(getsockname(fd.get(), reinterpret_cast<sockaddr*>(&a), &len), 0);
  *port = ntohs(a.sin_port);
  return fd;
}

base::UniqueFd Connect(uint16_t port) {
  base::UniqueFd fd(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(port);
  EXPECT_EQ(connect(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  return fd;
}

// Sends `request` and reads until the server closes (or 10 s pass).
std::string Exchange(int fd, const std::string& request) {
  EXPECT_EQ(send(fd, request.data(), request.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(request.size()));
  std::string out;
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  char buf[4096];
  while (absl::Now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 100) <= 0) continue;
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

std::string Get(uint16_t port, const std::string& method, const std::string& path) {
  base::UniqueFd c = Connect(port);
  return Exchange(c.get(), absl::StrCat(method, " ", path,
                                        " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"));
}

MetricsHttpServer::Render Text(std::string text) {
  return [text](MetricsHttpServer::Reply reply) { reply(text); };
}

TEST(MetricsHttp, ServesMetricsOnlyOnGetMetrics) {
  uint16_t port = 0;
  base::UniqueFd l = Listener(&port);
  auto s = MetricsHttpServer::Start(l.get(), Text("kvnode_up 1\n"));
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ((*s)->address(), absl::StrCat("127.0.0.1:", port));

  const std::string ok = Get(port, "GET", "/metrics");
  EXPECT_EQ(ok.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << ok;
  EXPECT_NE(ok.find("Content-Type: text/plain; version=0.0.4; charset=utf-8\r\n"),
            std::string::npos)
      << ok;
  EXPECT_NE(ok.find("\r\n\r\nkvnode_up 1\n"), std::string::npos) << ok;
  EXPECT_EQ(Get(port, "GET", "/metrics?x=1").rfind("HTTP/1.1 200 OK\r\n", 0), 0u);

  for (const char* path : {"/", "/metric", "/metrics/", "/other"}) {
    const std::string r = Get(port, "GET", path);
    EXPECT_EQ(r.rfind("HTTP/1.1 404 Not Found\r\n", 0), 0u) << path << ": " << r;
  }
  for (const char* method : {"POST", "HEAD", "PUT", "DELETE"}) {
    const std::string r = Get(port, method, "/metrics");
    EXPECT_EQ(r.rfind("HTTP/1.1 405 Method Not Allowed\r\n", 0), 0u) << method << ": " << r;
    EXPECT_NE(r.find("Allow: GET\r\n"), std::string::npos) << r;
  }
  // Garbage is no request: the connection is closed without an answer.
  base::UniqueFd c = Connect(port);
  EXPECT_EQ(Exchange(c.get(), "\x01\x02 not http\r\n\r\n"), "");
}

TEST(MetricsHttp, KeepAliveServesSeveralRequestsOnOneConnection) {
  uint16_t port = 0;
  base::UniqueFd l = Listener(&port);
  auto s = MetricsHttpServer::Start(l.get(), Text("kvnode_up 1\n"));
  ASSERT_TRUE(s.ok()) << s.status();
  base::UniqueFd c = Connect(port);
  const std::string r =
      Exchange(c.get(),
               "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\nGET /metrics HTTP/1.1\r\nHost: x\r\n"
               "Connection: close\r\n\r\n");
  size_t n = 0;
  for (size_t p = r.find("HTTP/1.1 200 OK"); p != std::string::npos;
       p = r.find("HTTP/1.1 200 OK", p + 1)) {
    ++n;
  }
  EXPECT_EQ(n, 2u) << r;
}

TEST(MetricsHttp, ARenderThatDoesNotAnswerIs503AndALateReplyIsHarmless) {
  uint16_t port = 0;
  base::UniqueFd l = Listener(&port);
  std::mutex mu;
  MetricsHttpServer::Reply kept;
  MetricsHttpOptions o;
  o.render_timeout = absl::Milliseconds(100);
  auto s = MetricsHttpServer::Start(
      l.get(),
      [&](MetricsHttpServer::Reply reply) {
        std::lock_guard<std::mutex> g(mu);
        kept = std::move(reply);
      },
      o);
  ASSERT_TRUE(s.ok()) << s.status();
  const std::string r = Get(port, "GET", "/metrics");
  EXPECT_EQ(r.rfind("HTTP/1.1 503 Service Unavailable\r\n", 0), 0u) << r;
  EXPECT_NE(r.find("did not answer within 100ms"), std::string::npos) << r;
  std::lock_guard<std::mutex> g(mu);
  ASSERT_TRUE(kept);
  kept("too late\n");  // the connection is gone: dropped
  (*s)->Stop();
  kept("after the stop\n");  // the io_context is gone: dropped
}

TEST(MetricsHttp, ARenderErrorIs500WithItsMessage) {
  uint16_t port = 0;
  base::UniqueFd l = Listener(&port);
  auto s = MetricsHttpServer::Start(l.get(), [](MetricsHttpServer::Reply reply) {
    reply(absl::UnavailableError("the node is shutting down"));
  });
  ASSERT_TRUE(s.ok()) << s.status();
  const std::string r = Get(port, "GET", "/metrics");
  EXPECT_EQ(r.rfind("HTTP/1.1 500 Internal Server Error\r\n", 0), 0u) << r;
  EXPECT_NE(r.find("the node is shutting down"), std::string::npos) << r;
}

// What a live upgrade relies on: the old process pauses (its scrapes wait in
// the backlog), stops, and a server started on the same socket (the new
// process's) answers the connection that waited. Had Stop shut the socket
// down, the waiting connection would be reset and the next one refused.
TEST(MetricsHttp, StopLeavesTheSocketListeningForTheNextHolder) {
  uint16_t port = 0;
  base::UniqueFd l = Listener(&port);
  auto old_side = MetricsHttpServer::Start(l.get(), Text("generation 1\n"));
  ASSERT_TRUE(old_side.ok()) << old_side.status();
  EXPECT_NE(Get(port, "GET", "/metrics").find("generation 1"), std::string::npos);
  (*old_side)->Pause();
  // From here the backlog holds new connections; nobody answers them.
  base::UniqueFd waiting = Connect(port);
  const std::string request = "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
  ASSERT_EQ(send(waiting.get(), request.data(), request.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(request.size()));
  (*old_side)->Stop();
  pollfd p{waiting.get(), POLLIN, 0};
  EXPECT_EQ(poll(&p, 1, 200), 0) << "answered (or reset) with no server running";
  int listening = 0;
  socklen_t len = sizeof(listening);
  ASSERT_EQ(getsockopt(l.get(), SOL_SOCKET, SO_ACCEPTCONN, &listening, &len), 0);
  EXPECT_EQ(listening, 1);

  auto new_side = MetricsHttpServer::Start(l.get(), Text("generation 2\n"));
  ASSERT_TRUE(new_side.ok()) << new_side.status();
  const std::string r = Exchange(waiting.get(), "");
  EXPECT_NE(r.find("generation 2"), std::string::npos) << "the waiting scrape: " << r;
  EXPECT_NE(Get(port, "GET", "/metrics").find("generation 2"), std::string::npos);
  (*new_side)->Pause();
  (*new_side)->Resume();
  EXPECT_NE(Get(port, "GET", "/metrics").find("generation 2"), std::string::npos);
}

TEST(MetricsHttp, RefusesWhatIsNoListeningSocketAndBadOptions) {
  base::UniqueFd unbound(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  auto s = MetricsHttpServer::Start(unbound.get(), Text(""));
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("not a listening socket"), std::string::npos) << s.status();
  uint16_t port = 0;
  base::UniqueFd l = Listener(&port);
  MetricsHttpOptions o;
  o.max_connections = 0;
  s = MetricsHttpServer::Start(l.get(), Text(""), o);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("max_connections"), std::string::npos) << s.status();
  o = MetricsHttpOptions();
  o.render_timeout = absl::ZeroDuration();
  EXPECT_FALSE(MetricsHttpServer::Start(l.get(), Text(""), o).ok());
  EXPECT_FALSE(MetricsHttpServer::Start(l.get(), nullptr).ok());
}

}  // namespace
}  // namespace kvnode::server
