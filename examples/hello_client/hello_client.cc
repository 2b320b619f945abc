// hello_client: connect to a kvnode, PUT a key, GET it back. With a third
// argument N it then keeps reading and writing until the client has followed
// N live upgrades of the node (Move: libkvclient reconnects to the new
// process by itself; the program only sees its calls succeed), and checks
// the value once more.
//
//   hello_client HOST:PORT TOKEN_FILE [MOVES]
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "kvnode/client/client.h"

namespace kc = kvnode::client;

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s HOST:PORT TOKEN_FILE [MOVES]\n", argv[0]);
    return 2;
  }
  kc::ClientOptions options;
  options.server = argv[1];
  options.client_name = "hello_client";
  std::ifstream token_file(argv[2]);
  if (!std::getline(token_file, options.auth_token)) {
    std::fprintf(stderr, "cannot read the token from %s\n", argv[2]);
    return 1;
  }
  const unsigned long moves = argc > 3 ? std::strtoul(argv[3], nullptr, 10) : 0;

  absl::StatusOr<std::unique_ptr<kc::Client>> client = kc::Client::Connect(options);
  if (!client.ok()) {
    std::fprintf(stderr, "connect: %s\n", client.status().ToString().c_str());
    return 1;
  }
  kc::Client& c = **client;
  absl::StatusOr<uint64_t> put = c.Put("hello", "world");
  if (!put.ok()) {
    std::fprintf(stderr, "PUT: %s\n", put.status().ToString().c_str());
    return 1;
  }
  absl::StatusOr<kc::GetResult> get = c.Get("hello");
  if (!get.ok() || get->value != "world") {
    std::fprintf(stderr, "GET: %s\n",
                 get.ok() ? get->value.c_str() : get.status().ToString().c_str());
    return 1;
  }
  std::printf("hello -> %s (version %llu)\n", get->value.c_str(),
              static_cast<unsigned long long>(get->version));
  std::fflush(stdout);

  // Until the node has moved this client `moves` times: every operation must
  // succeed across each upgrade; the client library hides the Move.
  const absl::Time deadline = absl::Now() + absl::Seconds(300);
  for (uint64_t i = 0; c.stats().moves < moves; ++i) {
    if (absl::Now() > deadline) {
      std::fprintf(stderr, "only %llu of %lu moves within 300 s\n",
                   static_cast<unsigned long long>(c.stats().moves), moves);
      return 1;
    }
    const std::string value = "world-" + std::to_string(i);
    if (absl::StatusOr<uint64_t> p = c.Put("hello", value); !p.ok()) {
      std::fprintf(stderr, "PUT %llu: %s\n", static_cast<unsigned long long>(i),
                   p.status().ToString().c_str());
      return 1;
    }
    absl::StatusOr<kc::GetResult> g = c.Get("hello");
    if (!g.ok() || g->value != value) {
      std::fprintf(stderr, "GET %llu: %s\n", static_cast<unsigned long long>(i),
                   g.ok() ? g->value.c_str() : g.status().ToString().c_str());
      return 1;
    }
    absl::SleepFor(absl::Milliseconds(20));  // a gentle load, not a benchmark
  }
  std::printf("moves %llu, sessions %llu, failed ops %llu\n",
              static_cast<unsigned long long>(c.stats().moves),
              static_cast<unsigned long long>(c.stats().sessions),
              static_cast<unsigned long long>(c.stats().ops_failed));
  if (absl::Status s = c.Close(); !s.ok()) {
    std::fprintf(stderr, "close: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
