// The session table on its way from O to N: the server's dedupe records
// (ClientRecordExport) -> ToSessionTable -> HandOver frame -> FromSessionTable
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
  ExpectSameRecords(FromSessionTable(std::get<HandOver>(*m).sessions), records);
}

// What failed before the opcode travelled: N imported entries with opcode 0,
// persisted them with its next write of that client, and its next cold start
// refused the record (and deleted it), so a retry was applied a second time.
TEST(SessionTable, WhatNImportsItCanPersistAndReloadAfterACrash) {
  const std::vector<server::ClientRecordExport> imported =
      FromSessionTable(ToSessionTable(SampleRecords()));
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
  // Layout: u64 next, u32 n, u64 id, u64 floor, u32 w, u64 sequence, u8 opcode.
  const size_t opcode_at = 8 + 4 + 8 + 8 + 4 + 8;
  ASSERT_EQ(b[opcode_at], static_cast<char>(Opcode::kPut));
  b[opcode_at] = 0;
  EXPECT_TRUE(absl::IsInvalidArgument(DecodeSessionTable(AsBytes(b)).status()));
}

}  // namespace
}  // namespace kvnode::upgrade
