#include "kvnode/fill/fill.h"

#include <span>
#include <string>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "kvnode/load/verify.h"
#include "kvnode/load/workload.h"
#include "kvnode/storage/bulk_load.h"

namespace kvnode::fill {

absl::Status FillOptions::Validate() const {
  if (db_path.empty()) return absl::InvalidArgumentError("--db_path is required");
  if (keys_per_file == 0) return absl::InvalidArgumentError("--keys_per_file must be at least 1");
  load::WorkloadOptions w;
  w.keys = keys;
  w.key_size = key_size;
  w.value_size = value_size;
  return w.Validate(/*verify_values=*/false);
}

absl::StatusOr<FillResult> FillDb(const FillOptions& options,
                                  const std::function<void(uint64_t keys_done)>& progress) {
  if (absl::Status s = options.Validate(); !s.ok()) return s;
  FillResult res;
  res.load_version = options.load_version != 0
                         ? options.load_version
                         : static_cast<uint64_t>(absl::ToUnixSeconds(absl::Now())) << 24;
  // FormatKey(i) is key_size bytes for every i < keys (Validate): key order is
  // index order, as bulk load requires.
  auto record = [&](uint64_t i, std::string* key, std::string* value) {
    *key = load::FormatKey(i, options.key_size);
    value->assign(options.value_size, '\0');  // short values: zero bytes, as kvload sends
    if (options.value_size >= load::kMinVerifiedValueSize) {
      load::EncodeVerifiedValue(*key, res.load_version, std::span<char>(*value));
    }
  };
  storage::BulkLoadOptions bo;
  bo.db_path = options.db_path;
  bo.records_per_file = options.keys_per_file;
  absl::StatusOr<storage::BulkLoadResult> r = storage::BulkLoad(bo, options.keys, record, progress);
  if (!r.ok()) return r.status();
  res.keys = r->records;
  res.files = r->files;
  res.sst_bytes = r->sst_bytes;
  res.first_version = r->first_version;
  res.last_version = r->last_version;
  res.generation_bumped = r->generation_bumped;
  return res;
}

}  // namespace kvnode::fill
