// Control-protocol frames as a server or client receives them over TCP.
//
// Input: 16 bytes of cut values (eight u16, little-endian), then the stream.
// The stream goes through DecodeControlFrame whole, and through
// FrameAssembler twice: appended at once, and appended in chunks that end at
// cut points the first 16 bytes choose (the two must agree on the messages,
// the error and what stays buffered). Every decoded message must re-encode
// and decode to itself; a Move's endpoint goes through ParseHostPort as the
// client does.
//
// The cut points: frame j of the stream (the j-th message the whole-stream
// pass returned; after the last one, the rest of the stream counts as one
// more frame) is cut at offsets cut[2j mod 8] and cut[2j+1 mod 8], each
// modulo (frame length + 1), so a read may end anywhere in a frame: inside
// its header, at the header's end, inside its payload, exactly at its end
// (offset 0 or the length), and two cuts make the assembler see the same
// frame three times. One execution costs O(frames) appends, where replaying
// the stream one byte per recv() cost O(bytes); over many executions the
// fuzzer reaches every split position that replay reached in each one.
#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "fuzz_util.h"
#include "kvnode/proto/control.h"

namespace kvnode::proto {
namespace {

constexpr size_t kCutValues = 8;
constexpr size_t kPrefix = 2 * kCutValues;

void RoundTrip(const ControlMessage& m) {
  std::string again;
  absl::Status s = EncodeControl(m, &again);
  if (!s.ok()) {
    std::fprintf(stderr, "decoded %s does not re-encode: %s\n",
                 MessageTypeName(static_cast<uint16_t>(TypeOf(m))).c_str(), s.ToString().c_str());
    FUZZ_CHECK(s.ok());
  }
  absl::StatusOr<ControlMessage> back = DecodeControlFrame(AsBytes(again));
  FUZZ_CHECK(back.ok());
  FUZZ_CHECK(*back == m);
  if (const auto* move = std::get_if<Move>(&m)) {
    absl::StatusOr<HostPort> hp = ParseHostPort(move->endpoint);
    if (hp.ok()) FUZZ_CHECK(!hp->host.empty() && hp->port != 0);
  }
}

// Drains `a`; appends the messages (with the stream offset each ends at,
// given the assembler started at offset 0) and returns whether it ended on
// an error.
bool Drain(FrameAssembler& a, size_t fed, std::vector<ControlMessage>* out,
           std::vector<size_t>* ends) {
  for (;;) {
    absl::StatusOr<std::optional<ControlMessage>> m = a.Next();
    if (!m.ok()) return true;
    if (!m->has_value()) return false;
    out->push_back(std::move(**m));
    if (ends != nullptr) ends->push_back(fed - a.buffered());
  }
}

}  // namespace
}  // namespace kvnode::proto

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvnode::proto;
  using kvnode::fuzz::Le;
  uint8_t prefix[kPrefix] = {};
  std::copy(data, data + std::min(size, kPrefix), prefix);
  const std::span<const uint8_t> bytes =
      size > kPrefix ? std::span<const uint8_t>(data + kPrefix, size - kPrefix)
                     : std::span<const uint8_t>();

  absl::StatusOr<ControlMessage> m = DecodeControlFrame(bytes);
  if (m.ok()) RoundTrip(*m);

  // The stream at once.
  FrameAssembler whole;
  whole.Append(bytes);
  std::vector<ControlMessage> whole_msgs;
  std::vector<size_t> ends;  // stream offset where each message ends
  const bool whole_failed = Drain(whole, bytes.size(), &whole_msgs, &ends);
  for (const ControlMessage& msg : whole_msgs) RoundTrip(msg);
  if (m.ok()) FUZZ_CHECK(!whole_msgs.empty() && whole_msgs[0] == *m);
  FUZZ_CHECK(std::is_sorted(ends.begin(), ends.end()));
  FUZZ_CHECK(ends.empty() || ends.back() <= bytes.size());

  // The cut points (see the top of the file), sorted, inside (0, size).
  std::vector<size_t> cuts;
  size_t start = 0;
  for (size_t j = 0; j <= ends.size(); ++j) {
    const size_t end = j < ends.size() ? ends[j] : bytes.size();
    const size_t len = end - start;
    for (size_t k = 0; k < 2; ++k) {
      const uint64_t c = Le(prefix + 2 * ((2 * j + k) % kCutValues), 2);
      const size_t at = start + static_cast<size_t>(c % (len + 1));
      if (at > 0 && at < bytes.size()) cuts.push_back(at);
    }
    start = end;
  }
  std::sort(cuts.begin(), cuts.end());
  cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
  cuts.push_back(bytes.size());

  // The stream in chunks, draining after each (as an event loop whose recv()
  // returns them one by one would).
  FrameAssembler chunked;
  bool chunked_failed = false;
  std::vector<ControlMessage> chunked_msgs;
  size_t fed = 0;
  for (size_t cut : cuts) {
    if (chunked_failed) break;
    chunked.Append(bytes.subspan(fed, cut - fed));
    fed = cut;
    chunked_failed = Drain(chunked, fed, &chunked_msgs, nullptr);
  }
  FUZZ_CHECK(chunked_msgs == whole_msgs);
  FUZZ_CHECK(chunked_failed == whole_failed);
  if (!whole_failed) FUZZ_CHECK(whole.buffered() == chunked.buffered());
  return 0;
}
