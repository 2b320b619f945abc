// Hot path: the client's GET decoder. No allocation, no virtual calls.
#include "kvnode/storage/read_path.h"

namespace kvnode::storage {
namespace {

using Outcome = ReadResult::Outcome;

ReadResult Make(Outcome o) {
  ReadResult r;
  r.outcome = o;
  return r;
}

// A resident slot's object must lie inside the arena and be plausibly sized.
bool PlausibleObject(const Geometry& g, const Slot& s) {
  return s.length >= kObjectHeaderSize && s.length <= kMaxObjectSize + kInlineGranule &&
         s.offset >= 8 && s.offset <= g.arena_size && s.length <= g.arena_size - s.offset;
}

// What to do once the candidates of the current buckets are exhausted or one
// turned out to be another key with the same fingerprint.
ReadResult Continue(const Geometry& g, ReadStep ctx) {
  ReadResult r;
  if (ctx.pending > 0) {
    const Slot s = Slot::Parse(ctx.pending_slot_word[0]);
    ctx.kind = ReadStep::Kind::kObject;
    ctx.offset = s.offset;
    ctx.length = s.length;
    ctx.owner = ctx.pending_slot_offset[0];
    ctx.word = ctx.pending_slot_word[0];
    for (uint8_t i = 1; i < ctx.pending; ++i) {
      ctx.pending_slot_offset[i - 1] = ctx.pending_slot_offset[i];
      ctx.pending_slot_word[i - 1] = ctx.pending_slot_word[i];
    }
    --ctx.pending;
    r.outcome = Outcome::kNext;
    r.next = ctx;
    return r;
  }
  if (ctx.next_bucket != 0) {
    if (ctx.buckets_read >= kMaxChainLength) return Make(Outcome::kSlowPath);
    ctx.kind = ReadStep::Kind::kBucket;
    ctx.offset = ctx.next_bucket;
    ctx.length = g.bucket_size;
    ctx.owner = 0;
    ctx.bucket_tag = ctx.next_bucket_tag;
    ctx.next_bucket = 0;
    ctx.next_bucket_tag = 0;
    r.outcome = Outcome::kNext;
    r.next = ctx;
    return r;
  }
  return Make(ctx.must_ask_server ? Outcome::kSlowPath : Outcome::kNotFound);
}

enum class ObjectCheck { kMatch, kOtherKey, kBad };

ObjectCheck CheckObject(const Geometry& g, std::string_view key, uint64_t owner,
                        std::string_view bytes, ReadResult* found) {
  absl::StatusOr<ObjectView> v = DecodeObject(g, bytes);
  if (!v.ok()) return ObjectCheck::kBad;
  // An intact object published by another slot: the memory was freed and
  // reused since the slot was read.
  if (v->owner != owner) return ObjectCheck::kBad;
  if (v->key != key) return ObjectCheck::kOtherKey;
  found->outcome = Outcome::kFound;
  found->value = v->value;
  found->version = v->version;
  found->slot = owner;
  return ObjectCheck::kMatch;
}

ReadResult DecodeBucket(const Geometry& g, std::string_view key, const ReadStep& step,
                        std::string_view bytes) {
  const char* p = bytes.data();
  const uint64_t link = LoadU64(p);
  // An overflow bucket reached through a link that is stale by now: it was
  // unlinked (tag cleared) or its memory reused. Its slots prove nothing.
  if (step.buckets_read > 0 && MetaTag(LoadU64(p + 8)) != step.bucket_tag) {
    return Make(Outcome::kRetry);
  }
  ReadStep ctx = step;
  ctx.buckets_read = step.buckets_read + 1;
  ctx.pending = 0;
  if (step.buckets_read == 0 && LinkLossy(link)) ctx.must_ask_server = true;
  ctx.next_bucket = LinkNext(link);
  ctx.next_bucket_tag = LinkTag(link);
  if (ctx.next_bucket != 0 &&
      (ctx.next_bucket % kSlotLineSize != 0 || ctx.next_bucket > g.arena_size ||
       g.bucket_size > g.arena_size - ctx.next_bucket)) {
    return Make(Outcome::kRetry);
  }
  const uint16_t fp = step.fingerprint != ReadStep::kNoFingerprint
                          ? static_cast<uint16_t>(step.fingerprint)
                          : HashKey(g, key).fingerprint;
  const uint64_t inline_begin = step.offset + kSlotLineSize;
  const uint64_t inline_end = step.offset + g.bucket_size;
  for (uint32_t i = 0; i < kSlotsPerBucket; ++i) {
    const size_t at = (kBucketHeaderWords + i) * 8;
    const uint64_t word = LoadU64(p + at);
    const Slot s = Slot::Parse(word);
    if (s.type == SlotType::kInvalid) return Make(Outcome::kRetry);
    if (s.type == SlotType::kEmpty || s.fingerprint != fp) continue;
    if (s.type == SlotType::kMarker) {
      ctx.must_ask_server = true;
      continue;
    }
    if (!PlausibleObject(g, s)) return Make(Outcome::kRetry);
    const uint64_t slot_offset = step.offset + at;
    if (s.offset >= inline_begin && s.offset + s.length <= inline_end) {
      // Inline in this bucket: already in hand, no further READ.
      ReadResult r;
      switch (
          CheckObject(g, key, slot_offset, bytes.substr(s.offset - step.offset, s.length), &r)) {
        case ObjectCheck::kMatch:
          return r;
        case ObjectCheck::kOtherKey:
          continue;
        case ObjectCheck::kBad:
          return Make(Outcome::kRetry);
      }
    }
    ctx.pending_slot_offset[ctx.pending] = slot_offset;
    ctx.pending_slot_word[ctx.pending] = word;
    ++ctx.pending;
  }
  return Continue(g, ctx);
}

}  // namespace

ReadStep FirstRead(const Geometry& g, std::string_view key) {
  return FirstRead(g, HashKey(g, key));
}

ReadStep FirstRead(const Geometry& g, const KeyHash& hash) {
  ReadStep step;
  step.kind = ReadStep::Kind::kBucket;
  step.offset = BucketOffset(g, hash.bucket);
  step.length = g.bucket_size;
  step.fingerprint = hash.fingerprint;
  return step;
}

ReadStep CachedRead(const Geometry& g, const CachedLocation& loc) {
  ReadStep step;
  step.kind = ReadStep::Kind::kCached;
  const Slot s = Slot::Parse(loc.word);
  if (s.type != SlotType::kResident || !PlausibleObject(g, s) || loc.slot % 8 != 0 ||
      loc.slot < g.index_offset || loc.slot > g.arena_size - 8) {
    return step;  // length 0: not a location
  }
  step.offset = s.offset;
  step.length = s.length;
  step.owner = loc.slot;
  step.word = loc.word;
  return step;
}

ReadResult DecodeCached(const Geometry& g, std::string_view key, const ReadStep& step,
                        std::string_view object_bytes) {
  if (step.kind != ReadStep::Kind::kCached || step.length == 0 ||
      object_bytes.size() < step.length) {
    return Make(Outcome::kRetry);
  }
  ReadResult r;
  if (CheckObject(g, key, step.owner, object_bytes.substr(0, step.length), &r) !=
      ObjectCheck::kMatch) {
    return Make(Outcome::kRetry);
  }
  r.slot_word = step.word;
  return r;
}

ReadResult Decode(const Geometry& g, std::string_view key, const ReadStep& step,
                  std::string_view bytes) {
  if (bytes.size() < step.length || step.length == 0) return Make(Outcome::kRetry);
  bytes = bytes.substr(0, step.length);
  if (step.kind == ReadStep::Kind::kBucket) {
    if (step.length != g.bucket_size) return Make(Outcome::kRetry);
    return DecodeBucket(g, key, step, bytes);
  }
  if (step.kind != ReadStep::Kind::kObject) return Make(Outcome::kRetry);  // kCached: DecodeCached
  ReadResult r;
  switch (CheckObject(g, key, step.owner, bytes, &r)) {
    case ObjectCheck::kMatch:
      r.slot_word = step.word;
      return r;
    case ObjectCheck::kOtherKey:
      return Continue(g, step);
    case ObjectCheck::kBad:
      break;
  }
  return Make(Outcome::kRetry);
}

const char* OutcomeName(ReadResult::Outcome o) {
  switch (o) {
    case Outcome::kFound:
      return "found";
    case Outcome::kNotFound:
      return "not-found";
    case Outcome::kRetry:
      return "retry";
    case Outcome::kNext:
      return "next";
    case Outcome::kSlowPath:
      return "slow-path";
  }
  return "?";
}

}  // namespace kvnode::storage
