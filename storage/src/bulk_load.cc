#include "kvnode/storage/bulk_load.h"

#include <unistd.h>

#include <filesystem>
#include <memory>
#include <string>
#include <system_error>
#include <vector>

#include "absl/strings/str_cat.h"
#include "db_layout.h"
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

// Opens the database with the node's column families (store.cc) and checks
// that its data column family is empty.
absl::Status OpenEmpty(const std::string& path, Db* d) {
  rocksdb::DBOptions dbo = dblayout::DbOptions();
  dbo.create_if_missing = true;
  dbo.create_missing_column_families = true;
  if (absl::Status s =
          FromRocks(rocksdb::DB::Open(dbo, path, dblayout::ColumnFamilies(), &d->cfs, &d->db),
                    absl::StrCat("open database ", path));
      !s.ok()) {
    if (absl::IsUnavailable(s)) {
      return absl::UnavailableError(absl::StrCat(s.message(), " (is a node running on it?)"));
    }
    return s;
  }
  std::unique_ptr<rocksdb::Iterator> it(d->db->NewIterator(rocksdb::ReadOptions(), d->cfs[0]));
  it->SeekToFirst();
  if (!it->status().ok()) return FromRocks(it->status(), "read database");
  if (it->Valid()) {
    return absl::FailedPreconditionError(
        absl::StrCat("database ", path, " already holds keys (e.g. '", it->key().ToString(),
                     "'): bulk load only fills an empty one"));
  }
  return absl::OkStatus();
}

// A directory removed with everything in it when this goes out of scope.
struct TempDir {
  std::filesystem::path p;
  ~TempDir() {
    std::error_code e;
    std::filesystem::remove_all(p, e);
  }
};

}  // namespace

absl::Status BulkLoadOptions::Validate() const {
  if (db_path.empty()) return absl::InvalidArgumentError("--db_path is required");
  if (records_per_file == 0) {
    return absl::InvalidArgumentError("--keys_per_file must be at least 1");
  }
  return absl::OkStatus();
}

absl::StatusOr<BulkLoadResult> BulkLoad(const BulkLoadOptions& options, uint64_t count,
                                        const BulkRecordFn& record,
                                        const std::function<void(uint64_t)>& progress) {
  if (absl::Status s = options.Validate(); !s.ok()) return s;
  Db d;
  if (absl::Status s = OpenEmpty(options.db_path, &d); !s.ok()) return s;
  bool has_last = false, has_gen = false;
  absl::StatusOr<uint64_t> base = ReadMeta(d.db, d.cfs[1], kLastVersionKey, &has_last);
  if (!base.ok()) return base.status();
  absl::StatusOr<uint64_t> gen = ReadMeta(d.db, d.cfs[1], kGenerationKey, &has_gen);
  if (!gen.ok()) return gen.status();

  // SST files next to the database (same file system: ingestion links them).
  const TempDir tmp{std::filesystem::path(options.db_path).lexically_normal().string() +
                    ".bulk-load-tmp-" + std::to_string(getpid())};
  std::error_code ec;
  std::filesystem::create_directories(tmp.p, ec);
  if (ec) return absl::InternalError(absl::StrCat("create ", tmp.p.string(), ": ", ec.message()));

  BulkLoadResult res;
  // The SST files are built for the column family options the node opens with.
  const rocksdb::Options sst_options(rocksdb::DBOptions(), dblayout::ColumnFamilies()[0].options);
  std::vector<std::string> files;
  std::string key, value, stored;
  res.first_version = *base + 1;
  for (uint64_t first = 0; first < count; first += options.records_per_file) {
    const uint64_t end = std::min(count, first + options.records_per_file);
    const std::string path = (tmp.p / absl::StrCat("bulk-", files.size(), ".sst")).string();
    rocksdb::SstFileWriter w(rocksdb::EnvOptions(), sst_options, d.cfs[0]);
    if (absl::Status s = FromRocks(w.Open(path), absl::StrCat("create ", path)); !s.ok()) return s;
    for (uint64_t i = first; i < end; ++i) {
      record(i, &key, &value);
      stored.resize(kVersionPrefix);
      StoreU64(stored.data(), *base + i + 1);
      stored.append(value);
      // SstFileWriter refuses a key out of order (InvalidArgument).
      if (absl::Status s =
              FromRocks(w.Put(key, stored), absl::StrCat("write ", path, " record ", i));
          !s.ok()) {
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
  if (!files.empty()) {
    if (absl::Status s = FromRocks(d.db->IngestExternalFile(d.cfs[0], files, io),
                                   absl::StrCat("ingest into ", options.db_path));
        !s.ok()) {
      return s;
    }
  }
  res.files = files.size();
  res.records = count;
  res.last_version = *base + count;
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
