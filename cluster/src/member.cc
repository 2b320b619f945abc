#include "kvnode/cluster/member.h"

namespace kvnode::cluster {

std::string_view MemberStateName(MemberState) { return "starting"; }
std::optional<MemberState> ParseMemberState(std::string_view) { return std::nullopt; }
std::string EncodeMemberJson(const Member&) { return {}; }
absl::StatusOr<Member> DecodeMemberJson(std::string_view, std::string_view, std::string_view) {
  return absl::UnimplementedError("member json");
}
proto::ShardMap Assemble(const proto::ShardMap& stored, const std::vector<Member>&) {
  return stored;
}

}  // namespace kvnode::cluster
