// kvnode_key_owner --slots N --ranges FIRST:NODE[,FIRST:NODE...] [FILE]
//
// Appends to each line of a kvload history (tools/include/kvnode/load/
// history.h; FILE or stdin) a TAB and the node that owns its key under the
// given map ranges (a map's "ranges" as written in etcd: each range runs
// from its first slot to the next range's). Comment and empty lines pass
// through unchanged. The cluster e2e scripts count failed operations per
// node with it: a node's loss may fail its own slots, never another's.
// Exit 1 on bad flags or an unreadable file.
#include <gflags/gflags.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "kvnode/proto/shard_map.h"

DEFINE_uint32(slots, kvnode::proto::kDefaultSlots, "the map's number of slots");
DEFINE_string(ranges, "", "the map's ranges: FIRST_SLOT:NODE,... in order");

namespace {

using Ranges = std::vector<std::pair<uint32_t, std::string>>;

bool ParseRanges(const std::string& text, Ranges* out) {
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    std::pair<absl::string_view, absl::string_view> kv = absl::StrSplit(part, ':');
    uint32_t first = 0;
    if (!absl::SimpleAtoi(kv.first, &first) || kv.second.empty()) return false;
    if (!out->empty() && first <= out->back().first) return false;
    out->emplace_back(first, std::string(kv.second));
  }
  return !out->empty() && out->front().first == 0;
}

const std::string& Owner(const Ranges& ranges, uint32_t slot) {
  auto it = std::upper_bound(ranges.begin(), ranges.end(), slot,
                             [](uint32_t s, const auto& r) { return s < r.first; });
  return std::prev(it)->second;
}

}  // namespace

int main(int argc, char** argv) {
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  Ranges ranges;
  if (FLAGS_slots == 0 || !ParseRanges(FLAGS_ranges, &ranges)) {
    std::fprintf(stderr, "kvnode_key_owner: --ranges '%s' is not FIRST:NODE,... from slot 0\n",
                 FLAGS_ranges.c_str());
    return 1;
  }
  std::ifstream file;
  if (argc > 1) {
    file.open(argv[1]);
    if (!file) {
      std::fprintf(stderr, "kvnode_key_owner: cannot read %s\n", argv[1]);
      return 1;
    }
  }
  std::istream& in = argc > 1 ? file : std::cin;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') {
      std::cout << line << '\n';
      continue;
    }
    std::vector<absl::string_view> f = absl::StrSplit(line, '\t');
    const std::string_view key = f.size() > 2 ? std::string_view(f[2].data(), f[2].size()) : "";
    std::cout << line << '\t' << Owner(ranges, kvnode::proto::SlotOf(key, FLAGS_slots)) << '\n';
  }
  return 0;
}
