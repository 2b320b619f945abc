// kvload's ack log as `kvload --audit` and AckLogWriter::Open read it back
// (a file a crash may have torn, or anything else): ParseAckLog. Input: flags
// byte, then the file image. Flag bit 0 rewrites each record's XXH32 checksum
// where its key length fits, so that the fuzzer gets past them.
//
// Checked: valid + torn bytes cover the file; the valid part is exactly the
// header plus the records returned; a torn tail is at most one record.
#include <xxhash.h>

#include <string>

#include "fuzz_util.h"
#include "kvnode/load/ack_log.h"
#include "kvnode/storage/limits.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvnode::load;
  using kvnode::fuzz::Le;
  if (size < 1) return 0;
  const uint8_t flags = data[0];
  std::string log(reinterpret_cast<const char*>(data + 1), size - 1);
  if (flags & 1) {
    auto* p = reinterpret_cast<uint8_t*>(log.data());
    for (size_t pos = kAckLogMagic.size(); pos + kAckRecordHeaderSize <= log.size();) {
      const size_t key_len = Le(p + pos + 4, 2);
      if (key_len == 0 || pos + kAckRecordHeaderSize + key_len > log.size()) break;
      kvnode::fuzz::PutLe(p + pos, XXH32(p + pos + 4, kAckRecordHeaderSize - 4 + key_len, 0), 4);
      pos += kAckRecordHeaderSize + key_len;
    }
  }

  absl::StatusOr<AckLogContents> c = ParseAckLog(log);
  if (!c.ok()) return 0;
  FUZZ_CHECK(c->valid_bytes + c->torn_tail_bytes == log.size());
  FUZZ_CHECK(c->torn_tail_bytes <= kAckRecordHeaderSize + kvnode::storage::kMaxKeySize);
  uint64_t expect = c->valid_bytes >= kAckLogMagic.size() ? kAckLogMagic.size() : 0;
  for (const AckRecord& r : c->records) {
    FUZZ_CHECK(!r.key.empty() && r.key.size() <= kvnode::storage::kMaxKeySize);
    expect += kAckRecordHeaderSize + r.key.size();
  }
  FUZZ_CHECK(c->valid_bytes == expect);
  return 0;
}
