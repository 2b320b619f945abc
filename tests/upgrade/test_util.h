// Shared bits of the upgrade unit tests.
#ifndef KVNODE_TESTS_UPGRADE_TEST_UTIL_H_
#define KVNODE_TESTS_UPGRADE_TEST_UTIL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "kvnode/upgrade/messages.h"

namespace kvnode::upgrade::testing {

inline SessionTable SampleSessions(int clients, int window) {
  SessionTable t;
  t.next_client_id = static_cast<uint64_t>(clients) + 100;
  for (int c = 0; c < clients; ++c) {
    SessionRecord r;
    r.client_id = static_cast<uint64_t>(c) + 7;
    r.highest_sequence = static_cast<uint64_t>(window) * 3 + static_cast<uint64_t>(c);
    for (size_t i = 0; i < r.resume_secret.size(); ++i) {
      r.resume_secret[i] = static_cast<uint8_t>(c * 31 + i + 1);
    }
    for (int i = 0; i < window; ++i) {
      // Opcode PUT or DELETE, status OK, NOT_FOUND or REJECTED: what a
      // server records.
      r.window.push_back({static_cast<uint64_t>(i) * 3 + 1, static_cast<uint8_t>(2 + i % 2),
                          static_cast<uint8_t>(i % 3), 0x1000000000ULL + static_cast<uint64_t>(i)});
    }
    t.sessions.push_back(std::move(r));
  }
  return t;
}

inline CounterSnapshot SampleCounters() {
  return CounterSnapshot{{{"ops_put", 12345}, {"ops_get_rpc", 7}, {"bytes_in", ~uint64_t{0}}}};
}

// One of every message type with every field non-default.
inline std::vector<HandoffMessage> AllSampleMessages() {
  return {
      Hello{kHandoffProtocolVersion, 4242, 8, 0x3, "build-b"},
      Ready{0xabcdef, 0, 0x55aa55aa55aa55aaULL, 256ULL << 20, 1},
      HandOver{8,
               {FdRole::kListenTcp, FdRole::kAdminSocket},
               SampleSessions(3, 4),
               SampleCounters(),
               5,
               0x0102030405060708ULL,
               {3, 0x9e3779b97f4a7c15ULL, 1}},
      // A cluster member's (kCapClusterLease).
      HandOver{8, {FdRole::kListenTcp}, {}, {}, 0, 9, {4}, 0x694d8a1b2c3d4e5fLL},
      Owned{8, 4242},
      Gone{7, 1, CounterSnapshot{{{"ops_put", 3}}}},
      Abort{static_cast<uint32_t>(AbortCode::kIncompatible),
            "arena_layout_version: expected 1, found 2"},
      Sessions{SampleSessions(2, 3).sessions},
      Released{8},
      Adopted{2},
  };
}

}  // namespace kvnode::upgrade::testing

#endif  // KVNODE_TESTS_UPGRADE_TEST_UTIL_H_
