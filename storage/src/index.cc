#include "index.h"

#include <time.h>

#include <cstring>

#include "absl/strings/str_cat.h"

namespace kvnode::storage {
namespace {

constexpr uint64_t kMetaBitmapMask = (uint64_t{1} << 28) - 1;
// Bounds on the work one write may do to make room.
constexpr int kMaxPressureSteps = 1024;
constexpr uint64_t kMaxClockChains = 8192;

}  // namespace

uint64_t MonotonicNanos() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ULL + static_cast<uint64_t>(ts.tv_nsec);
}

void IndexWriter::Add(uint64_t ArenaHeader::*field, int64_t delta) const {
  std::atomic_ref<uint64_t> r(arena_->header()->*field);
  r.store(r.load(std::memory_order_relaxed) + static_cast<uint64_t>(delta),
          std::memory_order_relaxed);
}

uint64_t IndexWriter::BucketOf(uint64_t slot_offset) const {
  return slot_offset & ~uint64_t{kSlotLineSize - 1};
}

IndexWriter::Probe IndexWriter::Find(std::string_view key) const {
  const KeyHash kh = HashKey(g_, key);
  Probe p;
  p.home_bucket = BucketOffset(g_, kh.bucket);
  p.lossy = LinkLossy(Word(p.home_bucket).load(std::memory_order_relaxed));
  uint64_t b = p.home_bucket;
  // kMaxChainLength: only a corrupted arena has longer chains (invariant 7).
  while (b != 0 && p.chain_buckets < kMaxChainLength) {
    p.last_bucket = b;
    ++p.chain_buckets;
    uint64_t bucket_free = 0;  // first empty slot of this bucket
    for (uint32_t i = 0; i < kSlotsPerBucket; ++i) {
      const uint64_t so = b + (kBucketHeaderWords + i) * 8;
      const uint64_t w = Word(so).load(std::memory_order_relaxed);
      const Slot s = Slot::Parse(w);
      if (s.type == SlotType::kEmpty) {
        if (bucket_free == 0) bucket_free = so;
        if (p.free_slot == 0) p.free_slot = so;
        if (p.free_slot_late == 0) p.free_slot_late = so;
        continue;
      }
      if (s.fingerprint != kh.fingerprint) continue;
      if (s.type == SlotType::kMarker) {
        if (p.marker_slot == 0) p.marker_slot = so;
        p.last_marker_slot = so;
        ++p.markers;
        // Invariant 6b: a promotion may only use this marker's bucket or a
        // later one.
        p.free_slot_late = bucket_free;
        continue;
      }
      // Our own object: written by this writer, so intact.
      const char* obj = arena_->At(s.offset);
      const size_t klen = static_cast<uint8_t>(obj[24]) | size_t{static_cast<uint8_t>(obj[25])}
                                                              << 8;
      if (klen == key.size() && std::memcmp(obj + kObjectHeaderSize, key.data(), klen) == 0) {
        p.resident_slot = so;
        p.resident_word = w;
        return p;
      }
    }
    b = LinkNext(Word(b).load(std::memory_order_relaxed));
  }
  return p;
}

absl::Status IndexWriter::CheckRoomForNewKey(std::string_view key) const {
  const Probe p = Find(key);
  if (p.resident_slot != 0 || p.free_slot != 0 || p.chain_buckets < max_chain_buckets_) {
    return absl::OkStatus();
  }
  return absl::ResourceExhaustedError(absl::StrCat(
      "index chain full: the key's home bucket ",
      (p.home_bucket - g_.index_offset) / g_.bucket_size, " and its overflow buckets have all ",
      p.chain_buckets * kSlotsPerBucket, " slots in use (max_chain_buckets ", max_chain_buckets_,
      "): too many keys share this key's hash; delete some of them or write another key"));
}

