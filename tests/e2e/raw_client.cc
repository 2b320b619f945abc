// kvnode_raw_client: a test client that speaks the wire protocol with
// kvproto + kvrdma directly (no libkvclient), so that it can also misbehave
// on purpose. Used by the e2e scripts (tests/e2e/*.sh); each --mode checks
// one behaviour of the node and exits 0 when the node behaved as specified,
// 1 otherwise (with the reason on stderr).
//
//   --mode=put_get      PUT n keys by RPC, READ each back from the arena by
//                       RDMA with the storage read path, RPC GET, DELETE, GET
//   --mode=steady       PUT/READ loop for --duration_s; any failure -> exit 1
//   --mode=cycles       n x (connect, PUT, READ, Goodbye)
//   --mode=bad_auth | bad_version | garbage | oversize_frame | truncated |
//          unexpected | no_handshake     control-channel misbehaviour
//   --mode=rpc_bad      malformed RPCs (each answered REJECTED), then a SEND
//                       larger than the server's receive buffer (session cut)
//   --mode=bad_rkey     READ with a wrong rkey: our QP errors, the node cuts
//                       the session (and nothing else)
//   --mode=vanish       post RPCs and exit at once without Goodbye
//
// Connect, handshake, QP setup, RPC and READ come from test_peer.h (shared
// with kvnode_security_client).
#include <gflags/gflags.h>
#include <infiniband/verbs.h>
#include <unistd.h>

#include <cstring>
#include <iostream>
#include <string>
#include <variant>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "kvnode/proto/control.h"
#include "kvnode/proto/frame_io.h"
#include "kvnode/proto/rpc.h"
#include "test_peer.h"

DEFINE_string(server, "127.0.0.1:7000", "node address");
DEFINE_string(auth_token_file, "", "token file");
DEFINE_string(mode, "put_get", "what to do (see the file comment)");
DEFINE_int32(n, 50, "keys / cycles");
DEFINE_int32(value_size, 100, "value bytes");
DEFINE_double(duration_s, 10, "steady: run this long");
DEFINE_string(key_prefix, "k", "key prefix (distinct per concurrent client)");
DEFINE_string(rdma_device, "", "verbs device (default: first ACTIVE)");
DEFINE_double(timeout_s, 10, "deadline for each expected answer");

