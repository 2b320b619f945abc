// kvfill: bulk preload of a kvnode database, offline (see fill.h).
//
//   kvfill --db_path DIR --keys 1000000 --key_size 16 --value_size 64
//   kvnode --db_path DIR ...        (builds its arena from RocksDB at start)
//   kvload --keys 1000000 --key_size 16 --value_size 64 ...   (reads existing keys)
#include <gflags/gflags.h>

#include <cstdio>
#include <string>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "kvnode/fill/fill.h"

DEFINE_string(db_path, "", "the node's --db_path (no node may run on it); created if missing");
DEFINE_uint64(keys, 100000, "number of keys, indices 0 .. keys-1 (kvload --keys)");
DEFINE_uint64(key_size, 16, "bytes per key (kvload --key_size)");
DEFINE_uint64(value_size, 64, "bytes per value (kvload --value_size)");
DEFINE_uint64(load_version, 0,
              "version inside the verified values; 0 = (unix seconds now) << 24, below any "
              "later kvload run's versions");
DEFINE_uint64(keys_per_file, 262144, "keys per SST file (one progress line per file)");
DEFINE_bool(progress, true, "print a progress line per SST file to stderr");

int main(int argc, char** argv) {
  gflags::SetUsageMessage(
      "bulk preload of a kvnode database while no node runs on it.\n"
      "\n"
      "  kvfill --db_path DIR [--keys K] [--key_size S] [--value_size V]\n"
      "\n"
      "Writes into DIR (RocksDB) the records a node would hold after\n"
      "`kvload --preload --keys K --key_size S --value_size V`: kvload's keys (\"k\" + "
      "zero-padded\n"
      "index) with kvload's values (verified values, key + version under a checksum, when\n"
      "V >= 32; zero bytes otherwise), one store version each, and the store's last_version.\n"
      "The records go into SST files that RocksDB ingests (no memtable, no WAL), so 1e6 keys\n"
      "take seconds instead of a million network round trips. A node started on DIR builds\n"
      "its arena from RocksDB (as after a restart); an arena an earlier node left clean is\n"
      "made stale (the generation is bumped) so it is rebuilt, not re-attached.\n"
      "DIR's data must be empty; a node holding DIR makes kvfill fail (RocksDB's lock).\n"
      "kvload --verify on the filled node judges the values correctly (their version is\n"
      "below its own); kvload --audit needs an ack log, which kvfill does not write.");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  if (argc > 1) {
    std::fprintf(stderr, "kvfill: unexpected argument '%s' (see --help)\n", argv[1]);
    return 2;
  }
  kvnode::fill::FillOptions o;
  o.db_path = FLAGS_db_path;
  o.keys = FLAGS_keys;
  o.key_size = FLAGS_key_size;
  o.value_size = FLAGS_value_size;
  o.load_version = FLAGS_load_version;
  o.keys_per_file = FLAGS_keys_per_file;
  if (absl::Status s = o.Validate(); !s.ok()) {
    std::fprintf(stderr, "kvfill: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  const absl::Time t0 = absl::Now();
  auto progress = [&](uint64_t done) {
    if (!FLAGS_progress) return;
    const double s = absl::ToDoubleSeconds(absl::Now() - t0);
    std::fprintf(stderr, "kvfill: %llu / %llu keys written (%.1f s, %.0f keys/s)\n",
                 static_cast<unsigned long long>(done), static_cast<unsigned long long>(o.keys), s,
                 s > 0 ? static_cast<double>(done) / s : 0.0);
  };
  absl::StatusOr<kvnode::fill::FillResult> r = kvnode::fill::FillDb(o, progress);
  if (!r.ok()) {
    std::fprintf(stderr, "kvfill: %s\n", r.status().ToString().c_str());
    return 1;
  }
  std::printf(
      "kvfill: %llu keys (%llu B keys, %llu B values) into %s in %.2f s: %llu SST files, %llu "
      "bytes; store versions %llu..%llu, value version %llu%s\n",
      static_cast<unsigned long long>(r->keys), static_cast<unsigned long long>(o.key_size),
      static_cast<unsigned long long>(o.value_size), o.db_path.c_str(),
      absl::ToDoubleSeconds(absl::Now() - t0), static_cast<unsigned long long>(r->files),
      static_cast<unsigned long long>(r->sst_bytes),
      static_cast<unsigned long long>(r->first_version),
      static_cast<unsigned long long>(r->last_version),
      static_cast<unsigned long long>(r->load_version),
      r->generation_bumped ? "; generation bumped (a clean arena will be rebuilt)" : "");
  return 0;
}
