// MetricsHttpServer (metrics_http.h) on Boost.Beast: one io_context run by
// one thread; an acceptor on a duplicate of the caller's listening socket;
// one Connection per accepted socket (read a request, answer, keep alive or
// close), each with a deadline on every step.
//
// Threads: everything below runs on the server's thread, except Stop() and
// the Reply callbacks, which only touch ReplyGate (under its mutex).
#include "kvnode/server/metrics_http.h"

#include <fcntl.h>
#include <glog/logging.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <future>
#include <optional>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kvnode/base/annotated_mutex.h"
#include "kvnode/base/errno.h"
#include "net.h"

namespace kvnode::server {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using boost::system::error_code;

constexpr size_t kMaxRequestHeaderBytes = 8192;
constexpr size_t kMaxRequestBodyBytes = 1024;
constexpr char kMetricsPath[] = "/metrics";
// Prometheus text exposition format 0.0.4.
constexpr char kMetricsContentType[] = "text/plain; version=0.0.4; charset=utf-8";

std::chrono::steady_clock::duration Chrono(absl::Duration d) {
  return absl::ToChronoNanoseconds(d);
}

}  // namespace

absl::Status MetricsHttpOptions::Validate() const {
  for (auto [d, name] : {std::pair{io_timeout, "io_timeout"}, {render_timeout, "render_timeout"}}) {
    if (d < absl::Milliseconds(1) || d > absl::Hours(1)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "metrics http: ", name, " ", absl::FormatDuration(d), " is outside 1ms..1h"));
    }
  }
  if (max_connections < 1 || max_connections > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics http: max_connections ", max_connections, " is outside 1..1024"));
  }
  return absl::OkStatus();
}

// Where a Reply posts its answer: the io_context while the server runs,
// nothing once Stop() began (the io_context may be gone by the time a late
// Reply is called).
struct ReplyGate {
  AnnotatedMutex mu;
  asio::io_context* ioc ABSL_GUARDED_BY(mu) = nullptr;
};

class Connection;

class MetricsHttpServer::Impl {
 public:
  Impl(Render render, const MetricsHttpOptions& o) : render_(std::move(render)), opt_(o) {}
  absl::Status Open(int listen_fd);
  void Run();
  void Pause();
  void Resume();
  void Stop();

  const Render render_;
  const MetricsHttpOptions opt_;
  std::string address_;
  const std::shared_ptr<ReplyGate> gate_ = std::make_shared<ReplyGate>();
  std::atomic<uint32_t> connections_{0};
  bool paused_ = false;  // server thread only

  // Declared so that they go in this order: the acceptor (closing only the
  // duplicate), then the io_context (destroying the connections it still
  // holds in pending handlers), after the thread was joined.
  asio::io_context ioc_{1};
  // Keeps run() running while paused (no accept pending, maybe no
  // connection): only Stop() ends it.
  asio::executor_work_guard<asio::io_context::executor_type> work_ = asio::make_work_guard(ioc_);
  tcp::acceptor acceptor_{ioc_};
  asio::steady_timer accept_retry_{ioc_};
  std::thread thread_;

 private:
  void Accept();
  void OnAccept(const error_code& ec, tcp::socket socket);
};

// One accepted connection. Owned by the handlers pending on it (the usual
// Beast shape); a Reply holds it weakly, so a late answer finds it gone.
class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(MetricsHttpServer::Impl* server, tcp::socket socket)
      : server_(server), stream_(std::move(socket)), render_timer_(stream_.get_executor()) {
    server_->connections_.fetch_add(1, std::memory_order_relaxed);
  }
  ~Connection() { server_->connections_.fetch_sub(1, std::memory_order_relaxed); }

  void Read();

 private:
  void OnRead(const error_code& ec);
  void AskRender();
  void OnRendered(absl::StatusOr<std::string> text);
  void Answer(http::status status, std::string body, const char* content_type);
  void OnWritten(const error_code& ec);
  void Close();

  MetricsHttpServer::Impl* const server_;
  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  std::optional<http::response<http::string_body>> response_;
  asio::steady_timer render_timer_;
  bool rendering_ = false;  // a GET /metrics waits for its Reply
  bool keep_alive_ = false;
};

