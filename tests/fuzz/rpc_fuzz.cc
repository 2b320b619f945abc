// RPC messages as they arrive in a receive buffer (one SEND each, exactly
// byte_len bytes): DecodeRequest, DecodeRequestHeader and DecodeResponse on the
// same bytes. The format has one encoding per message, so whatever decodes
// must re-encode to exactly the input, and the views must point into it.
#include <string>

#include "fuzz_util.h"
#include "kvnode/proto/rpc.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvnode::proto;
  using kvnode::fuzz::Inside;
  const std::span<const uint8_t> bytes(data, size);
  const std::string_view input(reinterpret_cast<const char*>(data), size);

  absl::StatusOr<RequestHeader> h = DecodeRequestHeader(bytes);
  absl::StatusOr<RequestView> req = DecodeRequest(bytes);
  if (req.ok()) {
    FUZZ_CHECK(h.ok());
    FUZZ_CHECK(h->opcode == static_cast<uint8_t>(req->opcode));
    FUZZ_CHECK(h->key_len == req->key.size() && h->value_len == req->value.size());
    FUZZ_CHECK(h->client_id == req->client_id && h->sequence == req->sequence);
    FUZZ_CHECK(Inside(req->key, data, size) && Inside(req->value, data, size));
    FUZZ_CHECK(ValidateRequest(*req).ok());
    FUZZ_CHECK(EncodedSize(*req) == size);
    std::string again;
    FUZZ_CHECK(EncodeRequest(*req, &again).ok());
    FUZZ_CHECK(again == input);
  }

  absl::StatusOr<ResponseView> resp = DecodeResponse(bytes);
  if (resp.ok()) {
    FUZZ_CHECK(Inside(resp->value, data, size));
    FUZZ_CHECK(ValidateResponse(*resp).ok());
    FUZZ_CHECK(!OpcodeName(resp->opcode).empty() && !RpcStatusName(resp->status).empty());
    std::string again;
    FUZZ_CHECK(EncodeResponse(*resp, &again).ok());
    FUZZ_CHECK(again == input);
  }
  return 0;
}
