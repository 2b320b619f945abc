// The commit point of one slot move (docs/cluster.md, "One move", step 5):
// the move's target writes it once the source has frozen the slots and it
// holds their last writes durably.
//
// Contracts:
//  1. One etcd transaction compares the plan's and the map's mod_revisions
//     (as read here) and puts both: the map after ApplyMove with epoch + 1,
//     and the plan with the move `done`. Either both change or neither.
//  2. It commits only a move that is `copying` at `attempt`, in a plan of
//     `migration_id` whose state is `running`. A driver's CAS that marks
//     the move failed or aborted, or a later attempt, changes the plan's
//     mod_revision, so exactly one of that CAS and this commit wins.
//  3. kError means etcd's answer did not come: the transaction may have
//     landed. The caller re-reads the plan before deciding anything: the
//     move `done` at its attempt is a commit.
//
// Thread safety: a free function; the EtcdClient may be shared.
#ifndef KVNODE_CLUSTER_MIGRATION_COMMIT_H_
#define KVNODE_CLUSTER_MIGRATION_COMMIT_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "kvnode/cluster/etcd_client.h"
#include "kvnode/proto/shard_map.h"

namespace kvnode::cluster {

enum class CommitResult {
  kCommitted,  // the map gives the slots to the target; the move is done
  kLost,       // the plan or the map is not what the commit needs (message):
               // re-read; the attempt has ended without this commit
  kError,      // etcd did not answer, or a value does not decode (message):
               // the outcome may be unknown, re-read before deciding
};

struct CommitOutcome {
  CommitResult result = CommitResult::kError;
  std::string message;   // kLost / kError: why
  proto::ShardMap map;   // kCommitted: the map stored (its epoch raised)
  int64_t revision = 0;  // kCommitted: etcd's revision of the commit
};

// What the target copied in the attempt it commits: the move's final
// `keys` and `bytes` in the plan.
struct MoveCounts {
  uint64_t keys = 0;
  uint64_t bytes = 0;
};

// Commits the move of the plan at MigrationKey(cluster) that starts at
// `first_slot`, at `attempt` (contracts above).
CommitOutcome CommitMove(EtcdClient& etcd, std::string_view cluster, std::string_view migration_id,
                         uint32_t first_slot, uint64_t attempt, const MoveCounts& counts = {});

}  // namespace kvnode::cluster

#endif  // KVNODE_CLUSTER_MIGRATION_COMMIT_H_
