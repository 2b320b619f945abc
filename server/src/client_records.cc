#include "kvnode/server/client_records.h"

#include <algorithm>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"

namespace kvnode::server {
namespace {

// Eviction order: idle since earlier; at the same instant (records imported
// together), the one stamped first.
bool IdleLonger(const ClientRecord& a, const ClientRecord& b) {
  if (a.last_active_ns != b.last_active_ns) return a.last_active_ns < b.last_active_ns;
  return a.changed < b.changed;
}

}  // namespace

ClientRecord* ClientRecords::Find(uint64_t client_id) {
  auto it = records_.find(client_id);
  return it == records_.end() ? nullptr : it->second.get();
}

ClientRecord* ClientRecords::Open(uint64_t client_id, uint64_t now_ns) {
  std::unique_ptr<ClientRecord>& rec = records_[client_id];
  if (rec == nullptr) {
    rec = std::make_unique<ClientRecord>(ClientRecord{client_id, DedupeWindow(window_), now_ns});
  }
  rec->changed = ++changes_;
  return rec.get();
}

void ClientRecords::Closed(ClientRecord* record, uint64_t now_ns) {
  record->last_active_ns = now_ns;
  record->changed = ++changes_;
}

std::vector<uint64_t> ClientRecords::Trim(LiveFn live) {
  std::vector<uint64_t> evicted;
  while (records_.size() > max_) {
    uint64_t victim = 0;
    const ClientRecord* oldest = nullptr;
    for (const auto& [id, rec] : records_) {
      if (live(id)) continue;
      if (oldest == nullptr || IdleLonger(*rec, *oldest)) {
        oldest = rec.get();
        victim = id;
      }
    }
    if (oldest == nullptr) break;  // every record is in session
    records_.erase(victim);
    evicted.push_back(victim);
  }
  return evicted;
}

RecordsExport ClientRecords::Export(uint64_t changed_after, bool with_live, LiveFn live) const {
  RecordsExport out;
  out.mark = changes_;
  out.client_ids.reserve(records_.size());
  std::vector<const ClientRecord*> picked;
  for (const auto& [id, rec] : records_) {
    out.client_ids.push_back(id);
    if (live(id) ? with_live : rec->changed > changed_after) picked.push_back(rec.get());
  }
  // Idle longest first, those in session last (in use now): the order
  // carries the records' ages to Import.
  std::sort(picked.begin(), picked.end(), [&](const ClientRecord* a, const ClientRecord* b) {
    const bool la = live(a->client_id), lb = live(b->client_id);
    if (la != lb) return lb;
    return IdleLonger(*a, *b);
  });
  out.records.reserve(picked.size());
  for (const ClientRecord* rec : picked) {
    out.records.push_back({rec->client_id, rec->window.Export(), rec->secret});
  }
  return out;
}

void ClientRecords::Import(const std::vector<ClientRecordExport>& records, uint64_t now_ns,
                           LiveFn live) {
  for (const ClientRecordExport& r : records) {
    // A live session keeps pointing at its record: never replace that one.
    if (r.client_id == 0 || live(r.client_id)) continue;
    // Stamped now, and in order by `changed`: IdleLonger puts each after the
    // ones before it and before anything stamped later.
    records_[r.client_id] = std::make_unique<ClientRecord>(ClientRecord{
        r.client_id, DedupeWindow::Import(r.window, window_), now_ns, r.secret, ++changes_});
  }
}

absl::Status ClientRecords::Retain(const std::vector<uint64_t>& client_ids) {
  for (uint64_t id : client_ids) {
    if (!records_.contains(id)) {
      return absl::DataLossError(absl::StrCat("no record of client ", id, " arrived"));
    }
  }
  const absl::flat_hash_set<uint64_t> keep(client_ids.begin(), client_ids.end());
  for (auto it = records_.begin(); it != records_.end();) {
    if (keep.contains(it->first)) {
      ++it;
    } else {
      records_.erase(it++);
    }
  }
  return absl::OkStatus();
}

}  // namespace kvnode::server
