// kvnode_admin_request [--until TEXT]... [--wait_s S] SOCKET LINE: sends one
// request line to a node's admin socket and prints the answer. Exit 0 with a
// non-empty answer; 1 when the socket is not there, the node closed without
// answering or 10 s passed.
//
// With --until, the request is repeated every 50 ms until the answer contains
// every TEXT (a request that fails, e.g. while a live upgrade hands the socket
// over, is repeated too), then that answer is printed; exit 1, with the last
// answer on stderr, when S seconds (default 30) pass first.
//
// The e2e scripts poll the node's state with it hundreds of times per run
// (tests/e2e/lib.sh kv_admin), in a TCG guest where a process that loads the
// raw client's 44 shared libraries takes 250 ms to start, more when kvload
// keeps both vCPUs busy. So this one uses nothing but the C library and is
// linked statically: no dynamic loader work at all. --until goes further: a
// wait costs one process, not one per poll, and leaves the CPU to the node.
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>
#include <vector>

namespace {

constexpr int kTimeoutMs = 10000;
constexpr int kPollIntervalMs = 50;

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

// Reads until EOF within kTimeoutMs: the node answers one line and closes.
bool ReadToEof(int fd, std::string* answer) {
  const int64_t deadline = NowMs() + kTimeoutMs;
  char buf[65536];
  for (;;) {
    const int64_t left = deadline - NowMs();
    pollfd p{fd, POLLIN, 0};
    const int r = left > 0 ? poll(&p, 1, static_cast<int>(left)) : 0;
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    const ssize_t n = read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return n == 0;
    answer->append(buf, static_cast<size_t>(n));
  }
}

// One request: false when it could not be sent or was not answered.
bool Request(const char* path, const char* line, std::string* answer) {
  answer->clear();
  sockaddr_un sun{};
  sun.sun_family = AF_UNIX;
  const size_t path_len = std::strlen(path);
  if (path_len >= sizeof(sun.sun_path)) return false;
  std::memcpy(sun.sun_path, path, path_len);
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  const bool ok = connect(fd, reinterpret_cast<sockaddr*>(&sun), sizeof(sun)) == 0 &&
                  WriteAll(fd, line, std::strlen(line)) && WriteAll(fd, "\n", 1) &&
                  ReadToEof(fd, answer);
  close(fd);
  return ok && !answer->empty();
}

bool ContainsAll(const std::string& answer, const std::vector<const char*>& texts) {
  for (const char* t : texts) {
    if (answer.find(t) == std::string::npos) return false;
  }
  return true;
}

int Usage(const char* argv0) {
  std::fprintf(stderr, "usage: %s [--until TEXT]... [--wait_s S] ADMIN_SOCKET 'REQUEST LINE'\n",
               argv0);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<const char*> until;
  long wait_s = 30;
  int i = 1;
  for (; i + 1 < argc && std::strncmp(argv[i], "--", 2) == 0; i += 2) {
    if (std::strcmp(argv[i], "--until") == 0) {
      until.push_back(argv[i + 1]);
    } else if (std::strcmp(argv[i], "--wait_s") == 0) {
      char* end = nullptr;
      wait_s = std::strtol(argv[i + 1], &end, 10);
      if (*end != '\0' || wait_s < 0) return Usage(argv[0]);
    } else {
      return Usage(argv[0]);
    }
  }
  if (argc - i != 2) return Usage(argv[0]);
  const char* path = argv[i];
  const char* line = argv[i + 1];
  std::string answer;
  if (until.empty()) {
    if (!Request(path, line, &answer)) return 1;
    return WriteAll(STDOUT_FILENO, answer.data(), answer.size()) ? 0 : 1;
  }
  const int64_t deadline = NowMs() + wait_s * 1000;
  for (;;) {
    if (Request(path, line, &answer) && ContainsAll(answer, until)) {
      return WriteAll(STDOUT_FILENO, answer.data(), answer.size()) ? 0 : 1;
    }
    if (NowMs() >= deadline) break;
    poll(nullptr, 0, kPollIntervalMs);  // the poll interval of a wait with a deadline
  }
  WriteAll(STDERR_FILENO, answer.data(), answer.size());
  return 1;
}
