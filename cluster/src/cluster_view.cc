#include "cluster_view.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"
#include "kvnode/cluster/keys.h"
#include "kvnode/cluster/map_json.h"

namespace kvnode::cluster {

template <typename Plan>
void WatchedPlan<Plan>::Apply(const KeyValue& kv, bool deleted) {
  std::optional<Plan> plan;
  if (!deleted) {
    absl::StatusOr<Plan> decoded = decode_(kv.value, kv.key);
    if (decoded.ok()) {
      plan = std::move(*decoded);
    } else {
      LOG(WARNING) << decoded.status().message() << "; no " << what_ << " is acted on";
    }
  }
  if (plan == value_) return;
  value_ = std::move(plan);
  changed_ = true;
}

template class WatchedPlan<RollPlan>;
template class WatchedPlan<MigrationPlan>;

ClusterView::ClusterView(std::string cluster)
    : cluster_(std::move(cluster)),
      map_key_(MapKey(cluster_)),
      roll_(RollKey(cluster_), &DecodeRollJson, "roll"),
      migration_(MigrationKey(cluster_), &DecodeMigrationJson, "migration") {}

std::optional<proto::ShardMap> ClusterView::Apply(const WatchUpdate& update) {
  if (update.resync) {
    // Whatever is not in the snapshot is gone; the last good map stays until
    // the snapshot says otherwise (invariant 1).
    members_.clear();
    bad_members_.clear();
    bool map_seen = false, roll_seen = false, migration_seen = false;
    for (const KeyValue& kv : update.snapshot) {
      map_seen |= kv.key == map_key_;
      roll_seen |= kv.key == roll_.key();
      migration_seen |= kv.key == migration_.key();
      ApplyKv(kv, /*deleted=*/false);
    }
    if (!map_seen) ApplyMap(KeyValue{}, /*deleted=*/true);
    if (!roll_seen) roll_.Apply(KeyValue{}, /*deleted=*/true);
    if (!migration_seen) migration_.Apply(KeyValue{}, /*deleted=*/true);
  }
  for (const WatchEvent& ev : update.events) ApplyKv(ev.kv, ev.type == WatchEvent::Type::kDelete);
  revision_ = std::max(revision_, update.revision);
  if (!map_) return std::nullopt;
  std::vector<Member> live;
  for (const auto& [id, m] : members_) live.push_back(m);
  proto::ShardMap assembled = Assemble(*map_, live);
  // Delivered only when what it says changed; stamped with the revision it
  // was read at, which orders it among the maps other nodes send of this
  // epoch (proto::Newer).
  if (assembled_) {
    assembled.members_revision = assembled_->members_revision;
    if (*assembled_ == assembled) return std::nullopt;
  }
  assembled.members_revision = static_cast<uint64_t>(std::max<int64_t>(revision_, 0));
  assembled_ = assembled;
  return assembled;
}

void ClusterView::ApplyKv(const KeyValue& kv, bool deleted) {
  if (kv.key == map_key_) return ApplyMap(kv, deleted);
  if (kv.key == roll_.key()) return roll_.Apply(kv, deleted);
  if (kv.key == migration_.key()) return migration_.Apply(kv, deleted);
  std::optional<std::string> id = NodeIdOfMemberKey(cluster_, kv.key);
  if (!id) return;  // another key of the cluster (a driver's lock): not ours
  members_.erase(*id);
  bad_members_.erase(kv.key);
  if (deleted) return;
  auto m = DecodeMemberJson(kv.value, kv.key, *id);
  if (!m.ok()) {
    LOG(WARNING) << "cluster " << cluster_ << ": " << m.status().message()
                 << "; the node counts as not alive";
    bad_members_[kv.key] = std::string(m.status().message());
    return;
  }
  members_[*id] = std::move(*m);
}

void ClusterView::ApplyMap(const KeyValue& kv, bool deleted) {
  if (deleted) {
    if (map_) {
      map_error_ = absl::StrCat("key ", map_key_, " was deleted; serving the last good map");
      ++map_errors_;
      LOG(WARNING) << "cluster " << cluster_ << ": " << map_error_;
    }
    return;
  }
  auto decoded = DecodeMapJson(kv.value, cluster_);
  if (!decoded.ok()) {
    map_error_ = absl::StrCat("key ", map_key_, ": ", decoded.status().message(),
                              map_ ? "; serving the last good map" : "; no map yet");
    ++map_errors_;
    LOG(WARNING) << "cluster " << cluster_ << ": " << map_error_;
    return;
  }
  map_ = std::move(*decoded);
  map_error_.clear();
}

const Member* ClusterView::member(const std::string& node_id) const {
  auto it = members_.find(node_id);
  return it == members_.end() ? nullptr : &it->second;
}

std::string ClusterView::member_error() const {
  return bad_members_.empty() ? "" : bad_members_.rbegin()->second;
}

}  // namespace kvnode::cluster