void Connection::Read() {
  parser_.emplace();
  parser_->header_limit(kMaxRequestHeaderBytes);
  parser_->body_limit(kMaxRequestBodyBytes);
  stream_.expires_after(Chrono(server_->opt_.io_timeout));
  http::async_read(stream_, buffer_, *parser_,
                   [self = shared_from_this()](const error_code& ec, size_t) { self->OnRead(ec); });
}

void Connection::OnRead(const error_code& ec) {
  // EOF between requests, a time-out, a malformed or oversized request:
  // nothing worth an answer.
  if (ec) return Close();
  const http::request<http::string_body>& req = parser_->get();
  keep_alive_ = req.keep_alive();
  const beast::string_view target = req.target();
  const beast::string_view path = target.substr(0, target.find('?'));
  if (path != kMetricsPath) {
    return Answer(http::status::not_found, "not found: kvnode serves GET /metrics only\n",
                  "text/plain; charset=utf-8");
  }
  if (req.method() != http::verb::get) {
    return Answer(http::status::method_not_allowed, "method not allowed: GET /metrics only\n",
                  "text/plain; charset=utf-8");
  }
  AskRender();
}

void Connection::AskRender() {
  rendering_ = true;
  render_timer_.expires_after(Chrono(server_->opt_.render_timeout));
  render_timer_.async_wait([self = shared_from_this()](const error_code& ec) {
    if (ec || !self->rendering_) return;  // answered in time
    self->rendering_ = false;
    self->Answer(http::status::service_unavailable,
                 absl::StrCat("metrics: the node did not answer within ",
                              absl::FormatDuration(self->server_->opt_.render_timeout), "\n"),
                 "text/plain; charset=utf-8");
  });
  std::weak_ptr<Connection> weak = weak_from_this();
  server_->render_([gate = server_->gate_, weak](absl::StatusOr<std::string> text) {
    AnnotatedLock l(&gate->mu);
    if (gate->ioc == nullptr) return;  // stopped
    asio::post(*gate->ioc, [weak, text = std::move(text)]() mutable {
      if (std::shared_ptr<Connection> c = weak.lock()) c->OnRendered(std::move(text));
    });
  });
}

void Connection::OnRendered(absl::StatusOr<std::string> text) {
  if (!rendering_) return;  // the 503 went out already
  rendering_ = false;
  render_timer_.cancel();
  if (!text.ok()) {
    return Answer(http::status::internal_server_error,
                  absl::StrCat("metrics: ", text.status().ToString(), "\n"),
                  "text/plain; charset=utf-8");
  }
  Answer(http::status::ok, std::move(*text), kMetricsContentType);
}

void Connection::Answer(http::status status, std::string body, const char* content_type) {
  response_.emplace(status, parser_->get().version());
  response_->set(http::field::server, "kvnode");
  response_->set(http::field::content_type, content_type);
  if (status == http::status::method_not_allowed) response_->set(http::field::allow, "GET");
  response_->keep_alive(keep_alive_);
  response_->body() = std::move(body);
  response_->prepare_payload();
  stream_.expires_after(Chrono(server_->opt_.io_timeout));
  http::async_write(stream_, *response_, [self = shared_from_this()](const error_code& ec, size_t) {
    self->OnWritten(ec);
  });
}

void Connection::OnWritten(const error_code& ec) {
  if (ec || !keep_alive_) return Close();
  response_.reset();
  Read();
}

void Connection::Close() {
  error_code ignored;
  stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);  // this connection only
  stream_.close();
}

absl::Status MetricsHttpServer::Impl::Open(int listen_fd) {
  int listening = 0;
  socklen_t len = sizeof(listening);
  if (getsockopt(listen_fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) != 0 || listening == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics http: fd ", listen_fd, " is not a listening socket"));
  }
  sockaddr_storage ss{};
  len = sizeof(ss);
  if (getsockname(listen_fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0 ||
      (ss.ss_family != AF_INET && ss.ss_family != AF_INET6)) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics http: fd ", listen_fd, " is not a TCP socket"));
  }
  // Close-on-exec: a live upgrade's new process gets the socket by
  // SCM_RIGHTS, never a stray copy of this duplicate.
  const int dup_fd = fcntl(listen_fd, F_DUPFD_CLOEXEC, 3);
  if (dup_fd < 0) return base::ErrnoStatus(errno, "metrics http: dup of the listening socket");
  error_code ec;
  acceptor_.assign(ss.ss_family == AF_INET ? tcp::v4() : tcp::v6(), dup_fd, ec);
  if (ec) {
    close(dup_fd);
    return absl::InternalError(absl::StrCat("metrics http: adopting the socket: ", ec.message()));
  }
  address_ = SockName(listen_fd);
  {
    AnnotatedLock l(&gate_->mu);
    gate_->ioc = &ioc_;
  }
  Accept();
  return absl::OkStatus();
}

