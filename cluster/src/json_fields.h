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
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "kvnode/base/errno.h"
#include "nlohmann/json.hpp"

namespace kvnode::cluster {

// InvalidArgument "<what> <key>: <why>".
inline absl::Status JsonBad(std::string_view what, std::string_view key, std::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrCat(base::Av(what), " ", base::Av(key), ": ", base::Av(why)));
}

// `text` parsed as one JSON object: refused, with JsonBad's reason, above
// `max_size` bytes (unread), when it is not JSON, or not an object.
inline absl::StatusOr<nlohmann::json> ParseJsonObject(std::string_view text, size_t max_size,
                                                      std::string_view what, std::string_view key) {
  if (text.size() > max_size) {
    return JsonBad(what, key, absl::StrCat(text.size(), " bytes, above the limit of ", max_size));
  }
  nlohmann::json obj =
      nlohmann::json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (obj.is_discarded()) return JsonBad(what, key, "not valid JSON");
  if (!obj.is_object()) return JsonBad(what, key, "not a JSON object");
  return obj;
}

struct JsonFields {
  const nlohmann::json& obj;
  std::string_view what;  // "member at" / "roll plan at"
  std::string_view key;   // the etcd key the value came from
  size_t max_string;      // longest string field accepted

  absl::Status Bad(std::string_view why) const { return JsonBad(what, key, why); }
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
