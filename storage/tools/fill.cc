#include "fill.h"

#include <unistd.h>

#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <system_error>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "db_layout.h"
#include "kvnode/client/load/verify.h"
#include "kvnode/client/load/workload.h"
#include "kvnode/storage/format.h"
#include "rocksdb/db.h"
#include "rocksdb/options.h"
#include "rocksdb/sst_file_writer.h"

namespace kvnode::storage {
namespace {

using dblayout::FromRocks;
using dblayout::kGenerationKey;
using dblayout::kLastVersionKey;
using dblayout::kVersionPrefix;
using dblayout::U64;

// Reads a u64 meta record; 0 when absent.
absl::StatusOr<uint64_t> ReadMeta(rocksdb::DB* db, rocksdb::ColumnFamilyHandle* cf, const char* key,
                                  bool* present) {
  std::string v;
  rocksdb::Status s = db->Get(rocksdb::ReadOptions(), cf, key, &v);
  *present = false;
  if (s.IsNotFound()) return 0;
  if (!s.ok()) return FromRocks(s, absl::StrCat("read ", key));
  if (v.size() != 8) {
    return absl::DataLossError(absl::StrCat("meta record ", key, " has ", v.size(), " bytes"));
  }
  *present = true;
  return LoadU64(v.data());
}

struct Db {
  rocksdb::DB* db = nullptr;
  std::vector<rocksdb::ColumnFamilyHandle*> cfs;  // data, meta
  ~Db() {
    if (db == nullptr) return;
    for (rocksdb::ColumnFamilyHandle* h : cfs) (void)db->DestroyColumnFamilyHandle(h);
    (void)db->Close();
    delete db;
  }
};

}  // namespace

absl::Status FillOptions::Validate() const {
  if (db_path.empty()) return absl::InvalidArgumentError("--db_path is required");
  if (keys_per_file == 0) return absl::InvalidArgumentError("--keys_per_file must be at least 1");
  client::load::WorkloadOptions w;
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

  // The node opens its database with these column families and default
  // column family options (store.cc); the SST files are built for them.
  rocksdb::DBOptions dbo;
  dbo.create_if_missing = true;
  dbo.create_missing_column_families = true;
  const std::vector<rocksdb::ColumnFamilyDescriptor> descs = dblayout::ColumnFamilies();
  Db d;
  if (absl::Status s = FromRocks(rocksdb::DB::Open(dbo, options.db_path, descs, &d.cfs, &d.db),
                                 absl::StrCat("open database ", options.db_path));
      !s.ok()) {
    if (absl::IsUnavailable(s)) {
      return absl::UnavailableError(absl::StrCat(s.message(), " (is a node running on it?)"));
    }
    return s;
  }
  {
    std::unique_ptr<rocksdb::Iterator> it(d.db->NewIterator(rocksdb::ReadOptions(), d.cfs[0]));
    it->SeekToFirst();
    if (!it->status().ok()) return FromRocks(it->status(), "read database");
    if (it->Valid()) {
      return absl::FailedPreconditionError(
          absl::StrCat("database ", options.db_path, " already holds keys (e.g. '",
                       it->key().ToString(), "'): kvfill only fills an empty one"));
    }
  }
  bool has_last = false, has_gen = false;
  absl::StatusOr<uint64_t> base = ReadMeta(d.db, d.cfs[1], kLastVersionKey, &has_last);
  if (!base.ok()) return base.status();
  absl::StatusOr<uint64_t> gen = ReadMeta(d.db, d.cfs[1], kGenerationKey, &has_gen);
  if (!gen.ok()) return gen.status();

  // SST files next to the database (same file system: ingestion links them).
  const std::filesystem::path tmp =
      std::filesystem::path(options.db_path).lexically_normal().string() + ".kvfill-tmp-" +
      std::to_string(getpid());
  std::error_code ec;
  std::filesystem::create_directories(tmp, ec);
  if (ec) {
    return absl::InternalError(absl::StrCat("create ", tmp.string(), ": ", ec.message()));
  }
  struct RemoveTmp {
    std::filesystem::path p;
    ~RemoveTmp() {
      std::error_code e;
      std::filesystem::remove_all(p, e);
    }
  } remove_tmp{tmp};

  rocksdb::Options sst_options(dbo, descs[0].options);
  std::vector<std::string> files;
  std::string record(kVersionPrefix + options.value_size, '\0');
  const std::span<char> value(record.data() + kVersionPrefix, options.value_size);
  res.first_version = *base + 1;
  for (uint64_t first = 0; first < options.keys; first += options.keys_per_file) {
    const uint64_t end = std::min(options.keys, first + options.keys_per_file);
    const std::string path = (tmp / absl::StrCat("fill-", files.size(), ".sst")).string();
    rocksdb::SstFileWriter w(rocksdb::EnvOptions(), sst_options, d.cfs[0]);
    if (absl::Status s = FromRocks(w.Open(path), absl::StrCat("create ", path)); !s.ok()) return s;
    // FormatKey(i) is key_size bytes for every i < keys (Validate): key
    // order is index order, as SstFileWriter requires.
    for (uint64_t i = first; i < end; ++i) {
      const std::string key = client::load::FormatKey(i, options.key_size);
      StoreU64(record.data(), *base + i + 1);
      if (options.value_size >= client::load::kMinVerifiedValueSize) {
        client::load::EncodeVerifiedValue(key, res.load_version, value);
      }  // else: zero bytes, as kvload sends
      if (absl::Status s = FromRocks(w.Put(key, record), absl::StrCat("write ", path)); !s.ok()) {
        return s;
      }
    }
    rocksdb::ExternalSstFileInfo info;
    if (absl::Status s = FromRocks(w.Finish(&info), absl::StrCat("finish ", path)); !s.ok()) {
      return s;
    }
    res.sst_bytes += info.file_size;
    files.push_back(path);
    if (progress) progress(end);
  }
  rocksdb::IngestExternalFileOptions io;
  io.move_files = true;
  if (absl::Status s = FromRocks(d.db->IngestExternalFile(d.cfs[0], files, io),
                                 absl::StrCat("ingest into ", options.db_path));
      !s.ok()) {
    return s;
  }
  res.files = files.size();
  res.keys = options.keys;
  res.last_version = *base + options.keys;
  rocksdb::WriteBatch meta;
  if (absl::Status s = FromRocks(meta.Put(d.cfs[1], kLastVersionKey, U64(res.last_version)),
                                 "batch last_version");
      !s.ok()) {
    return s;
  }
  if (has_gen) {
    if (absl::Status s =
            FromRocks(meta.Put(d.cfs[1], kGenerationKey, U64(*gen + 1)), "batch generation");
        !s.ok()) {
      return s;
    }
    res.generation_bumped = true;
  }
  rocksdb::WriteOptions wo;
  wo.sync = true;
  if (absl::Status s = FromRocks(d.db->Write(wo, &meta), "write meta records"); !s.ok()) return s;
  return res;
}

}  // namespace kvnode::storage