void IndexWriter::SetRef(uint64_t slot_offset, bool on) const {
  const uint64_t b = BucketOf(slot_offset);
  const uint64_t bit = uint64_t{1} << (kMetaRefShift + (slot_offset - b) / 8 - kBucketHeaderWords);
  std::atomic_ref<uint64_t> meta = Word(b + 8);
  if (on) {
    if ((meta.load(std::memory_order_relaxed) & bit) == 0)
      meta.fetch_or(bit, std::memory_order_relaxed);
  } else {
    meta.fetch_and(~bit, std::memory_order_relaxed);
  }
}

void IndexWriter::Touch(uint64_t slot_offset) { SetRef(slot_offset, true); }

void IndexWriter::ReleaseLimbo(const LimboEntry& e) {
  if (e.bucket_offset == 0) {
    arena_->Deallocate(e.offset);
    return;
  }
  const uint64_t first = (e.offset - e.bucket_offset - kSlotLineSize) / kInlineGranule;
  const uint64_t count = e.length / kInlineGranule;
  const uint64_t mask = ((uint64_t{1} << count) - 1) << first;
  Word(e.bucket_offset + 8).fetch_and(~mask, std::memory_order_relaxed);
}

bool IndexWriter::ReclaimOldest() {
  ArenaHeader* h = arena_->header();
  std::atomic_ref<uint64_t> head(h->limbo_head);
  const uint64_t hd = head.load(std::memory_order_relaxed);
  if (hd == std::atomic_ref<uint64_t>(h->limbo_tail).load(std::memory_order_relaxed)) return false;
  ReleaseLimbo(arena_->limbo()[hd % h->limbo_capacity]);
  head.store(hd + 1, std::memory_order_relaxed);
  return true;
}

void IndexWriter::ReclaimExpired() {
  ArenaHeader* h = arena_->header();
  const uint64_t now = MonotonicNanos();
  std::atomic_ref<uint64_t> head(h->limbo_head);
  const uint64_t tail = std::atomic_ref<uint64_t>(h->limbo_tail).load(std::memory_order_relaxed);
  uint64_t hd = head.load(std::memory_order_relaxed);
  while (hd != tail) {
    const LimboEntry& e = arena_->limbo()[hd % h->limbo_capacity];
    // A retire time in the future means the clock restarted (a file-backed
    // arena that outlived a reboot): treat it as expired.
    if (e.retire_ns <= now && now - e.retire_ns < grace_ns_) break;
    ReleaseLimbo(e);
    head.store(++hd, std::memory_order_relaxed);
  }
}

void IndexWriter::SetSlot(uint64_t slot_offset, uint64_t word) {
  std::atomic_ref<uint64_t> slot = Word(slot_offset);
  const Slot old = Slot::Parse(slot.load(std::memory_order_relaxed));
  if (old.type == SlotType::kResident) {
    Word(old.offset + kObjectOwnerOffset).store(0, std::memory_order_release);
  }
  slot.store(word, std::memory_order_release);
  const Slot now = Slot::Parse(word);
  if (now.type == SlotType::kResident) {
    Word(now.offset + kObjectOwnerOffset).store(slot_offset, std::memory_order_release);
  }
  if (old.type == SlotType::kResident) Retire(old, slot_offset);
}

void IndexWriter::Retire(const Slot& s, uint64_t slot_offset) {
  const uint64_t b = BucketOf(slot_offset);
  const bool is_inline = s.offset >= b + kSlotLineSize && s.offset < b + g_.bucket_size;
  Add(is_inline ? &ArenaHeader::inline_bytes : &ArenaHeader::heap_bytes, -int64_t{s.length});
  PushLimbo(s.offset, is_inline ? b : 0, s.length);
}

