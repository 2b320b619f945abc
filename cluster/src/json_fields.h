// Reading the fields of a JSON object that etcd held (a member, a roll
// plan), with the reason of the first one that is wrong. Private to
// cluster/.
//
// Thread safety: a value used on one thread.
#ifndef KVNODE_CLUSTER_SRC_JSON_FIELDS_H_
#define KVNODE_CLUSTER_SRC_JSON_FIELDS_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kvnode/base/errno.h"
#include "nlohmann/json.hpp"

namespace kvnode::cluster {

struct JsonFields {
  const nlohmann::json& obj;
  std::string_view what;  // "member at" / "roll plan at"
  std::string_view key;   // the etcd key the value came from
  size_t max_string;      // longest string field accepted

  // InvalidArgument "<what> <key>: <why>".
  absl::Status Bad(std::string_view why) const {
    return absl::InvalidArgumentError(
        absl::StrCat(base::Av(what), " ", base::Av(key), ": ", base::Av(why)));
  }
  absl::Status String(const char* name, std::string* out) const {
    auto it = obj.find(name);
    if (it == obj.end() || !it->is_string()) {
      return Bad(absl::StrCat("field '", name, "' must be a string"));
    }
    *out = it->get<std::string>();
    if (out->size() > max_string) {
      return Bad(absl::StrCat("field '", name, "' is longer than ", max_string));
    }
    return absl::OkStatus();
  }
  absl::Status Uint(const char* name, uint64_t* out) const {
    auto it = obj.find(name);
    if (it == obj.end() || !it->is_number_unsigned()) {
      return Bad(absl::StrCat("field '", name, "' must be a non-negative integer"));
    }
    *out = it->get<uint64_t>();
    return absl::OkStatus();
  }
  // The same reader over a nested object.
  JsonFields Nested(const nlohmann::json& inner) const {
    return JsonFields{inner, what, key, max_string};
  }
};

}  // namespace kvnode::cluster

#endif  // KVNODE_CLUSTER_SRC_JSON_FIELDS_H_
