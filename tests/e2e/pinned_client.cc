// kvnode_pinned_client: a ClusterClient kept on an old shard map
// (follow_pushed_maps = false) against a slot that changes hands.
//
//   1. Picks key k with a slot S in [--slot_lo, --slot_hi) and key k2 of the
//      same slot (names start with --prefix). A writer (an ordinary
//      ClusterClient) PUTs k = OLD (a heap value: the reader caches where it
//      is).
//   2. The pinned reader GETs k twice (the second through its location
//      cache, one READ), then touches --ready and waits for --go (the
//      script moves S to another node in etcd and waits until both nodes
//      store their slot words for the new map).
//   3. A new writer (on the new map) PUTs k = NEW and k2 = V2: both now
//      live at S's new owner only.
//   4. The reader, still on its old map (checked: else the test proves
//      nothing), GETs k and k2: it must get NEW and V2. Without slot words
//      (--slot_words=false) it reads S's old owner's arena and gets OLD
//      (stale) and NOT_FOUND.
//
// Prints one line per check and the reader's counters. Exit 0 when both
// GETs were right (and, with slot words, at least one READ was recognised
// as not served), 1 when a GET was wrong, 2 on set-up failures.
#include <gflags/gflags.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "kvnode/client/admin.h"
#include "kvnode/client/cluster_client.h"
#include "kvnode/proto/shard_map.h"

DEFINE_string(cluster, "", "seed nodes HOST:PORT[,HOST:PORT...]");
DEFINE_string(auth_token_file, "", "token file");
DEFINE_uint32(slots, kvnode::proto::kDefaultSlots, "the map's number of slots");
DEFINE_uint32(slot_lo, 0, "k's slot is in [slot_lo, slot_hi)");
DEFINE_uint32(slot_hi, 1, "k's slot is in [slot_lo, slot_hi)");
DEFINE_string(prefix, "pinned", "key names start with this");
DEFINE_string(ready, "", "file touched once the reader has read k");
DEFINE_string(go, "", "file whose appearance starts step 3");
DEFINE_uint32(go_timeout_s, 300, "how long to wait for --go");
DEFINE_bool(slot_words, true, "the reader asks for slot words (kFeatureSlotWords)");