void IndexWriter::PushLimbo(uint64_t offset, uint64_t bucket_offset, uint64_t length) {
  ArenaHeader* h = arena_->header();
  if (std::atomic_ref<uint64_t>(h->limbo_tail).load(std::memory_order_relaxed) -
          std::atomic_ref<uint64_t>(h->limbo_head).load(std::memory_order_relaxed) >=
      h->limbo_capacity) {
    ReclaimOldest();  // ring full: the oldest gets a shorter grace
  }
  std::atomic_ref<uint64_t> tail(h->limbo_tail);
  const uint64_t t = tail.load(std::memory_order_relaxed);
  LimboEntry& e = arena_->limbo()[t % h->limbo_capacity];
  e.offset = offset;
  e.bucket_offset = bucket_offset;
  e.length = length;
  e.retire_ns = MonotonicNanos();
  tail.store(t + 1, std::memory_order_relaxed);
}

uint32_t IndexWriter::NextBucketTag() {
  std::atomic_ref<uint64_t> r(arena_->header()->next_bucket_tag);
  uint32_t tag = static_cast<uint32_t>(r.load(std::memory_order_relaxed) + 1) & kBucketTagMask;
  if (tag == 0) tag = 1;
  r.store(tag, std::memory_order_relaxed);
  return tag;
}

void IndexWriter::MaybeUnlink(uint64_t bucket, uint64_t home) {
  if (bucket == home) return;
  for (uint32_t i = 0; i < kSlotsPerBucket; ++i) {
    if (Word(bucket + (kBucketHeaderWords + i) * 8).load(std::memory_order_relaxed) != 0) return;
  }
  uint64_t pred = home;
  for (uint32_t depth = 0; LinkNext(Word(pred).load(std::memory_order_relaxed)) != bucket;
       ++depth) {
    pred = LinkNext(Word(pred).load(std::memory_order_relaxed));
    if (pred == 0 || depth >= kMaxChainLength) return;  // not in this chain: leave it
  }
  std::atomic_ref<uint64_t> link = Word(pred);
  const uint64_t own = Word(bucket).load(std::memory_order_relaxed);
  link.store((own & ~kLinkLossyBit) | (link.load(std::memory_order_relaxed) & kLinkLossyBit),
             std::memory_order_release);
  // Readers that followed the old link now see another tag and retry.
  std::atomic_ref<uint64_t> meta = Word(bucket + 8);
  meta.store(meta.load(std::memory_order_relaxed) & ~kMetaTagMask, std::memory_order_release);
  Add(&ArenaHeader::overflow_buckets, -1);
  PushLimbo(bucket, 0, g_.bucket_size);
}

bool IndexWriter::EvictOne(uint64_t protect) {
  ArenaHeader* h = arena_->header();
  std::atomic_ref<uint64_t> hand_ref(h->clock_hand);
  uint64_t hand = hand_ref.load(std::memory_order_relaxed);
  const uint64_t budget = std::min<uint64_t>(2 * g_.bucket_count, kMaxClockChains);
  for (uint64_t n = 0; n < budget; ++n, ++hand) {
    uint64_t b = BucketOffset(g_, hand % g_.bucket_count);
    for (uint32_t depth = 0; b != 0 && depth < kMaxChainLength; ++depth) {
      const uint64_t meta = Word(b + 8).load(std::memory_order_relaxed);
      for (uint32_t i = 0; i < kSlotsPerBucket; ++i) {
        const uint64_t so = b + (kBucketHeaderWords + i) * 8;
        if (so == protect) continue;
        const Slot s = Slot::Parse(Word(so).load(std::memory_order_relaxed));
        if (s.type != SlotType::kResident) continue;
        if (s.offset >= b && s.offset < b + g_.bucket_size) continue;  // inline: frees no heap
        if (meta & (uint64_t{1} << (kMetaRefShift + i))) {
          SetRef(so, false);
          continue;
        }
        SetSlot(so, Slot::Marker(s.fingerprint));
        Add(&ArenaHeader::resident_keys, -1);
        Add(&ArenaHeader::marker_slots, 1);
        Add(&ArenaHeader::evictions, 1);
        hand_ref.store(hand % g_.bucket_count, std::memory_order_relaxed);
        return true;
      }
      b = LinkNext(Word(b).load(std::memory_order_relaxed));
    }
  }
  hand_ref.store(hand % g_.bucket_count, std::memory_order_relaxed);
  return false;
}