void MetricsHttpServer::Impl::Run() {
  // Nothing may escape the thread (std::terminate): Beast reports errors as
  // codes; what throws here is an allocation failure or a bug.
  try {
    ioc_.run();
  } catch (const std::exception& e) {
    LOG(ERROR) << "metrics http " << address_ << ": stopped by an exception: " << e.what();
  }
}

void MetricsHttpServer::Impl::Accept() {
  acceptor_.async_accept(
      [this](const error_code& ec, tcp::socket socket) { OnAccept(ec, std::move(socket)); });
}

void MetricsHttpServer::Impl::OnAccept(const error_code& ec, tcp::socket socket) {
  if (ec == asio::error::operation_aborted) return;  // paused or stopping
  if (ec && !paused_) {
    // EMFILE and the like: try again shortly rather than spin.
    LOG_EVERY_N(WARNING, 100) << "metrics http " << address_ << ": accept: " << ec.message();
    accept_retry_.expires_after(std::chrono::milliseconds(100));
    accept_retry_.async_wait([this](const error_code& e) {
      if (!e && !paused_) Accept();
    });
    return;
  }
  if (ec) return;  // paused meanwhile
  // Accepted before a Pause() took effect: answered all the same.
  if (connections_.load(std::memory_order_relaxed) >= opt_.max_connections) {
    error_code ignored;
    socket.close(ignored);
  } else {
    std::make_shared<Connection>(this, std::move(socket))->Read();
  }
  if (!paused_) Accept();
}

void MetricsHttpServer::Impl::Pause() {
  std::promise<void> done;
  std::future<void> paused = done.get_future();
  asio::post(ioc_, [this, &done] {
    paused_ = true;
    error_code ignored;
    acceptor_.cancel(ignored);
    accept_retry_.cancel();
    done.set_value();
  });
  // The server's thread never waits for anyone, so this is short; a
  // stopped server never runs the task, hence the bound.
  if (thread_.joinable() && !ioc_.stopped()) paused.wait_for(std::chrono::seconds(5));
}

void MetricsHttpServer::Impl::Resume() {
  asio::post(ioc_, [this] {
    if (!paused_) return;
    paused_ = false;
    Accept();
  });
}

void MetricsHttpServer::Impl::Stop() {
  {
    AnnotatedLock l(&gate_->mu);
    gate_->ioc = nullptr;
  }
  ioc_.stop();
  if (thread_.joinable()) thread_.join();
  error_code ignored;
  acceptor_.close(ignored);  // the duplicate only: close(2), never shutdown(2)
}

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(
    int listen_fd, Render render, const MetricsHttpOptions& options) {
  if (absl::Status s = options.Validate(); !s.ok()) return s;
  if (!render) return absl::InvalidArgumentError("metrics http: no render callback");
  auto impl = std::make_unique<Impl>(std::move(render), options);
  if (absl::Status s = impl->Open(listen_fd); !s.ok()) return s;
  Impl* raw = impl.get();
  try {
    impl->thread_ = std::thread([raw] { raw->Run(); });
  } catch (const std::system_error& e) {
    return absl::ResourceExhaustedError(absl::StrCat("metrics http: thread: ", e.what()));
  }
  LOG(INFO) << "metrics: serving GET /metrics on http://" << impl->address_ << "/metrics";
  return std::unique_ptr<MetricsHttpServer>(new MetricsHttpServer(std::move(impl)));
}

MetricsHttpServer::MetricsHttpServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
MetricsHttpServer::~MetricsHttpServer() { Stop(); }
void MetricsHttpServer::Pause() { impl_->Pause(); }
void MetricsHttpServer::Resume() { impl_->Resume(); }
void MetricsHttpServer::Stop() { impl_->Stop(); }
const std::string& MetricsHttpServer::address() const { return impl_->address_; }

}  // namespace kvnode::server
