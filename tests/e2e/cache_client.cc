// kvnode_cache_client: libkvclient's location cache against the real node.
// Client A reads heap values (and so caches where they are); client B
// (no cache) overwrites, deletes, re-creates and resizes the same keys
// between A's GETs. Every GET of A must return exactly what B wrote last (or
// NOT_FOUND after a delete): a stale cached location is detected and the GET
// falls back to the bucket. Also requires that the cache was used (hits) and
// that stale locations were met (so the checks cannot pass vacuously).
// Exit 0 when all held, 1 otherwise (the reason on stderr), 2 on set-up.
#include <gflags/gflags.h>

#include <cstdio>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "kvnode/client/admin.h"
#include "kvnode/client/client.h"

DEFINE_string(server, "127.0.0.1:7000", "node address");
DEFINE_string(auth_token_file, "", "token file");
DEFINE_uint32(keys, 32, "keys cycled through");
DEFINE_uint32(rounds, 20, "overwrite rounds per key");

namespace {

using kvnode::client::Client;
using kvnode::client::ClientOptions;

int failures = 0;

void Fail(const std::string& what) {
  std::fprintf(stderr, "cache_client: FAIL: %s\n", what.c_str());
  ++failures;
}

// A value that names its key and round, of a size that changes each round
// (so the node allocates the new object elsewhere: above the inline limit).
std::string Value(uint32_t key, uint32_t round) {
  const size_t size = 600 + (round * 997 + key * 131) % 3000;
  std::string v = absl::StrCat("key ", key, " round ", round, " ");
  v.resize(size, static_cast<char>('a' + (round + key) % 26));
  return v;
}

std::string Key(uint32_t k) { return absl::StrCat("cache-key-", k); }

absl::Time Deadline() { return absl::Now() + absl::Seconds(20); }

// A's GET of key k must be `want` (nullptr: NOT_FOUND).
void Expect(Client& a, uint32_t k, const std::string* want, const char* after) {
  absl::StatusOr<kvnode::client::GetResult> g = a.Get(Key(k), Deadline());
  if (want == nullptr) {
    if (g.ok()) {
      Fail(absl::StrCat("GET ", Key(k), " after ", after, ": found ", g->value.size(),
                        " bytes, want NOT_FOUND"));
    } else if (!absl::IsNotFound(g.status())) {
      Fail(absl::StrCat("GET ", Key(k), " after ", after, ": ", g.status().ToString()));
    }
    return;
  }
  if (!g.ok()) {
    Fail(absl::StrCat("GET ", Key(k), " after ", after, ": ", g.status().ToString()));
  } else if (g->value != *want) {
    Fail(absl::StrCat("GET ", Key(k), " after ", after, ": wrong value (", g->value.size(),
                      " bytes: '", g->value.substr(0, 24), "...', want ", want->size(), " bytes: '",
                      want->substr(0, 24), "...')"));
  }
}

}  // namespace

int main(int argc, char** argv) {
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  std::string token;
  if (!FLAGS_auth_token_file.empty()) {
    absl::StatusOr<std::string> t = kvnode::client::ReadAuthTokenFile(FLAGS_auth_token_file);
    if (!t.ok()) {
      std::fprintf(stderr, "%s\n", std::string(t.status().message()).c_str());
      return 2;
    }
    token = *std::move(t);
  }
  ClientOptions oa;
  oa.server = FLAGS_server;
  oa.auth_token = token;
  oa.client_name = "cache-reader";
  oa.max_outstanding = 4;
  ClientOptions ob = oa;
  ob.client_name = "cache-writer";
  ob.location_cache_entries = 0;
  absl::StatusOr<std::unique_ptr<Client>> a = Client::Connect(oa);
  absl::StatusOr<std::unique_ptr<Client>> b = Client::Connect(ob);
  if (!a.ok() || !b.ok()) {
    std::fprintf(stderr, "cache_client: connect: %s / %s\n", a.status().ToString().c_str(),
                 b.status().ToString().c_str());
    return 2;
  }
  if (!(*a)->fast_get()) {
    std::fprintf(stderr, "cache_client: the node offers no READ fast path\n");
    return 2;
  }
  Client& ra = **a;
  Client& wb = **b;
  auto put = [&](uint32_t k, const std::string& v) {
    if (absl::StatusOr<uint64_t> st = wb.Put(Key(k), v, Deadline()); !st.ok()) {
      Fail(absl::StrCat("PUT ", Key(k), ": ", st.status().ToString()));
    }
  };
  auto del = [&](uint32_t k) {
    if (absl::StatusOr<uint64_t> st = wb.Delete(Key(k), Deadline());
        !st.ok() && !absl::IsNotFound(st.status())) {
      Fail(absl::StrCat("DELETE ", Key(k), ": ", st.status().ToString()));
    }
  };

  // Fill: B writes, A reads twice (the second GET goes through the cache).
  for (uint32_t k = 0; k < FLAGS_keys; ++k) {
    const std::string v = Value(k, 0);
    put(k, v);
    Expect(ra, k, &v, "the first PUT");
    Expect(ra, k, &v, "the first PUT (cached)");
  }
  const uint64_t hits_after_fill = ra.stats().location_hits;
  if (hits_after_fill < FLAGS_keys) {
    Fail(absl::StrCat("only ", hits_after_fill, " GETs of ", FLAGS_keys,
                      " went through the location cache"));
  }
  // Rounds: every GET of A follows a change by B that A's cache does not
  // know of: overwrite (new size, new place), delete, re-create.
  for (uint32_t round = 1; round <= FLAGS_rounds; ++round) {
    for (uint32_t k = 0; k < FLAGS_keys; ++k) {
      switch ((round + k) % 4) {
        case 0: {  // delete, then re-create
          del(k);
          Expect(ra, k, nullptr, "DELETE");
          const std::string v = Value(k, round);
          put(k, v);
          Expect(ra, k, &v, "DELETE + PUT");
          break;
        }
        case 1: {  // two overwrites in a row: the first new object is gone too
          put(k, Value(k, round + 1000));
          const std::string v = Value(k, round);
          put(k, v);
          Expect(ra, k, &v, "two PUTs");
          break;
        }
        default: {
          const std::string v = Value(k, round);
          put(k, v);
          Expect(ra, k, &v, "PUT");
          Expect(ra, k, &v, "PUT (cached again)");
          break;
        }
      }
    }
  }
  const kvnode::client::ClientStats& s = ra.stats();
  std::printf(
      "cache_client: %llu GETs by READ (%llu through the cache, %llu stale locations caught), "
      "%llu by RPC, %u failures\n",
      static_cast<unsigned long long>(s.gets_by_read),
      static_cast<unsigned long long>(s.location_hits),
      static_cast<unsigned long long>(s.location_stale),
      static_cast<unsigned long long>(s.gets_by_rpc), failures);
  // Every change by B leaves A's location stale: most rounds must have met
  // one (some are not cached: a GET that went by RPC, a tag collision).
  if (s.location_stale < uint64_t{FLAGS_keys} * FLAGS_rounds / 2) {
    Fail(absl::StrCat("only ", s.location_stale, " stale locations met in ",
                      FLAGS_keys * FLAGS_rounds, " changes: the test did not exercise the cache"));
  }
  if (s.location_hits <= hits_after_fill) Fail("no cache hit after the fill");
  (void)ra.Close();
  (void)wb.Close();
  return failures == 0 ? 0 : 1;
}
