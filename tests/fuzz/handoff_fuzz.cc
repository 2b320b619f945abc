// Handoff-channel messages as the old and new process receive them from each
// other: DecodeHandoff on the whole input, and the stand-alone SessionTable and
// Counters codecs on the same bytes. Whatever decodes must re-encode: to the
// same bytes (Abort, accepted at any frame version, to the same message).
#include <string>

#include "fuzz_util.h"
#include "kvnode/upgrade/messages.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvnode::upgrade;
  const std::span<const uint8_t> bytes(data, size);
  const std::string_view input(reinterpret_cast<const char*>(data), size);

  absl::StatusOr<HandoffMessage> m = DecodeHandoff(bytes);
  if (m.ok()) {
    FUZZ_CHECK(!HandoffTypeName(static_cast<uint16_t>(TypeOf(*m))).empty());
    std::string again;
    FUZZ_CHECK(EncodeHandoff(*m, &again).ok());
    if (TypeOf(*m) == HandoffType::kAbort) {
      absl::StatusOr<HandoffMessage> back = DecodeHandoff(AsBytes(again));
      FUZZ_CHECK(back.ok() && *back == *m);
    } else {
      FUZZ_CHECK(again == input);
    }
  }
  // The header alone must agree with the whole-frame decoder about the size.
  if (absl::StatusOr<HandoffFrameHeader> h = DecodeHandoffFrameHeader(bytes); h.ok() && m.ok()) {
    FUZZ_CHECK(size == kHandoffFrameHeaderSize + h->payload_size);
  }

  absl::StatusOr<SessionTable> t = DecodeSessionTable(bytes);
  if (t.ok()) {
    std::string again;
    FUZZ_CHECK(EncodeSessionTable(*t, &again).ok());
    FUZZ_CHECK(again == input);
  }
  absl::StatusOr<CounterSnapshot> c = DecodeCounters(bytes);
  if (c.ok()) {
    std::string again;
    FUZZ_CHECK(EncodeCounters(*c, &again).ok());
    FUZZ_CHECK(again == input);
  }
  return 0;
}
