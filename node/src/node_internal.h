// Helpers shared by old_side.cc and new_side.cc: calls onto the server's
// control thread from the upgrade thread (with deadlines), conversions
// between the server's and the handoff's plain structs.
#ifndef KVNODE_UPGRADE_SRC_NODE_INTERNAL_H_
#define KVNODE_UPGRADE_SRC_NODE_INTERNAL_H_

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kvnode/server/dedupe.h"
#include "kvnode/server/server.h"
#include "kvnode/upgrade/messages.h"

namespace kvnode::upgrade {

absl::Status WithContext(const absl::Status& s, const std::string& what);
absl::Status UnexpectedMessage(const HandoffMessage& m, const char* expected);

// Runs f(server) on the control thread and waits for it (deadline).
absl::Status OnControl(server::Server* s, std::function<void(server::Server*)> f,
                       absl::Duration timeout);
// Runs f(server, done) on the control thread and waits until `done` ran.
absl::Status OnControlWithDone(server::Server* s,
                               std::function<void(server::Server*, std::function<void()>)> f,
                               absl::Duration timeout);
// Server::ExportSessions, waited for.
absl::StatusOr<server::RecordsExport> ExportSessionsBlocking(server::Server* s,
                                                             uint64_t changed_after, bool with_live,
                                                             absl::Duration timeout);

struct MoveResult {
  uint64_t sent = 0;
  uint64_t acked = 0;
};
// Sends Move to every ready client and waits until none is pending or the
// deadline passes.
MoveResult MoveClientsBlocking(server::Server* s, const std::string& endpoint,
                               uint64_t new_generation, absl::Duration deadline);

SessionTable ToSessionTable(const std::vector<server::ClientRecordExport>& records);
std::vector<server::ClientRecordExport> FromSessionRecords(const std::vector<SessionRecord>& t);
CounterSnapshot ToCounters(const std::vector<std::pair<std::string, uint64_t>>& v);
std::vector<std::pair<std::string, uint64_t>> FromCounters(const CounterSnapshot& c);

}  // namespace kvnode::upgrade

#endif  // KVNODE_UPGRADE_SRC_NODE_INTERNAL_H_
