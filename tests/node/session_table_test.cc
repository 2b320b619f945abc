// The session table on its way from O to N: the server's dedupe records
// (ClientRecordExport) -> ToSessionTable -> HandOver frame -> FromSessionRecords
// -> the server's records again. Whatever N imports must answer every retry O
// would have answered, and must survive N's next cold start (persisted client
// records are checked by DecodeClientRecord).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "kvnode/proto/rpc.h"
#include "kvnode/server/dedupe.h"
#include "kvnode/upgrade/messages.h"
#include "node_internal.h"

namespace kvnode::upgrade {
namespace {

using proto::Opcode;
using proto::RpcStatus;

// Records with every field set and varied: both write opcodes, every
// definitive status, versions, windows with and without a floor.
std::vector<server::ClientRecordExport> SampleRecords() {
  std::vector<server::ClientRecordExport> out;
  for (uint64_t c = 0; c < 4; ++c) {
    server::ClientRecordExport r;
    r.client_id = 0x9e3779b97f4a7c15ULL * (c + 1);
    for (size_t i = 0; i < r.secret.size(); ++i) r.secret[i] = static_cast<uint8_t>(c + 3 * i + 1);
    r.window.has_floor = c % 2 == 1;
    r.window.floor = r.window.has_floor ? 100 * c + 5 : 0;
    for (uint64_t i = 0; i < 6 + c; ++i) {
      const uint8_t op = static_cast<uint8_t>(i % 2 == 0 ? Opcode::kPut : Opcode::kDelete);
      const uint8_t st = static_cast<uint8_t>(i % 3 == 0   ? RpcStatus::kOk
                                              : i % 3 == 1 ? RpcStatus::kNotFound
                                                           : RpcStatus::kRejected);
      r.window.entries.push_back(
          server::DedupeEntry{100 * c + 10 + i, op, st, (uint64_t{1} << 40) + 7 * i});
    }
    out.push_back(std::move(r));
  }
  return out;
}

void ExpectSameRecords(const std::vector<server::ClientRecordExport>& got,
                       const std::vector<server::ClientRecordExport>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(got[i].client_id, want[i].client_id);
    EXPECT_EQ(got[i].secret, want[i].secret);
    EXPECT_EQ(got[i].window.has_floor, want[i].window.has_floor);
    EXPECT_EQ(got[i].window.floor, want[i].window.floor);
    EXPECT_EQ(got[i].window.entries, want[i].window.entries);  // opcode included
  }
}

TEST(SessionTable, EveryFieldSurvivesTheHandOver) {
  const std::vector<server::ClientRecordExport> records = SampleRecords();
  HandOver ho;
  ho.generation = 3;
  ho.sessions = ToSessionTable(records);
  std::string frame;
  ASSERT_TRUE(EncodeHandoff(ho, &frame).ok());
  absl::StatusOr<HandoffMessage> m = DecodeHandoff(AsBytes(frame));
  ASSERT_TRUE(m.ok()) << m.status();
  ExpectSameRecords(FromSessionRecords(std::get<HandOver>(*m).sessions.sessions), records);
}

// What failed before the opcode travelled: N imported entries with opcode 0,
// persisted them with its next write of that client, and its next cold start
// refused the record (and deleted it), so a retry was applied a second time.
TEST(SessionTable, WhatNImportsItCanPersistAndReloadAfterACrash) {
  const std::vector<server::ClientRecordExport> imported =
      FromSessionRecords(ToSessionTable(SampleRecords()).sessions);
  for (const server::ClientRecordExport& r : imported) {
    SCOPED_TRACE(r.client_id);
    const server::DedupeWindow w = server::DedupeWindow::Import(r.window, 1024);
    const uint64_t next_seq = r.window.entries.back().sequence + 1;
    const server::DedupeEntry next{next_seq, static_cast<uint8_t>(Opcode::kPut),
                                   static_cast<uint8_t>(RpcStatus::kOk), 99};
    // The record a write stores after the upgrade: the imported entries
    // (up to --rpc_credits of them) and the new one.
    const server::PersistedClient p = server::PersistedSnapshot(r.client_id, w, next, 8, 1);
    absl::StatusOr<server::PersistedClient> back =
        server::DecodeClientRecord(r.client_id, server::EncodeClientRecord(p));
    ASSERT_TRUE(back.ok()) << back.status();
    // The retry of an imported write is answered from the reloaded record.
    const server::DedupeWindow reloaded = server::DedupeWindow::Import(back->window, 1024);
    const server::DedupeEntry& last = r.window.entries.back();
    const server::DedupeEntry* e = reloaded.Find(last.sequence);
    ASSERT_NE(e, nullptr);
    EXPECT_EQ(*e, last);
  }
}

TEST(SessionTable, CodecRefusesEntriesTheServerNeverRecords) {
  SessionTable t;
  t.sessions.push_back(SessionRecord{7, 0, {DedupeEntry{1, 0, 0, 5}}});  // opcode 0
  std::string b;
  EXPECT_TRUE(absl::IsInvalidArgument(EncodeSessionTable(t, &b)));
  EXPECT_TRUE(b.empty());
  t.sessions[0].window[0].opcode = static_cast<uint8_t>(Opcode::kGet);
  EXPECT_TRUE(absl::IsInvalidArgument(EncodeSessionTable(t, &b)));
  t.sessions[0].window[0].opcode = static_cast<uint8_t>(Opcode::kPut);
  t.sessions[0].window[0].status = static_cast<uint8_t>(RpcStatus::kBusy);
  EXPECT_TRUE(absl::IsInvalidArgument(EncodeSessionTable(t, &b)));
  t.sessions[0].window[0].status = static_cast<uint8_t>(RpcStatus::kOk);
  ASSERT_TRUE(EncodeSessionTable(t, &b).ok());
  // The same bytes with the opcode patched to 0: refused by the decoder.
  // Layout: u64 next, u32 n, u64 id, 16 secret, u64 floor, u32 w, u64 sequence, u8 opcode.
  const size_t opcode_at = 8 + 4 + 8 + 16 + 8 + 4 + 8;
  ASSERT_EQ(b[opcode_at], static_cast<char>(Opcode::kPut));
  b[opcode_at] = 0;
  EXPECT_TRUE(absl::IsInvalidArgument(DecodeSessionTable(AsBytes(b)).status()));
}

// --- size: the table travels whatever the number of clients and windows ----

// `clients` records of `window` entries each, sequences 1..window (oldest
// first, as DedupeWindow::Export gives them).
std::vector<server::ClientRecordExport> FullRecords(size_t clients, size_t window) {
  std::vector<server::ClientRecordExport> out(clients);
  for (size_t c = 0; c < clients; ++c) {
    out[c].client_id = 0x1000 + c;
    out[c].window.entries.reserve(window);
    for (uint64_t i = 1; i <= window; ++i) {
      out[c].window.entries.push_back(server::DedupeEntry{
          i, static_cast<uint8_t>(Opcode::kPut), static_cast<uint8_t>(RpcStatus::kOk), i + c});
    }
  }
  return out;
}

// O's side to N's side through real frames: SplitSessions, each Sessions and
// the HandOver encoded (refused above kMaxHandoffPayloadSize) and decoded.
// Returns what N imports, in order.
std::vector<server::ClientRecordExport> ThroughFrames(
    const std::vector<server::ClientRecordExport>& records, size_t* frames) {
  SessionTable table = ToSessionTable(records);
  absl::StatusOr<std::vector<Sessions>> chunks = SplitSessions(std::move(table.sessions));
  EXPECT_TRUE(chunks.ok()) << chunks.status();
  if (!chunks.ok()) return {};
  HandOver ho;
  ho.generation = 2;
  ho.session_chunks = static_cast<uint32_t>(chunks->size());
  for (const server::ClientRecordExport& r : records) ho.client_ids.push_back(r.client_id);
  std::vector<server::ClientRecordExport> received;
  for (const Sessions& c : *chunks) {
    std::string f;
    const absl::Status s = EncodeHandoff(c, &f);
    EXPECT_TRUE(s.ok()) << s;
    EXPECT_LE(f.size(), kHandoffFrameHeaderSize + kMaxHandoffPayloadSize);
    absl::StatusOr<HandoffMessage> m = DecodeHandoff(AsBytes(f));
    EXPECT_TRUE(m.ok()) << m.status();
    if (!m.ok()) return {};
    for (server::ClientRecordExport& r : FromSessionRecords(std::get<Sessions>(*m).sessions)) {
      received.push_back(std::move(r));
    }
  }
  std::string f;
  EXPECT_TRUE(EncodeHandoff(ho, &f).ok());
  absl::StatusOr<HandoffMessage> m = DecodeHandoff(AsBytes(f));
  EXPECT_TRUE(m.ok()) << m.status();
  if (!m.ok()) return {};
  EXPECT_EQ(std::get<HandOver>(*m).client_ids, ho.client_ids);
  *frames = chunks->size() + 1;
  return received;
}

// --max_clients' and --max_client_records' 4096 ids with full windows of the
// default 1024 entries: ~76 MB of table, more than one frame may carry. One
// HandOver is refused (what made every upgrade of such a node roll back);
// the table crosses whole in several frames.
TEST(SessionTableSize, MaximumClientsWithFullWindowsCrossWhole) {
  const std::vector<server::ClientRecordExport> records = FullRecords(4096, 1024);
  HandOver single;
  single.generation = 2;
  single.sessions = ToSessionTable(records);
  std::string f;
  EXPECT_TRUE(absl::IsInvalidArgument(EncodeHandoff(single, &f))) << "the table should not fit";
  single = HandOver{};

  size_t frames = 0;
  const std::vector<server::ClientRecordExport> got = ThroughFrames(records, &frames);
  EXPECT_GT(frames, 2u);
  ExpectSameRecords(got, records);
}

// --dedupe_window's largest window, 2^20 entries, crosses whole: the newest
// answers (the ones a client may still retry) are there. Before, the table
// kept the OLDEST 65536 entries and lost every newer answer.
TEST(SessionTableSize, AFullMaximumWindowCrossesWhole) {
  const size_t window = size_t{1} << 20;
  const std::vector<server::ClientRecordExport> records = FullRecords(1, window);
  HandOver ho;
  ho.generation = 2;
  ho.sessions = ToSessionTable(records);
  std::string f;
  ASSERT_TRUE(EncodeHandoff(ho, &f).ok());
  absl::StatusOr<HandoffMessage> m = DecodeHandoff(AsBytes(f));
  ASSERT_TRUE(m.ok()) << m.status();
  const std::vector<server::ClientRecordExport> got =
      FromSessionRecords(std::get<HandOver>(*m).sessions.sessions);
  ASSERT_EQ(got.size(), 1u);
  const server::DedupeWindow w = server::DedupeWindow::Import(got[0].window, window);
  for (uint64_t seq : {uint64_t{1}, uint64_t{65536}, uint64_t{65537}, uint64_t{window}}) {
    const server::DedupeEntry* e = w.Find(seq);
    ASSERT_NE(e, nullptr) << "sequence " << seq << " lost";
    EXPECT_EQ(*e, records[0].window.entries[seq - 1]);
  }
}

// A window larger than the format (not reachable from the flags, but the
// conversion must stay safe): the newest entries cross and the floor rises
// over the rest, so their retries are refused as too old, never re-applied.
TEST(SessionTableSize, AnOversizeWindowKeepsTheNewestAndRaisesTheFloor) {
  const size_t extra = 10;
  const std::vector<server::ClientRecordExport> records = FullRecords(1, kMaxDedupeWindow + extra);
  const SessionTable t = ToSessionTable(records);
  ASSERT_EQ(t.sessions.size(), 1u);
  ASSERT_EQ(t.sessions[0].window.size(), kMaxDedupeWindow);
  EXPECT_EQ(t.sessions[0].highest_sequence, extra);  // sequences 1..10 forgotten
  const std::vector<server::ClientRecordExport> got = FromSessionRecords(t.sessions);
  const server::DedupeWindow w = server::DedupeWindow::Import(got[0].window, kMaxDedupeWindow);
  for (uint64_t seq = 1; seq <= extra; ++seq) EXPECT_TRUE(w.TooOld(seq)) << seq;
  const uint64_t newest = kMaxDedupeWindow + extra;
  ASSERT_NE(w.Find(newest), nullptr);
  EXPECT_EQ(*w.Find(newest), records[0].window.entries.back());
  ASSERT_NE(w.Find(extra + 1), nullptr);
}

TEST(SessionTableSize, SplitKeepsOrderAndEveryChunkUnderTheLimit) {
  std::vector<SessionRecord> records;
  for (uint64_t c = 1; c <= 50; ++c) {
    SessionRecord r{c, 0, {}};
    for (uint64_t i = 0; i < c % 7; ++i) r.window.push_back(DedupeEntry{i + 1, 2, 0, i});
    records.push_back(std::move(r));
  }
  const size_t limit = 200;
  absl::StatusOr<std::vector<Sessions>> chunks = SplitSessions(records, limit);
  ASSERT_TRUE(chunks.ok()) << chunks.status();
  std::vector<SessionRecord> back;
  for (const Sessions& c : *chunks) {
    ASSERT_FALSE(c.sessions.empty());
    std::string f;
    ASSERT_TRUE(EncodeHandoff(c, &f).ok());
    EXPECT_LE(f.size() - kHandoffFrameHeaderSize, limit);
    back.insert(back.end(), c.sessions.begin(), c.sessions.end());
  }
  EXPECT_EQ(back, records);
  EXPECT_TRUE(SplitSessions({}, limit)->empty());
  // A record alone over the limit: an error, not a frame the peer refuses.
  SessionRecord big{99, 0, std::vector<DedupeEntry>(20, DedupeEntry{1, 2, 0, 0})};
  EXPECT_TRUE(absl::IsInvalidArgument(SplitSessions({big}, limit).status()));
}

}  // namespace
}  // namespace kvnode::upgrade
