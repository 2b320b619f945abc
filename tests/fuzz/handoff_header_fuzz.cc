// The shared-memory handoff header as the new process reads it (pread of an
// object another process wrote): DecodeHandoffHeader, then CheckCompatibility
// against this binary. Input: one flags byte, then the object's bytes.
// Flag bit 0 rewrites the checksum (bytes 1016..1023 of a 1024-byte object) so
// that the fuzzer gets past it to the field checks.
//
// The format has one encoding per header (padding must be zero), so whatever
// decodes must re-encode to exactly its first kHandoffHeaderSize bytes (the
// decoder accepts a longer object and ignores what follows, by design).
#include <xxhash.h>

#include <string>
#include <vector>

#include "fuzz_util.h"
#include "kvnode/upgrade/header.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvnode::upgrade;
  if (size < 1) return 0;
  const uint8_t flags = data[0];
  std::vector<uint8_t> obj(data + 1, data + size);
  if ((flags & 1) && obj.size() >= kHandoffHeaderSize) {
    kvnode::fuzz::PutLe(obj.data() + kHandoffHeaderSize - 8,
                        XXH3_64bits_withSeed(obj.data(), kHandoffHeaderSize - 8, 0), 8);
  }

  absl::StatusOr<HandoffHeader> h = DecodeHandoffHeader(obj);
  if (!h.ok()) return 0;
  FUZZ_CHECK(obj.size() >= kHandoffHeaderSize);
  absl::StatusOr<std::string> again = EncodeHandoffHeader(*h);
  FUZZ_CHECK(again.ok());
  FUZZ_CHECK(std::string_view(*again) ==
             std::string_view(reinterpret_cast<const char*>(obj.data()), kHandoffHeaderSize));

  // As N would: against this build's Compat and what it knows on its own.
  Compat mine;
  mine.arena_layout_version = 1;
  mine.sizeof_arena_header = 256;
  mine.sizeof_limbo_entry = 16;
  HandoffExpectations expect;
  expect.o_pid = static_cast<pid_t>(h->o_pid ^ (flags & 2));
  expect.arena_shm_name = (flags & 4) ? h->arena_shm_name : "kvnode";
  expect.arena_size = (flags & 8) ? h->arena_size : 1 << 20;
  for (const Mismatch& mm : CheckCompatibility(*h, mine, expect)) {
    FUZZ_CHECK(!mm.field.empty() && !mm.ToString().empty());
  }
  if (absl::StatusOr<std::string> name = HandoffHeaderShmName(h->arena_shm_name); name.ok()) {
    FUZZ_CHECK(!name->empty() && (*name)[0] == '/');
  }
  return 0;
}