uint64_t IndexWriter::AllocateHeap(uint64_t n, uint64_t align, uint64_t protect, bool allow_evict) {
  uint64_t off = arena_->Allocate(n, align);
  for (int step = 0; off == 0 && step < kMaxPressureSteps; ++step) {
    if (!ReclaimOldest() && !(allow_evict && EvictOne(protect))) return 0;
    off = arena_->Allocate(n, align);
  }
  return off;
}

bool IndexWriter::AllocateObject(uint64_t bucket, size_t key_len, size_t value_len,
                                 uint64_t protect, bool allow_evict, Loc* loc) {
  const uint64_t inline_len = ObjectFootprint(key_len, value_len, kInlineGranule);
  const uint32_t granules = g_.inline_granules();
  if (inline_len <= uint64_t{granules} * kInlineGranule) {
    const uint64_t need = inline_len / kInlineGranule;
    const uint64_t bitmap = Word(bucket + 8).load(std::memory_order_relaxed) & kMetaBitmapMask;
    const uint64_t run = (uint64_t{1} << need) - 1;
    for (uint64_t first = 0; first + need <= granules; ++first) {
      if ((bitmap & (run << first)) == 0) {
        Word(bucket + 8).fetch_or(run << first, std::memory_order_relaxed);
        loc->offset = bucket + kSlotLineSize + first * kInlineGranule;
        loc->length = static_cast<uint32_t>(inline_len);
        loc->is_inline = true;
        return true;
      }
    }
  }
  const uint64_t heap_len = ObjectFootprint(key_len, value_len, 8);
  const uint64_t off = AllocateHeap(heap_len, 8, protect, allow_evict);
  if (off == 0) return false;
  loc->offset = off;
  loc->length = static_cast<uint32_t>(heap_len);
  loc->is_inline = false;
  return true;
}

uint64_t IndexWriter::AddOverflowBucket(uint64_t last_bucket, bool allow_evict) {
  const uint64_t off = AllocateHeap(g_.bucket_size, kSlotLineSize, 0, allow_evict);
  if (off == 0) return 0;
  std::memset(arena_->At(off), 0, g_.bucket_size);
  const uint32_t tag = NextBucketTag();
  Word(off + 8).store(uint64_t{tag} << kMetaTagShift, std::memory_order_relaxed);
  std::atomic_ref<uint64_t> link = Word(last_bucket);
  const uint64_t old = link.load(std::memory_order_relaxed);
  link.store(MakeLink(off, LinkLossy(old), tag), std::memory_order_release);
  Add(&ArenaHeader::overflow_buckets, 1);
  return off;
}

