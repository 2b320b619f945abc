#include "kvnode/cluster/identity.h"

#include <sys/random.h>

#include <cerrno>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "file_io.h"
#include "kvnode/base/errno.h"

namespace kvnode::cluster {
namespace {

using base::Av;

constexpr size_t kMaxIdentityFileSize = 4096;
// The encoded map of the largest map proto/shard_map.h allows, with margin.
constexpr size_t kMaxMapFileSize = 1 << 20;

bool IsInstanceId(std::string_view s) {
  if (s.size() != 32) return false;
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

std::string Describe(const Identity& id) {
  return absl::StrCat("node '", id.node_id, "' of cluster '", id.cluster, "'");
}

}  // namespace

absl::StatusOr<std::string> NewInstanceId() {
  uint8_t bytes[16];
  size_t got = 0;
  while (got < sizeof(bytes)) {
    ssize_t n = ::getrandom(bytes + got, sizeof(bytes) - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return base::ErrnoStatus(errno, "getrandom for the cluster instance id");
    got += static_cast<size_t>(n);
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (uint8_t b : bytes) {
    out.push_back(kHex[b >> 4]);
    out.push_back(kHex[b & 15]);
  }
  return out;
}

std::string EncodeIdentity(const Identity& id) {
  return absl::StrCat("cluster=", id.cluster, "\nnode_id=", id.node_id, "\ninstance=", id.instance,
                      "\n");
}

absl::StatusOr<Identity> DecodeIdentity(std::string_view text, std::string_view path) {
  auto bad = [&](std::string_view what) {
    return absl::DataLossError(absl::StrCat(Av(path), ": ", Av(what)));
  };
  Identity id;
  for (absl::string_view line : absl::StrSplit(Av(text), '\n', absl::SkipEmpty())) {
    std::pair<std::string, std::string> kv = absl::StrSplit(line, absl::MaxSplits('=', 1));
    std::string* field = kv.first == "cluster"    ? &id.cluster
                         : kv.first == "node_id"  ? &id.node_id
                         : kv.first == "instance" ? &id.instance
                                                  : nullptr;
    if (field == nullptr) return bad(absl::StrCat("unknown line '", line, "'"));
    if (!field->empty()) return bad(absl::StrCat("'", kv.first, "' given twice"));
    *field = kv.second;
  }
  if (auto s = proto::CheckName(id.cluster, proto::kMaxClusterNameSize, "cluster"); !s.ok()) {
    return bad(std::string(s.message()));
  }
  if (auto s = proto::CheckName(id.node_id, proto::kMaxNodeIdSize, "node_id"); !s.ok()) {
    return bad(std::string(s.message()));
  }
  if (!IsInstanceId(id.instance)) return bad("instance is not 32 lowercase hex digits");
  return id;
}

absl::StatusOr<std::optional<Identity>> LoadIdentity(const std::string& db_path) {
  const std::string path = absl::StrCat(db_path, "/", kIdentityFileName);
  auto text = ReadSmallFile(path, kMaxIdentityFileSize);
  if (!text.ok()) return text.status();
  if (!text->has_value()) return std::nullopt;
  auto id = DecodeIdentity(**text, path);
  if (!id.ok()) return id.status();
  return *id;
}

absl::Status StoreIdentity(const std::string& db_path, const Identity& id) {
  return WriteFileAtomically(db_path, kIdentityFileName, EncodeIdentity(id));
}

absl::StatusOr<Identity> LoadOrCreateIdentity(const std::string& db_path, std::string_view cluster,
                                              std::string_view node_id) {
  auto loaded = LoadIdentity(db_path);
  if (!loaded.ok()) return loaded.status();
  if (loaded->has_value()) {
    const Identity& have = **loaded;
    if (have.cluster == cluster && (node_id.empty() || have.node_id == node_id)) return have;
    Identity asked{std::string(cluster), node_id.empty() ? have.node_id : std::string(node_id), ""};
    return absl::FailedPreconditionError(absl::StrCat("database at ", db_path, " belongs to ",
                                                      Describe(have), ", not ", Describe(asked)));
  }
  if (auto s = proto::CheckName(cluster, proto::kMaxClusterNameSize, "--cluster"); !s.ok())
    return s;
  if (node_id.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("--node_id is required: the database at ",
                                                   db_path, " has no cluster identity yet"));
  }
  if (auto s = proto::CheckName(node_id, proto::kMaxNodeIdSize, "--node_id"); !s.ok()) return s;
  auto instance = NewInstanceId();
  if (!instance.ok()) return instance.status();
  Identity id{std::string(cluster), std::string(node_id), *instance};
  if (auto s = StoreIdentity(db_path, id); !s.ok()) return s;
  return id;
}

absl::StatusOr<std::optional<proto::ShardMap>> LoadMap(const std::string& db_path,
                                                       std::string_view cluster) {
  const std::string path = absl::StrCat(db_path, "/", kMapFileName);
  auto bytes = ReadSmallFile(path, kMaxMapFileSize);
  if (!bytes.ok()) return bytes.status();
  if (!bytes->has_value()) return std::nullopt;
  auto map = proto::DecodeShardMap(**bytes);
  if (!map.ok()) return absl::DataLossError(absl::StrCat(path, ": ", map.status().message()));
  if (map->cluster != cluster) {
    return absl::FailedPreconditionError(absl::StrCat(path, " holds a map of cluster '",
                                                      map->cluster, "', not '", Av(cluster), "'"));
  }
  return *map;
}

absl::Status StoreMap(const std::string& db_path, const proto::ShardMap& map) {
  std::string bytes;
  if (auto s = proto::EncodeShardMap(map, &bytes); !s.ok()) return s;
  return WriteFileAtomically(db_path, kMapFileName, bytes);
}

}  // namespace kvnode::cluster
