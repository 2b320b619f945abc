// Persisted dedupe client records (docs/format.md "Side records and client
// records") as a cold start reads them from RocksDB's kvnode.meta column
// family: ParseClientRecordKey on the key, DecodeClientRecord on the value,
// then DedupeWindow::Import of the result. The bytes are the node's own, but
// a corrupted or foreign database must give a logged DataLoss, not a crash.
//
// Input: u8 flags, u8 key length, the key, the record value.
//   flags bit 0: rewrite the record's entry count from its length (and drop
//                a partial last entry), so that the fuzzer gets past the
//                length check to the entry checks; clear: the check itself
//                is fuzzed.
//   flags bits 1-4: capacity - 1 of a second, small import (1..16), which
//                forgets the oldest entries.
// Properties: a key that parses re-encodes to itself; a record that decodes
// re-encodes to the same bytes, lists distinct sequences with definitive
// answers to writes, and has no floor without its flag; imported, every
// listed sequence is answered as recorded or (small window) refused as too
// old, and the floor is refused -- a retry is never applied twice.
#include <algorithm>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_util.h"
#include "kvnode/proto/rpc.h"
#include "kvnode/server/dedupe.h"

namespace kvnode::server {
namespace {

constexpr size_t kHeader = 36;  // format version 2 (with the resume secret)
constexpr size_t kEntry = 18;
constexpr size_t kMaxEntries = 4096;

void CheckImport(const PersistedClient& c, size_t capacity) {
  const DedupeWindow w = DedupeWindow::Import(c.window, capacity);
  const auto& entries = c.window.entries;
  FUZZ_CHECK(w.size() == std::min(entries.size(), w.capacity()));
  for (size_t i = 0; i < entries.size(); ++i) {
    const DedupeEntry& e = entries[i];
    const DedupeEntry* found = w.Find(e.sequence);
    if (i + w.capacity() >= entries.size()) {  // among the newest `capacity`
      FUZZ_CHECK(found != nullptr && *found == e);
    } else {
      FUZZ_CHECK(found == nullptr && w.TooOld(e.sequence));
    }
  }
  if (c.window.has_floor && w.Find(c.window.floor) == nullptr) {
    FUZZ_CHECK(w.TooOld(c.window.floor));
  }
  if (entries.size() <= w.capacity()) {  // nothing forgotten: Export gives it back
    const DedupeWindow::Exported back = w.Export();
    FUZZ_CHECK(back.entries == entries);
    FUZZ_CHECK(back.has_floor == c.window.has_floor && back.floor == c.window.floor);
  }
}

}  // namespace
}  // namespace kvnode::server

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvnode::server;
  namespace proto = kvnode::proto;
  const uint8_t flags = size > 0 ? data[0] : 0;
  const size_t key_len = size > 1 ? std::min<size_t>(data[1], size - 2) : 0;
  const std::string_view key(reinterpret_cast<const char*>(data) + std::min<size_t>(size, 2),
                             key_len);
  std::string rec(reinterpret_cast<const char*>(data) + std::min<size_t>(size, 2) + key_len,
                  size - std::min<size_t>(size, 2 + key_len));
  if ((flags & 1) != 0 && rec.size() >= kHeader) {
    const size_t n = std::min((rec.size() - kHeader) / kEntry, kMaxEntries);
    rec[2] = static_cast<char>(n & 0xff);
    rec[3] = static_cast<char>(n >> 8);
    rec.resize(kHeader + n * kEntry);
  }

  const uint64_t id = ParseClientRecordKey(key);
  if (id != 0) FUZZ_CHECK(ClientRecordKey(id) == key);

  // The node decodes only under a key that parses; the decoder does not
  // depend on the id beyond naming it.
  absl::StatusOr<PersistedClient> c = DecodeClientRecord(id, rec);
  if (!c.ok()) {
    FUZZ_CHECK(absl::IsDataLoss(c.status()));
    return 0;
  }
  FUZZ_CHECK(c->client_id == id);
  FUZZ_CHECK(EncodeClientRecord(*c) == rec);
  const auto& entries = c->window.entries;
  FUZZ_CHECK(entries.size() <= kMaxEntries && rec.size() == kHeader + entries.size() * kEntry);
  FUZZ_CHECK(c->window.has_floor || c->window.floor == 0);
  for (size_t i = 0; i < entries.size(); ++i) {
    const auto op = static_cast<proto::Opcode>(entries[i].opcode);
    const auto st = static_cast<proto::RpcStatus>(entries[i].status);
    FUZZ_CHECK(op == proto::Opcode::kPut || op == proto::Opcode::kDelete);
    FUZZ_CHECK(st == proto::RpcStatus::kOk || st == proto::RpcStatus::kNotFound ||
               st == proto::RpcStatus::kRejected);
  }
  std::vector<uint64_t> seqs;
  for (const DedupeEntry& e : entries) seqs.push_back(e.sequence);
  std::sort(seqs.begin(), seqs.end());
  FUZZ_CHECK(std::adjacent_find(seqs.begin(), seqs.end()) == seqs.end());

  CheckImport(*c, 1024);  // --dedupe_window's default, as a cold start imports it
  CheckImport(*c, 1 + ((flags >> 1) & 15));
  return 0;
}