IndexWriter::Placement IndexWriter::Upsert(std::string_view key, std::string_view value,
                                           uint64_t version, bool existed, bool allow_evict) {
  ReclaimExpired();
  const uint16_t fp = HashKey(g_, key).fingerprint;
  const Probe p = Find(key);
  const bool may_grow = p.chain_buckets < max_chain_buckets_;
  enum class Kind { kUpdate, kFromMarker, kMoveFromMarker, kNew } kind;
  uint64_t target = 0;
  if (p.resident_slot != 0) {
    kind = Kind::kUpdate;
    target = p.resident_slot;
  } else if (existed && p.markers == 1 && !p.lossy) {
    kind = Kind::kFromMarker;  // invariant 6b: the only marker, in place
    target = p.marker_slot;
  } else if (existed && p.markers > 0) {
    // Invariant 6b: not before the last marker's bucket.
    kind = Kind::kMoveFromMarker;
    target = p.free_slot_late;
    if (target == 0 && may_grow) {
      const uint64_t ov = AddOverflowBucket(p.last_bucket, allow_evict);
      if (ov != 0) target = ov + kBucketHeaderWords * 8;
    }
    if (target == 0) return Placement::kNotResident;  // its markers still cover it
  } else {
    kind = Kind::kNew;
    target = p.free_slot;
    if (target == 0 && may_grow) {
      const uint64_t ov = AddOverflowBucket(p.last_bucket, allow_evict);
      if (ov != 0) target = ov + kBucketHeaderWords * 8;
    }
  }
  if (!existed) Add(&ArenaHeader::num_keys, 1);
  if (target == 0) {
    // No slot at all: the chain can no longer prove absence (invariant 5).
    std::atomic_ref<uint64_t> link = Word(p.home_bucket);
    const uint64_t old = link.load(std::memory_order_relaxed);
    if (!LinkLossy(old)) {
      link.store(old | kLinkLossyBit, std::memory_order_release);
      Add(&ArenaHeader::lossy_buckets, 1);
    }
    return Placement::kNotResident;
  }

  Loc loc;
  if (!AllocateObject(BucketOf(target), key.size(), value.size(), target, allow_evict, &loc)) {
    switch (kind) {
      case Kind::kUpdate:
        SetSlot(target, Slot::Marker(fp));
        SetRef(target, false);
        Add(&ArenaHeader::resident_keys, -1);
        Add(&ArenaHeader::marker_slots, 1);
        break;
      case Kind::kFromMarker:
        break;
      case Kind::kMoveFromMarker:
        MaybeUnlink(BucketOf(target), p.home_bucket);  // an overflow bucket added for it
        break;
      case Kind::kNew:
        SetSlot(target, Slot::Marker(fp));
        Add(&ArenaHeader::marker_slots, 1);
        break;
    }
    return Placement::kNotResident;
  }
  EncodeUnownedObject(g_, target, version, key, value, arena_->At(loc.offset), loc.length);
  SetSlot(target, Slot::Resident(fp, loc.offset, loc.length));
  Add(loc.is_inline ? &ArenaHeader::inline_bytes : &ArenaHeader::heap_bytes, loc.length);
  if (kind != Kind::kUpdate) Add(&ArenaHeader::resident_keys, 1);
  if (kind == Kind::kFromMarker) Add(&ArenaHeader::marker_slots, -1);
  if (kind == Kind::kMoveFromMarker && !p.lossy) {
    // Published at the new place first; now the first marker goes (6b).
    SetSlot(p.marker_slot, 0);
    Add(&ArenaHeader::marker_slots, -1);
    MaybeUnlink(BucketOf(p.marker_slot), p.home_bucket);
  }
  SetRef(target, true);
  return Placement::kResident;
}

void IndexWriter::ClearResident(const Probe& p) {
  SetSlot(p.resident_slot, 0);
  SetRef(p.resident_slot, false);
  Add(&ArenaHeader::resident_keys, -1);
  Add(&ArenaHeader::num_keys, -1);
  MaybeUnlink(BucketOf(p.resident_slot), p.home_bucket);
}

void IndexWriter::RemoveIfResident(std::string_view key) {
  ReclaimExpired();
  const Probe p = Find(key);
  // Invariant 10: without a resident slot, nothing here is the key's own.
  if (p.resident_slot != 0) ClearResident(p);
}

void IndexWriter::Remove(std::string_view key, bool existed) {
  ReclaimExpired();
  const Probe p = Find(key);
  if (p.resident_slot != 0) {
    ClearResident(p);
    return;
  }
  if (!existed) return;
  // Invariant 6c; in a LOSSY chain the key may have had no marker of its own.
  if (p.marker_slot != 0 && !p.lossy) {
    SetSlot(p.marker_slot, 0);
    Add(&ArenaHeader::marker_slots, -1);
    MaybeUnlink(BucketOf(p.marker_slot), p.home_bucket);
  }
  Add(&ArenaHeader::num_keys, -1);
}

}  // namespace kvnode::storage
