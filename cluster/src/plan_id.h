// The id of a fleet roll's or a slot migration's plan: the prefix, the UTC
// time it was made to the second and 16 random bits ("r-20261207T132233-4f2a"),
// so ids sort by time and two made in one second differ. Private to cluster/.
#ifndef KVNODE_CLUSTER_SRC_PLAN_ID_H_
#define KVNODE_CLUSTER_SRC_PLAN_ID_H_

#include <ctime>
#include <random>
#include <string>
#include <string_view>

#include "absl/strings/str_format.h"

namespace kvnode::cluster {

inline std::string NewPlanId(std::string_view prefix) {
  std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char when[32];
  std::strftime(when, sizeof when, "%Y%m%dT%H%M%S", &tm);
  std::random_device rd;
  return absl::StrFormat("%s-%s-%04x", prefix, when, rd() & 0xffff);
}

}  // namespace kvnode::cluster

#endif  // KVNODE_CLUSTER_SRC_PLAN_ID_H_
