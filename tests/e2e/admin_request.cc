// kvnode_admin_request SOCKET LINE: sends one request line to a node's admin
// socket and prints the answer. Exit 0 with a non-empty answer; 1 when the
// socket is not there, the node closed without answering or 10 s passed.
//
// The e2e scripts poll the node's state with it hundreds of times per run
// (tests/e2e/lib.sh kv_admin), in a TCG guest where a process that loads the
// raw client's 44 shared libraries takes 250 ms to start, more when kvload
// keeps both vCPUs busy. So this one uses nothing but the C library and is
// linked statically: no dynamic loader work at all.
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>

namespace {

constexpr int kTimeoutMs = 10000;

int64_t NowMs() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1000 + ts.tv_nsec / 1000000;
}

bool WriteAll(int fd, const char* p, size_t n) {
  while (n > 0) {
    const ssize_t w = write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s ADMIN_SOCKET 'REQUEST LINE'\n", argv[0]);
    return 2;
  }
  sockaddr_un sun{};
  sun.sun_family = AF_UNIX;
  const size_t path_len = std::strlen(argv[1]);
  if (path_len >= sizeof(sun.sun_path)) return 1;
  std::memcpy(sun.sun_path, argv[1], path_len);
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0 || connect(fd, reinterpret_cast<sockaddr*>(&sun), sizeof(sun)) != 0) return 1;
  if (!WriteAll(fd, argv[2], std::strlen(argv[2])) || !WriteAll(fd, "\n", 1)) return 1;
  // The node answers one line and closes: read until EOF, within the deadline.
  const int64_t deadline = NowMs() + kTimeoutMs;
  char buf[65536];
  size_t total = 0;
  for (;;) {
    const int64_t left = deadline - NowMs();
    pollfd p{fd, POLLIN, 0};
    const int r = left > 0 ? poll(&p, 1, static_cast<int>(left)) : 0;
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return 1;
    const ssize_t n = read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return 1;
    if (n == 0) break;
    if (!WriteAll(STDOUT_FILENO, buf, static_cast<size_t>(n))) return 1;
    total += static_cast<size_t>(n);
  }
  return total > 0 ? 0 : 1;
}
