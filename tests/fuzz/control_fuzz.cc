// Control-protocol frames as a server or client receives them over TCP:
// DecodeControlFrame on the whole input, and the same bytes as a stream through
// FrameAssembler, fed at once and byte by byte (the two must agree). Every
// decoded message must re-encode and decode to itself; a Move's endpoint goes
// through ParseHostPort as the client does.
#include <optional>
#include <string>
#include <vector>

#include "fuzz_util.h"
#include "kvnode/proto/control.h"

namespace kvnode::proto {
namespace {

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

// Drains `a`; returns the messages and whether it ended on an error.
std::vector<ControlMessage> Drain(FrameAssembler& a, bool* failed) {
  std::vector<ControlMessage> out;
  for (;;) {
    absl::StatusOr<std::optional<ControlMessage>> m = a.Next();
    if (!m.ok()) {
      *failed = true;
      return out;
    }
    if (!m->has_value()) return out;
    out.push_back(std::move(**m));
  }
}

}  // namespace
}  // namespace kvnode::proto

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvnode::proto;
  const std::span<const uint8_t> bytes(data, size);

  absl::StatusOr<ControlMessage> m = DecodeControlFrame(bytes);
  if (m.ok()) RoundTrip(*m);

  // The stream at once.
  FrameAssembler whole;
  whole.Append(bytes);
  bool whole_failed = false;
  std::vector<ControlMessage> whole_msgs = Drain(whole, &whole_failed);
  for (const ControlMessage& msg : whole_msgs) RoundTrip(msg);
  if (m.ok()) FUZZ_CHECK(!whole_msgs.empty() && whole_msgs[0] == *m);

  // The stream byte by byte, draining after each byte (as an event loop
  // that receives one byte per recv() would).
  FrameAssembler trickle;
  bool trickle_failed = false;
  std::vector<ControlMessage> trickle_msgs;
  for (size_t i = 0; i < size && !trickle_failed; ++i) {
    trickle.Append(bytes.subspan(i, 1));
    for (ControlMessage& msg : Drain(trickle, &trickle_failed)) {
      trickle_msgs.push_back(std::move(msg));
    }
  }
  FUZZ_CHECK(trickle_msgs == whole_msgs);
  FUZZ_CHECK(trickle_failed == whole_failed);
  if (!whole_failed) FUZZ_CHECK(whole.buffered() == trickle.buffered());
  return 0;
}
