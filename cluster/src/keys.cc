#include "kvnode/cluster/keys.h"

#include "absl/strings/str_cat.h"
#include "kvnode/base/errno.h"

namespace kvnode::cluster {

using base::Av;

std::string ClusterPrefix(std::string_view cluster) {
  return absl::StrCat("/kvnode/", Av(cluster), "/");
}

std::string MapKey(std::string_view cluster) { return absl::StrCat(ClusterPrefix(cluster), "map"); }

std::string MembersPrefix(std::string_view cluster) {
  return absl::StrCat(ClusterPrefix(cluster), "nodes/");
}

std::string MemberKey(std::string_view cluster, std::string_view node_id) {
  return absl::StrCat(MembersPrefix(cluster), Av(node_id));
}

std::string InstanceKey(std::string_view cluster, std::string_view node_id) {
  return absl::StrCat(ClusterPrefix(cluster), "instances/", Av(node_id));
}

std::string RollKey(std::string_view cluster) {
  return absl::StrCat(ClusterPrefix(cluster), "roll");
}

std::string RollLockKey(std::string_view cluster) {
  return absl::StrCat(ClusterPrefix(cluster), "roll-lock");
}

std::string MigrationKey(std::string_view cluster) {
  return absl::StrCat(ClusterPrefix(cluster), "migration");
}

std::string MigrationLockKey(std::string_view cluster) {
  return absl::StrCat(ClusterPrefix(cluster), "migration-lock");
}

std::optional<std::string> NodeIdOfMemberKey(std::string_view cluster, std::string_view key) {
  const std::string prefix = MembersPrefix(cluster);
  if (key.size() <= prefix.size() || key.substr(0, prefix.size()) != prefix) return std::nullopt;
  std::string_view id = key.substr(prefix.size());
  if (id.find('/') != std::string_view::npos) return std::nullopt;
  return std::string(id);
}

std::string PrefixRangeEnd(std::string_view prefix) {
  std::string end(prefix);
  // Drop trailing 0xff bytes (they cannot be incremented), then bump the last.
  while (!end.empty() && static_cast<unsigned char>(end.back()) == 0xff) end.pop_back();
  if (end.empty()) return std::string(1, '\0');
  end.back() = static_cast<char>(static_cast<unsigned char>(end.back()) + 1);
  return end;
}

}  // namespace kvnode::cluster