namespace {

using kvnode::client::ClusterClient;
using kvnode::client::ClusterClientOptions;

absl::Time Deadline() { return absl::Now() + absl::Seconds(30); }

std::string Heap(const std::string& tag) {
  std::string v = absl::StrCat(FLAGS_prefix, " ", tag, " ");
  v.resize(900, tag[0]);  // above the inline limit: a heap object, cached by location
  return v;
}

std::string KeyInSlotRange(const std::string& base, uint32_t lo, uint32_t hi) {
  for (uint32_t i = 0;; ++i) {
    std::string k = absl::StrCat(FLAGS_prefix, "-", base, "-", i);
    const uint32_t s = kvnode::proto::SlotOf(k, FLAGS_slots);
    if (s >= lo && s < hi) return k;
  }
}

absl::StatusOr<std::unique_ptr<ClusterClient>> Connect(const std::string& token, bool pinned) {
  ClusterClientOptions o;
  o.seeds = absl::StrSplit(FLAGS_cluster, ',', absl::SkipEmpty());
  o.base.auth_token = token;
  o.base.client_name = pinned ? "pinned-reader" : "writer";
  o.base.max_outstanding = 4;
  o.base.connect_timeout = absl::Seconds(5);
  o.base.op_timeout = absl::Seconds(30);
  o.follow_pushed_maps = !pinned;
  o.slot_words = pinned ? FLAGS_slot_words : true;
  return ClusterClient::Connect(std::move(o));
}

// The reader's GET of `key`: "ok" when it returned `want`, else what it got.
std::string Check(ClusterClient& c, const std::string& key, const std::string& want,
                  const std::string& old) {
  absl::StatusOr<kvnode::client::GetResult> g = c.Get(key, Deadline());
  if (absl::IsNotFound(g.status())) return "NOT_FOUND (false: the key exists at the slot's owner)";
  if (!g.ok()) return absl::StrCat("error: ", g.status().ToString());
  if (g->value == want) return "ok";
  if (!old.empty() && g->value == old) return "STALE (the value before the slot moved)";
  return absl::StrCat("wrong value of ", g->value.size(), " bytes");
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
  if (FLAGS_slot_lo >= FLAGS_slot_hi || FLAGS_slot_hi > FLAGS_slots || FLAGS_go.empty() ||
      FLAGS_ready.empty()) {
    std::fprintf(stderr, "pinned_client: bad flags (slot range, --go, --ready)\n");
    return 2;
  }
  const std::string k = KeyInSlotRange("k", FLAGS_slot_lo, FLAGS_slot_hi);
  const uint32_t slot = kvnode::proto::SlotOf(k, FLAGS_slots);
  const std::string k2 = KeyInSlotRange("k2", slot, slot + 1);
  const std::string old_v = Heap("old");
  const std::string new_v = Heap("new");
  const std::string v2 = Heap("second");

  absl::StatusOr<std::unique_ptr<ClusterClient>> w = Connect(token, false);
  absl::StatusOr<std::unique_ptr<ClusterClient>> r = Connect(token, true);
  if (!w.ok() || !r.ok()) {
    std::fprintf(stderr, "pinned_client: connect: %s / %s\n", w.status().ToString().c_str(),
                 r.status().ToString().c_str());
    return 2;
  }
  ClusterClient& reader = **r;
  if (absl::StatusOr<uint64_t> p = (*w)->Put(k, old_v, Deadline()); !p.ok()) {
    std::fprintf(stderr, "pinned_client: PUT %s: %s\n", k.c_str(), p.status().ToString().c_str());
    return 2;
  }
  (void)(*w)->Close();
  for (int i = 0; i < 2; ++i) {
    if (std::string c = Check(reader, k, old_v, ""); c != "ok") {
      std::fprintf(stderr, "pinned_client: GET %s before the move: %s\n", k.c_str(), c.c_str());
      return 2;
    }
  }
  const uint64_t epoch = reader.map_epoch();
  if (reader.stats().location_hits == 0 || reader.stats().gets_by_read < 2) {
    std::fprintf(stderr, "pinned_client: the reader did not read k by READ through its cache\n");
    return 2;
  }
  std::printf("pinned_client: slot %u, keys %s and %s, reader at map epoch %llu, slot words %s\n",
              slot, k.c_str(), k2.c_str(), static_cast<unsigned long long>(epoch),
              FLAGS_slot_words ? "asked for" : "not asked for");
  std::fflush(stdout);
  std::ofstream(FLAGS_ready) << slot << "\n";

  // A condition with a deadline (the script creates the file), polled.
  const absl::Time go_by = absl::Now() + absl::Seconds(FLAGS_go_timeout_s);
  while (!std::filesystem::exists(FLAGS_go)) {
    if (absl::Now() > go_by) {
      std::fprintf(stderr, "pinned_client: no %s within %u s\n", FLAGS_go.c_str(),
                   FLAGS_go_timeout_s);
      return 2;
    }
    reader.Wait(absl::Now() + absl::Milliseconds(20));  // keeps its sessions alive
    (void)reader.Poll({});
  }

  absl::StatusOr<std::unique_ptr<ClusterClient>> w2 = Connect(token, false);
  if (!w2.ok()) {
    std::fprintf(stderr, "pinned_client: writer: %s\n", w2.status().ToString().c_str());
    return 2;
  }
  if ((*w2)->map_epoch() <= epoch) {
    std::fprintf(stderr, "pinned_client: the writer found map epoch %llu, not newer than %llu\n",
                 static_cast<unsigned long long>((*w2)->map_epoch()),
                 static_cast<unsigned long long>(epoch));
    return 2;
  }
  for (const auto& [key, v] : {std::pair{k, new_v}, std::pair{k2, v2}}) {
    if (absl::StatusOr<uint64_t> p = (*w2)->Put(key, v, Deadline()); !p.ok()) {
      std::fprintf(stderr, "pinned_client: PUT %s: %s\n", key.c_str(),
                   p.status().ToString().c_str());
      return 2;
    }
  }
  (void)(*w2)->Close();
  (void)reader.Poll({});
  if (reader.map_epoch() != epoch) {
    std::fprintf(stderr, "pinned_client: the reader left map epoch %llu before its GETs\n",
                 static_cast<unsigned long long>(epoch));
    return 2;
  }

  const std::string got_k = Check(reader, k, new_v, old_v);
  const std::string got_k2 = Check(reader, k2, v2, "");
  const auto& st = reader.stats();
  const auto& cs = reader.cluster_stats();
  std::printf("pinned_client: GET %s: %s\n", k.c_str(), got_k.c_str());
  std::printf("pinned_client: GET %s: %s\n", k2.c_str(), got_k2.c_str());
  std::printf(
      "pinned_client: reader: %llu GETs by READ, %llu by RPC, reads_not_served %llu, "
      "wrong_shard %llu, map epoch %llu -> %llu\n",
      static_cast<unsigned long long>(st.gets_by_read),
      static_cast<unsigned long long>(st.gets_by_rpc),
      static_cast<unsigned long long>(st.reads_not_served),
      static_cast<unsigned long long>(cs.wrong_shard), static_cast<unsigned long long>(epoch),
      static_cast<unsigned long long>(reader.map_epoch()));
  (void)reader.Close();
  if (got_k != "ok" || got_k2 != "ok") return 1;
  if (FLAGS_slot_words && st.reads_not_served == 0) {
    std::printf("pinned_client: right values, but no READ was recognised as not served\n");
    return 1;
  }
  return 0;
}