namespace {

using namespace kvnode;       // NOLINT: a test tool
using namespace kvnode::e2e;  // NOLINT

// The node answers with Error{code} and closes (the session `self`, if any,
// is the one being cut).
void ExpectErrorCode(int fd, proto::ErrorCode code, Session* self = nullptr) {
  const std::string msg = ExpectErrorThenClose(fd, code, self);
  if (self != nullptr) self->dead = true;
  Note(absl::StrCat("got the expected Error: ", msg));
}

Resp Rpc(Session& s, proto::Opcode op, std::string_view key, std::string_view value = {}) {
  proto::RequestView req{op, s.w.client_id, s.seq++, key, value};
  std::string bytes;
  if (absl::Status st = proto::EncodeRequest(req, &bytes); !st.ok()) Fail(st.ToString());
  Resp r = RawRpc(s, bytes);
  if (r.sequence != req.sequence) Fail("response sequence mismatch");
  return r;
}

std::string ValueFor(const std::string& key, int version) {
  return Fill(key, static_cast<size_t>(FLAGS_value_size), version);
}

void PutGetRound(Session& s, int n, int version) {
  for (int i = 0; i < n; ++i) {
    const std::string key = absl::StrCat(FLAGS_key_prefix, i);
    const std::string val = ValueFor(key, version);
    Resp p = Rpc(s, proto::Opcode::kPut, key, val);
    if (p.status != proto::RpcStatus::kOk)
      Fail(absl::StrCat("PUT ", key, ": status ", static_cast<int>(p.status), " ", p.value));
    std::string got;
    const int rr = ReadGet(s, key, &got);
    if (rr == 1 && got != val) Fail(absl::StrCat("READ of ", key, " returned a wrong value"));
    if (rr == 0) Fail(absl::StrCat("READ says ", key, " is absent right after its PUT"));
    if (rr == -1) {
      Resp g = Rpc(s, proto::Opcode::kGet, key);
      if (g.status != proto::RpcStatus::kOk || g.value != val) Fail("slow-path GET mismatch");
    }
  }
}

int Main() {
  const std::string& m = FLAGS_mode;
  if (m == "put_get") {
    auto s = Open();
    PutGetRound(*s, FLAGS_n, 1);
    int via_read = 0;
    for (int i = 0; i < FLAGS_n; ++i) {
      const std::string key = absl::StrCat(FLAGS_key_prefix, i);
      std::string got;
      if (ReadGet(*s, key, &got) == 1) ++via_read;
      Resp g = Rpc(*s, proto::Opcode::kGet, key);
      if (g.status != proto::RpcStatus::kOk || g.value != ValueFor(key, 1))
        Fail("RPC GET mismatch");
    }
    if (via_read != FLAGS_n)
      Fail(absl::StrCat("only ", via_read, "/", FLAGS_n, " keys readable by RDMA READ"));
    // Retried PUT (same sequence) is answered from the dedupe window.
    const std::string key0 = absl::StrCat(FLAGS_key_prefix, 0);
    proto::RequestView req{proto::Opcode::kPut, s->w.client_id, s->seq++, key0, "dup"};
    std::string bytes;
    (void)proto::EncodeRequest(req, &bytes);
    Resp a = RawRpc(*s, bytes);
    Resp b = RawRpc(*s, bytes);
    if (a.status != proto::RpcStatus::kOk || b.status != a.status || b.version != a.version) {
      Fail("a retried PUT was not answered from the dedupe window");
    }
    Resp d = Rpc(*s, proto::Opcode::kDelete, key0);
    if (d.status != proto::RpcStatus::kOk) Fail("DELETE");
    Resp d2 = Rpc(*s, proto::Opcode::kDelete, key0);
    if (d2.status != proto::RpcStatus::kNotFound) Fail("DELETE of an absent key is not NOT_FOUND");
    std::string got;
    if (ReadGet(*s, key0, &got) == 1) Fail("deleted key still readable");
    Resp g = Rpc(*s, proto::Opcode::kGet, key0);
    if (g.status != proto::RpcStatus::kNotFound) Fail("GET of a deleted key is not NOT_FOUND");
    Resp p = Rpc(*s, proto::Opcode::kPing, "", "echo");
    if (p.status != proto::RpcStatus::kOk || p.value != "echo") Fail("PING");
    Goodbye(*s);
    std::cout << "put_get: " << FLAGS_n << " keys written by RPC and read by RDMA READ (rkey "
              << s->w.rkey << ", client " << s->w.client_id << ")" << std::endl;
    return 0;
  }
  if (m == "steady") {
    auto s = Open();
    const absl::Time end = absl::Now() + absl::Seconds(FLAGS_duration_s);
    int rounds = 0;
    while (absl::Now() < end) {
      PutGetRound(*s, FLAGS_n, ++rounds);
      PumpLive();
    }
    Goodbye(*s);
    std::cout << "steady: " << rounds << " rounds of " << FLAGS_n << " PUT+READ, no error"
              << std::endl;
    return 0;
  }
  if (m == "cycles") {
    for (int i = 0; i < FLAGS_n; ++i) {
      auto s = Open();
      PutGetRound(*s, 1, i + 1);
      Goodbye(*s);
    }
    std::cout << "cycles: " << FLAGS_n << " connect/PUT/READ/disconnect cycles" << std::endl;
    return 0;
  }
  if (m == "bad_auth") {
    const int fd = Dial();
    proto::Hello h;
    h.auth_token = "definitely-not-the-token";
    if (!proto::WriteControl(fd, h, Deadline()).ok()) Fail("send");
    ExpectErrorCode(fd, proto::ErrorCode::kAuthFailed);
    return 0;
  }
  if (m == "bad_version") {
    const int fd = Dial();
    proto::Hello h;
    h.protocol_version = 7;
    h.auth_token = ReadToken();
    std::string frame;
    if (!proto::EncodeControl(h, &frame, 7).ok()) Fail("encode");
    if (!proto::WriteAll(fd, proto::AsBytes(frame), Deadline()).ok()) Fail("send");
    ExpectErrorCode(fd, proto::ErrorCode::kUnsupportedVersion);
    return 0;
  }
  if (m == "garbage") {
    const int fd = Dial();
    const std::string junk = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
    if (!proto::WriteAll(fd, proto::AsBytes(junk), Deadline()).ok()) Fail("send");
    ExpectErrorCode(fd, proto::ErrorCode::kMalformed);
    return 0;
  }
  if (m == "oversize_frame") {
    const int fd = Dial();
    std::string frame;
    (void)proto::EncodeControl(proto::Keepalive{1}, &frame);
    frame[8] = 0;
    frame[9] = 0;
    frame[10] = 0x10;  // payload_size = 1 MiB
    frame[11] = 0;
    if (!proto::WriteAll(fd, proto::AsBytes(frame), Deadline()).ok()) Fail("send");
    ExpectErrorCode(fd, proto::ErrorCode::kMalformed);
    return 0;
  }
  if (m == "truncated") {
    // Half a Hello, then close: the node must just drop the connection.
    const int fd = Dial();
    proto::Hello h;
    h.auth_token = ReadToken();
    std::string frame;
    (void)proto::EncodeControl(h, &frame);
    if (!proto::WriteAll(fd, proto::AsBytes(std::string_view(frame).substr(0, frame.size() / 2)),
                         Deadline())
             .ok()) {
      Fail("send");
    }
    close(fd);
    // And a frame whose payload is shorter than its own layout says.
    const int fd2 = Dial();
    std::string f2;
    (void)proto::EncodeControl(proto::Keepalive{1}, &f2);
    f2[8] = 4;  // payload_size 4 but Keepalive needs 8
    f2.resize(12 + 4);
    if (!proto::WriteAll(fd2, proto::AsBytes(f2), Deadline()).ok()) Fail("send");
    ExpectErrorCode(fd2, proto::ErrorCode::kMalformed);
    return 0;
  }
  if (m == "unexpected") {
    const int fd = Dial();
    proto::ClientQp q;
    q.qp.mtu = 3;
    if (!proto::WriteControl(fd, q, Deadline()).ok()) Fail("send");
    ExpectErrorCode(fd, proto::ErrorCode::kUnexpectedMessage);
    return 0;
  }
  if (m == "too_many") {
    // Hello-only sessions until the node refuses one with kTooManyClients
    // (each holds a client slot until its handshake times out).
    std::vector<int> held;
    for (int i = 0; i < FLAGS_n; ++i) {
      const int fd = Dial();
      proto::Hello h;
      h.auth_token = ReadToken();
      if (!proto::WriteControl(fd, h, Deadline()).ok()) Fail("send Hello");
      absl::StatusOr<proto::ControlMessage> msg = proto::ReadControl(fd, Deadline());
      if (!msg.ok()) Fail(msg.status().ToString());
      if (std::holds_alternative<proto::Welcome>(*msg)) {
        held.push_back(fd);
        continue;
      }
      auto* e = std::get_if<proto::Error>(&*msg);
      if (e == nullptr || e->code != proto::ErrorCode::kTooManyClients) {
        Fail("expected Welcome or Error{too many clients}");
      }
      std::cout << "too_many: refused after " << held.size() << " more sessions: " << e->message
                << std::endl;
      for (int f : held) close(f);
      return 0;
    }
    Fail(absl::StrCat("no refusal after ", FLAGS_n, " sessions"));
  }
  if (m == "no_handshake") {
    // Hello, Welcome, then nothing: the node must cut us after its
    // handshake timeout with Goodbye{kIdleTimeout}.
    OpenOptions o;
    o.finish = false;
    auto s = Open(o);
    const absl::Time t0 = absl::Now();
    proto::Goodbye g = Expect<proto::Goodbye>(s->fd, "Goodbye");
    if (g.reason != proto::GoodbyeReason::kIdleTimeout) Fail("wrong Goodbye reason");
    std::cout << "no_handshake: cut after " << absl::FormatDuration(absl::Now() - t0) << ": "
              << g.message << std::endl;
    return 0;
  }
  if (m == "rpc_bad") {
    auto s = Open();
    auto expect_rejected = [&](const std::string& bytes, const char* what) {
      Resp r = RawRpc(*s, bytes);
      if (r.status != proto::RpcStatus::kRejected) Fail(absl::StrCat(what, ": not REJECTED"));
      std::cerr << "rpc_bad: " << what << " -> REJECTED: " << r.value << std::endl;
    };
    std::string ok;
    (void)proto::EncodeRequest(
        proto::RequestView{proto::Opcode::kPut, s->w.client_id, 900, "x", "y"}, &ok);
    std::string unknown = ok;
    unknown[1] = 77;  // opcode
    expect_rejected(unknown, "unknown opcode");
    std::string oversize = ok;
    oversize[2] = static_cast<char>(0xff);  // key_len 0x07ff... > 1024
    oversize[3] = 0x07;
    expect_rejected(oversize, "oversize key_len");
    expect_rejected(ok.substr(0, 10), "truncated header");
    expect_rejected(ok.substr(0, ok.size() - 1), "truncated body");
    std::string wrong = ok;
    wrong[8] ^= 0x5a;  // client id
    expect_rejected(wrong, "wrong client id");
    Resp p = Rpc(*s, proto::Opcode::kPut, "after-bad", "fine");
    if (p.status != proto::RpcStatus::kOk) Fail("valid PUT after bad ones");
    // A SEND longer than the server's receive buffer: its QP goes to ERR and
    // the node must cut this session (Error on the control channel).
    std::string huge(proto::kMaxRpcMessageSize + 4096, 'z');
    std::memcpy(s->mem.bytes() + Session::kSendOff, huge.data(), huge.size());
    const uint64_t swr = s->wr++;
    if (!s->qp
             ->PostSend(swr, rdma::LocalBuf{s->mr.get(), Session::kSendOff,
                                            static_cast<uint32_t>(huge.size())})
             .ok()) {
      Fail("post huge");
    }
    (void)s->qp->WaitFor(swr, rdma::WrKind::kSend, RdmaDeadline());
    ExpectErrorCode(s->fd, proto::ErrorCode::kInternal, s.get());
    return 0;
  }
  if (m == "bad_rkey") {
    auto s = Open();
    PutGetRound(*s, 1, 1);
    std::string bytes;
    if (Read(*s, 0, 64, s->w.rkey ^ 0x100, &bytes) == IBV_WC_SUCCESS) {
      Fail("READ with a wrong rkey succeeded");
    }
    ExpectErrorCode(s->fd, proto::ErrorCode::kInternal, s.get());
    return 0;
  }
  if (m == "vanish") {
    auto s = Open();
    // Post a few PUTs and leave without waiting or saying goodbye.
    for (int i = 0; i < 4; ++i) {
      (void)s->qp->PostRecv(
          s->wr++, rdma::LocalBuf{s->mr.get(), Session::kRecvOff, proto::kMaxRpcMessageSize});
    }
    proto::RequestView req{proto::Opcode::kPut, s->w.client_id, s->seq++, "vanish", "x"};
    std::string b;
    (void)proto::EncodeRequest(req, &b);
    std::memcpy(s->mem.bytes() + Session::kSendOff, b.data(), b.size());
    (void)s->qp->PostSend(
        s->wr++, rdma::LocalBuf{s->mr.get(), Session::kSendOff, static_cast<uint32_t>(b.size())});
    _exit(0);
  }
  Fail("unknown --mode");
}

}  // namespace

int main(int argc, char** argv) {
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  kvnode::e2e::Config() = {"raw_client",          FLAGS_mode,        FLAGS_server,
                           FLAGS_auth_token_file, FLAGS_rdma_device, FLAGS_timeout_s};
  return Main();
}
