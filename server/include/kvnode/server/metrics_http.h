// The HTTP metrics endpoint (--metrics_listen, docs/operations.md): answers
// `GET /metrics` with the text a Render callback gives (the server renders
// what `kvctl metrics` prints), 404 for any other path, 405 for any other
// method. HTTP parsing and I/O are Boost.Beast's, on one thread of its own
// with one io_context: the endpoint never runs on, or waits for, the
// control or data thread.
//
// The listening socket is the caller's, and may be shared with another
// process (a live upgrade hands it to the new process): the server accepts
// on a duplicate of it and, when stopped, only closes that duplicate. It
// never shutdown()s the socket, which would stop it listening for every
// holder. Until some holder accepts, connections wait in its backlog.
#ifndef KVNODE_SERVER_METRICS_HTTP_H_
#define KVNODE_SERVER_METRICS_HTTP_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace kvnode::server {

struct MetricsHttpOptions {
  // Longest a connection may take to send a request, or to take an answer;
  // then it is closed. Default 5 s (Prometheus scrapes time out at 10 s).
  // 1 ms .. 1 h.
  absl::Duration io_timeout = absl::Seconds(5);
  // Longest a GET /metrics waits for Render's answer; then 503. Default 2 s.
  // 1 ms .. 1 h.
  absl::Duration render_timeout = absl::Seconds(2);
  // Most connections open at once; one more is closed as soon as accepted.
  // Default 16. 1..1024.
  uint32_t max_connections = 16;

  [[nodiscard]] absl::Status Validate() const;
};

class MetricsHttpServer {
 public:
  // Takes the answer to one GET /metrics: the body (Prometheus text format),
  // or an error (answered 500 with its message). Callable from any thread,
  // at most once, also after the server stopped (then it does nothing).
  using Reply = std::function<void(absl::StatusOr<std::string>)>;
  // Called on the server's thread for each GET /metrics. Must not block:
  // it hands `reply` to whichever thread can answer.
  using Render = std::function<void(Reply reply)>;

  // Serves on a duplicate of `listen_fd` (a listening TCP socket, not
  // owned: the caller keeps it open) from a thread started here.
  // InvalidArgument when it is no listening socket or the options are bad.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<MetricsHttpServer>> Start(
      int listen_fd, Render render, const MetricsHttpOptions& options = {});
  // Stop().
  ~MetricsHttpServer();
  MetricsHttpServer(const MetricsHttpServer&) = delete;
  MetricsHttpServer& operator=(const MetricsHttpServer&) = delete;

  // Stops accepting: once Pause returns, no connection is accepted; those
  // accepted before are still answered. Resume() accepts again. Any thread
  // but the server's own; neither waits for a Render.
  void Pause();
  void Resume();

  // Stops accepting, drops the connections it has (an answer being written
  // is cut), joins the thread and closes the duplicate. The listening
  // socket itself stays open and listening. Idempotent; any thread but the
  // server's own (Render must not call it).
  void Stop();

  // "ip:port" the socket is bound to.
  const std::string& address() const;

  class Impl;

 private:
  explicit MetricsHttpServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvnode::server

#endif  // KVNODE_SERVER_METRICS_HTTP_H_
