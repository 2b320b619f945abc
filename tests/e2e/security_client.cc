// kvnode_security_client: attacks on the node, one --mode per attack of
// docs/security.md. Speaks the wire protocol with kvproto + kvrdma directly
// (no libkvclient) so that it can misbehave. Each mode exits 0 when the node
// defended itself as specified, 1 otherwise (reason on stderr); the summary
// line on stdout is what the e2e script logs.
//
//   --mode=bad_auth_qpn     wrong tokens (equal length, prefix, empty) are
//                           refused and create no QP: the server QPs of two
//                           probe sessions around --n refused Hellos are
//                           consecutive QP numbers (rxe allocates QPNs
//                           cyclically)
//   --mode=window_attack    READ with another client's rkey (--victim_rkey),
//                           the arena MR's key (--arena_key), the RPC pool
//                           MR's key (--pool_key), past the arena's end,
//                           and an RDMA WRITE through our own window: each
//                           fails on our QP and the node cuts our session
//   --mode=rejoin           a client's window dies with its session: its old
//                           rkey fails from its next session's QP (after a
//                           Goodbye and after a cut)
//   --mode=max_clients      --n sessions fill the node; the next Hello (new id
//                           and resumed id) gets Error{too many clients}; the
//                           held sessions keep working; one leaves, one joins
//   --mode=credits          sends --n RPCs back to back on a QP with
//                           rnr_retry 0: more than Welcome.max_rpc_credits
//                           outstanding is refused by the NIC (RNR) on our QP
//   --mode=sizes            PUT at the key/value limits succeeds (and READs
//                           back); one byte more is REJECTED and not stored
//   --mode=arena_fill       --n PUTs of --value_size bytes (more than the
//                           arena holds): all acknowledged and read back
//   --mode=aimed_keys       keys brute-forced for one home bucket with the
//                           seed every client gets in the geometry: PUTs
//                           until one is REJECTED "index chain full" (within
//                           --n); that key is not stored; after DELETEs of
//                           the accepted keys it is accepted
//   --mode=slowloris        --n connections that never finish the handshake
//                           (no bytes, half a Hello, Hello without ClientQp):
//                           each cut with Goodbye{idle timeout} in time
//   --mode=burst            --n connection attempts at once (loopback only);
//                           the node's fd count (--node_pid) stays under
//                           --max_node_fds; prints how many were refused
//   --mode=admin_probe      one admin request; prints what happened
//   --mode=rpcs             the RPCs of --rpcs in order, one session per
//                           label (new, or resuming the id --ids gives it);
//                           prints "rpcs: LABEL client ID secret HEX seq S OP
//                           KEY -> STATUS version V value 'X'" per item
//                           (retried writes, for security_dedupe.sh)
//   --mode=hijack           a victim's client id without its resume secret
//                           (none, one bit off, another client's) and a
//                           guessed id: each Hello gets a fresh id, the
//                           victim's live session is not replaced and its
//                           dedupe window is not the attacker's; the victim
//                           resumes with its secret
//
// Connect, handshake, QP setup, RPC and READ come from test_peer.h (shared
// with kvnode_raw_client).
#include <dirent.h>
#include <gflags/gflags.h>
#include <infiniband/verbs.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "kvnode/proto/control.h"
#include "kvnode/proto/frame_io.h"
#include "kvnode/proto/rpc.h"
#include "kvnode/rdma/memory.h"
#include "kvnode/rdma/mr.h"
#include "kvnode/rdma/qp.h"
#include "kvnode/storage/format.h"
#include "kvnode/storage/limits.h"
#include "test_peer.h"

DEFINE_string(server, "127.0.0.1:7000", "node address");
DEFINE_string(auth_token_file, "", "token file");
DEFINE_string(mode, "", "the attack (see the file comment)");
DEFINE_int32(n, 10, "count (mode specific)");
DEFINE_int32(value_size, 16384, "arena_fill: value bytes");
DEFINE_string(rdma_device, "", "verbs device (default: first ACTIVE)");
DEFINE_double(timeout_s, 20, "deadline for each expected answer");
DEFINE_uint32(victim_rkey, 0, "window_attack: another client's rkey");
DEFINE_uint32(arena_key, 0,
              "window_attack: the arena MR's key (lkey; its rkey is 0 without remote access)");
DEFINE_uint32(pool_key, 0, "window_attack: the RPC pool MR's key (lkey)");
DEFINE_double(handshake_timeout_s, 5, "slowloris: the node's --handshake_timeout_ms / 1000");
DEFINE_int32(node_pid, 0, "burst: the node's pid (its fds are counted)");
DEFINE_int32(max_node_fds, 0, "burst: the node may never hold more fds than this");
DEFINE_string(admin_socket, "", "admin_probe: the socket");
DEFINE_string(cmd, "ping", "admin_probe: the request line");
DEFINE_string(rpcs, "",
              "rpcs: LABEL:OP:KEY:VALUE:SEQ[:COUNT],... (OP put|delete|get; COUNT requests "
              "with sequences SEQ.., a PUT's value suffixed -I from the second on)");
DEFINE_string(ids, "",
              "rpcs: LABEL=CLIENT_ID:SECRET_HEX,... sessions that resume these client ids "
              "(SECRET_HEX: the resume secret the rpcs output printed for it)");

namespace {

using namespace kvnode;       // NOLINT: a test tool
using namespace kvnode::e2e;  // NOLINT

// The process-wide verbs context: one device, PD and CQ for every session,
// so that a mode can open many sessions cheaply.
const Verbs& Ctx() {
  static const Verbs* v = [] {
    rdma::CqOptions co;
    co.depth = 4096;
    return new Verbs(OpenVerbs(co));
  }();
  return *v;
}

// A session on the process-wide verbs context. qo: our QP's options.
std::unique_ptr<Session> OpenShared(uint64_t client_id = 0, rdma::QpOptions qo = {},
                                    const proto::ResumeSecret& secret = {}) {
  OpenOptions o;
  o.client_id = client_id;
  o.resume_secret = secret;
  o.qp = qo;
  o.verbs = &Ctx();
  return Open(o);
}
// Resumes `client_id` with its secret.
std::unique_ptr<Session> Resume(uint64_t client_id, const proto::ResumeSecret& secret) {
  return OpenShared(client_id, {}, secret);
}

std::string Hex(const proto::ResumeSecret& s) {
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(s.data()), s.size()));
}

// RPC sequences, process-wide: a resumed client id continues its sequence
// (the node answers a reused one from its dedupe window).
uint64_t g_seq = 1;

void PutLe(std::string* out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

// A request encoded by hand (docs/protocol.md 2.1), so that it can break the
// limits the encoder enforces.
std::string HandRequest(proto::Opcode op, uint64_t client_id, uint64_t seq, std::string_view key,
                        std::string_view value) {
  std::string b;
  PutLe(&b, proto::kRpcVersion, 1);
  PutLe(&b, static_cast<uint8_t>(op), 1);
  PutLe(&b, key.size(), 2);
  PutLe(&b, value.size(), 4);
  PutLe(&b, client_id, 8);
  PutLe(&b, seq, 8);
  b.append(key);
  b.append(value);
  return b;
}

Resp Rpc(Session& s, proto::Opcode op, std::string_view key, std::string_view value = {}) {
  const uint64_t seq = g_seq++;
  Resp r = RawRpc(s, HandRequest(op, s.w.client_id, seq, key, value));
  if (r.sequence != seq) Fail("response sequence mismatch");
  return r;
}

// GET by READ, falling back to RPC. Returns the value or nullopt (absent).
std::optional<std::string> Get(Session& s, const std::string& key, bool* by_read = nullptr) {
  std::string v;
  const int rr = ReadGet(s, key, &v);
  if (by_read != nullptr) *by_read = rr >= 0;
  if (rr == 1) return v;
  if (rr == 0) return std::nullopt;
  Resp g = Rpc(s, proto::Opcode::kGet, key);
  if (g.status == proto::RpcStatus::kNotFound) return std::nullopt;
  if (g.status != proto::RpcStatus::kOk)
    Fail(absl::StrCat("GET ", key, ": status ", static_cast<int>(g.status)));
  return g.value;
}

void PutAndReadBack(Session& s, const std::string& key, int round) {
  const std::string val = Fill(key, 100, round);
  Resp p = Rpc(s, proto::Opcode::kPut, key, val);
  if (p.status != proto::RpcStatus::kOk) Fail(absl::StrCat("PUT ", key, " not OK: ", p.value));
  std::optional<std::string> got = Get(s, key);
  if (!got.has_value() || *got != val) Fail(absl::StrCat("read-back of ", key, " mismatch"));
}

// The node must cut `s` (Error{internal} on its control connection) after
// its QP went to ERR.
std::string ExpectCut(Session& s) {
  std::string why = ExpectErrorThenClose(s.fd, proto::ErrorCode::kInternal, &s);
  s.dead = true;
  return why;
}

// ---------------------------------------------------------------------------

int BadAuthQpn() {
  const std::string token = ReadToken();
  if (token.empty()) Fail("bad_auth_qpn needs --auth_token_file");
  uint32_t first_server_qpn = 0;
  uint32_t next_expected = 0;
  {
    auto a = OpenShared();
    first_server_qpn = a->w.server_qp.qpn;
    next_expected = std::max(a->w.server_qp.qpn, a->qp->qp_num()) + 1;
    Goodbye(*a);
  }
  std::string same_len = token;
  same_len.back() = static_cast<char>(same_len.back() == 'x' ? 'y' : 'x');
  std::string first_byte = token;
  first_byte[0] = static_cast<char>(first_byte[0] ^ 1);
  const std::vector<std::string> wrong = {same_len, first_byte, token.substr(0, token.size() - 1),
                                          token + "0", ""};
  for (int i = 0; i < FLAGS_n; ++i) {
    const int fd = Dial();
    proto::Hello h;
    h.auth_token = wrong[static_cast<size_t>(i) % wrong.size()];
    h.client_name = "security_client-bad-token";
    if (!proto::WriteControl(fd, h, Deadline()).ok()) Fail("send Hello");
    const std::string msg = ExpectErrorThenClose(fd, proto::ErrorCode::kAuthFailed);
    if (i == 0) Note(absl::StrCat("refusal: Error{auth failed}: \"", msg, "\""));
    close(fd);
  }
  auto b = OpenShared();
  const uint32_t got = b->w.server_qp.qpn;
  Goodbye(*b);
  if (got != next_expected) {
    Fail(absl::StrCat("server QPN after ", FLAGS_n, " refused Hellos is ", got, ", expected ",
                      next_expected, ": the node created QPs for unauthenticated peers"));
  }
  std::cout << "bad_auth_qpn: " << FLAGS_n
            << " wrong tokens refused with Error{auth failed}; server QPNs " << first_server_qpn
            << " -> " << got << ": no QP created for them" << std::endl;
  return 0;
}

// RDMA WRITE through the raw verbs (kvrdma has no WRITE: nothing in kvnode
// writes remotely); polls the shared CQ directly for its completion. Only
// valid while no other work request is outstanding in this process.
ibv_wc_status RawWrite(Session& s, uint64_t offset, uint32_t len, uint32_t rkey) {
  constexpr uint64_t kWrId = 0x5ec0000000000001ull;
  ibv_sge sge{};
  sge.addr = reinterpret_cast<uint64_t>(s.mem.bytes() + Session::kSendOff);
  sge.length = len;
  sge.lkey = s.mr->lkey();
  ibv_send_wr wr{};
  wr.wr_id = kWrId;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_RDMA_WRITE;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.rdma.remote_addr = s.w.arena_remote_addr + offset;
  wr.wr.rdma.rkey = rkey;
  ibv_send_wr* bad = nullptr;
  if (const int rc = ibv_post_send(s.qp->qp(), &wr, &bad); rc != 0) {
    Fail(absl::StrCat("ibv_post_send WRITE: ", strerror(rc)));
  }
  const absl::Time deadline = Deadline();
  for (;;) {
    ibv_wc wc{};
    const int n = ibv_poll_cq(Ctx().cq->cq(), 1, &wc);
    if (n < 0) Fail("ibv_poll_cq");
    if (n == 1) {
      if (wc.wr_id != kWrId) Fail("unexpected completion while waiting for the WRITE");
      return wc.status;
    }
    if (absl::Now() > deadline) Fail("no completion for the RDMA WRITE");
  }
}

int WindowAttack() {
  struct Attack {
    const char* name;
    uint32_t rkey;  // 0: our own
    uint64_t offset;
    bool write;
  };
  if (FLAGS_victim_rkey == 0 || FLAGS_arena_key == 0 || FLAGS_pool_key == 0) {
    Fail("--victim_rkey, --arena_key and --pool_key are required");
  }
  std::vector<Attack> attacks = {{"another client's rkey", FLAGS_victim_rkey, 0, false},
                                 {"the arena MR's key", FLAGS_arena_key, 0, false},
                                 {"the RPC pool MR's key", FLAGS_pool_key, 0, false}};
  attacks.push_back({"own rkey past the arena's end", 0, UINT64_MAX, false});
  attacks.push_back({"RDMA WRITE through own window", 0, 0, true});
  for (const Attack& a : attacks) {
    auto s = OpenShared();
    PutAndReadBack(*s, "window-attack-probe", 1);  // our QP and window work
    const uint32_t rkey = a.rkey != 0 ? a.rkey : s->w.rkey;
    const uint64_t off = a.offset == UINT64_MAX ? s->w.arena_size - 16 : a.offset;
    ibv_wc_status st;
    if (a.write) {
      std::memset(s->mem.bytes() + Session::kSendOff, 0x41, 64);
      st = RawWrite(*s, off, 64, rkey);
    } else {
      st = Read(*s, off, 64, rkey, nullptr);
    }
    if (st == IBV_WC_SUCCESS) Fail(absl::StrCat(a.name, ": the access succeeded"));
    const std::string why = ExpectCut(*s);
    Note(absl::StrCat(a.name, " (rkey ", rkey, "): our completion ", ibv_wc_status_str(st),
                      "; node: \"", why, "\""));
  }
  std::cout << "window_attack: " << attacks.size()
            << " accesses outside our own window failed on our QP and cut only our session"
            << std::endl;
  return 0;
}

int Rejoin() {
  std::string bytes;
  // 1. A client leaves with Goodbye: its rkey is dead for its next session.
  auto s1 = OpenShared();
  const uint64_t id = s1->w.client_id;
  const proto::ResumeSecret secret = s1->w.resume_secret;
  const uint32_t r1 = s1->w.rkey;
  PutAndReadBack(*s1, "rejoin-probe", 1);
  Goodbye(*s1);
  s1.reset();
  auto s2 = Resume(id, secret);
  if (s2->w.client_id != id) Fail("resumed session got another client id");
  const uint32_t r2 = s2->w.rkey;
  if (r2 == r1) Fail(absl::StrCat("the resumed session got the old rkey ", r1, " again"));
  PutAndReadBack(*s2, "rejoin-probe", 2);
  ibv_wc_status st = Read(*s2, 0, 64, r1, &bytes);
  if (st == IBV_WC_SUCCESS) Fail("the rkey of a closed session still reads");
  const std::string why2 = ExpectCut(*s2);
  Note(absl::StrCat("old rkey ", r1, " after Goodbye: ", ibv_wc_status_str(st), "; cut: ", why2));
  s2.reset();
  // 2. The session was cut by the node (just now): its rkey r2 is dead too.
  auto s3 = Resume(id, secret);
  const uint32_t r3 = s3->w.rkey;
  if (r3 == r2 || r3 == r1) Fail("the session after a cut reuses an old rkey");
  PutAndReadBack(*s3, "rejoin-probe", 3);
  st = Read(*s3, 0, 64, r2, &bytes);
  if (st == IBV_WC_SUCCESS) Fail("the rkey of a cut session still reads");
  (void)ExpectCut(*s3);
  std::cout << "rejoin: client " << id << " rkeys " << r1 << " -> " << r2 << " -> " << r3
            << ": the rkey of a left and of a cut session fail from the next session's QP"
            << std::endl;
  return 0;
}

int Hijack() {
  using proto::Opcode;
  using proto::RpcStatus;
  auto expect = [](const Resp& r, RpcStatus want, const std::string& what) {
    if (r.status != want) {
      Fail(absl::StrCat(what, ": ", std::string(proto::RpcStatusName(r.status)), " (expected ",
                        std::string(proto::RpcStatusName(want)), ") '", r.value, "'"));
    }
  };
  auto v = OpenShared();
  const uint64_t vid = v->w.client_id;
  const proto::ResumeSecret vsecret = v->w.resume_secret;
  if (vsecret == proto::ResumeSecret{}) Fail("the Welcome carried no resume secret");
  const uint64_t seq = 5000;  // V's write; attackers then use V's next one
  Resp r = RawRpc(*v, HandRequest(Opcode::kPut, vid, seq, "hijack-k", "victim-1"));
  expect(r, RpcStatus::kOk, "V's PUT");
  auto other = OpenShared();  // a second honest client, for its secret
  proto::ResumeSecret off = vsecret;
  off[7] ^= 0x10;
  struct Try {
    std::string what;
    uint64_t id;
    proto::ResumeSecret secret;
  };
  const std::vector<Try> tries = {
      {"V's id without a secret", vid, {}},
      {"V's id, its secret one bit off", vid, off},
      {"V's id with another client's secret", vid, other->w.resume_secret},
      {"a guessed id (with V's secret)", vid ^ 1, vsecret},
  };
  uint64_t newest_attack = 0;
  for (const Try& t : tries) {
    auto a = OpenShared(t.id, {}, t.secret);
    const uint64_t aid = a->w.client_id;
    if (aid == vid || aid == t.id || aid == other->w.client_id) {
      Fail(absl::StrCat(t.what, ": got client id ", aid, " (asked for ", t.id, ")"));
    }
    if (a->w.resume_secret == vsecret || a->w.resume_secret == proto::ResumeSecret{}) {
      Fail(absl::StrCat(t.what, ": got V's secret or none"));
    }
    // V's next sequence, on the attacker's own id: applied in ITS window.
    Resp ar = RawRpc(*a, HandRequest(Opcode::kPut, aid, seq + 1, "hijack-k2", "attacker"));
    expect(ar, RpcStatus::kOk, t.what + ": the attacker's PUT");
    newest_attack = std::max(newest_attack, ar.version);
    // Naming V's id in a request is refused.
    expect(RawRpc(*a, HandRequest(Opcode::kPut, vid, seq + 1, "hijack-k2", "as-victim")),
           RpcStatus::kRejected, t.what + ": a request naming V's id");
    // V's session was not replaced: it still answers, and nothing else came
    // on its control connection (PumpLive fails on a Goodbye).
    expect(RawRpc(*v, HandRequest(Opcode::kPing, vid, 1, "", "alive")), RpcStatus::kOk,
           t.what + ": V's session after the attack");
    PumpLive();
    Goodbye(*a);
    Note(absl::StrCat(t.what, ": fresh client ", aid, ", V's session untouched"));
  }
  // V's own write of that sequence is applied (not answered from an
  // attacker's entry): a newer version, and its value is the one read.
  Resp vr = RawRpc(*v, HandRequest(Opcode::kPut, vid, seq + 1, "hijack-k2", "victim-2"));
  expect(vr, RpcStatus::kOk, "V's PUT of its next sequence");
  if (vr.version <= newest_attack) {
    Fail(absl::StrCat("V's PUT answered version ", vr.version, ", not newer than the attackers' ",
                      newest_attack, ": answered from their window"));
  }
  std::optional<std::string> got = Get(*v, "hijack-k2");
  if (!got.has_value() || *got != "victim-2") Fail("V's value of hijack-k2 was not applied");
  Goodbye(*v);
  v.reset();
  Goodbye(*other);
  other.reset();
  // V resumes with its secret: same id, and its window answers its retry.
  auto again = Resume(vid, vsecret);
  if (again->w.client_id != vid) Fail("V could not resume its id with its secret");
  Resp retry = RawRpc(*again, HandRequest(Opcode::kPut, vid, seq + 1, "hijack-k2", "victim-2"));
  expect(retry, RpcStatus::kOk, "V's retry after resuming");
  if (retry.version != vr.version) Fail("V's retry was not answered from its window");
  Goodbye(*again);
  std::cout << "hijack: " << tries.size() << " Hellos naming client " << vid
            << " or a guessed id without its secret got fresh ids; the victim's session and "
            << "dedupe window were untouched; it resumed with its secret" << std::endl;
  return 0;
}

int MaxClients() {
  std::vector<std::unique_ptr<Session>> held;
  for (int i = 0; i < FLAGS_n; ++i) held.push_back(OpenShared());
  Note(absl::StrCat("holding ", held.size(), " sessions"));
  auto refused = [](uint64_t client_id) {
    const int fd = Dial();
    proto::Hello h;
    h.client_id = client_id;
    h.auth_token = ReadToken();
    if (!proto::WriteControl(fd, h, Deadline()).ok()) Fail("send Hello");
    std::string msg = ExpectErrorThenClose(fd, proto::ErrorCode::kTooManyClients);
    close(fd);
    return msg;
  };
  const std::string m1 = refused(0);
  const std::string m2 = refused(0x5ec5ec5ec5ec5ecull);  // a resumed id skips no check
  Note(absl::StrCat("new id refused: \"", m1, "\"; resumed id refused: \"", m2, "\""));
  for (size_t i = 0; i < held.size(); ++i) PutAndReadBack(*held[i], absl::StrCat("held-", i), 1);
  Goodbye(*held.back());
  held.pop_back();
  // The slot comes back once the node has torn the session down.
  const absl::Time deadline = Deadline();
  std::unique_ptr<Session> again;
  for (;;) {
    const int fd = Dial();
    proto::Hello h;
    h.auth_token = ReadToken();
    if (!proto::WriteControl(fd, h, Deadline()).ok()) Fail("send Hello");
    absl::StatusOr<proto::ControlMessage> m = NextMessage(fd, nullptr);
    close(fd);
    if (m.ok() && std::holds_alternative<proto::Welcome>(*m)) break;
    if (absl::Now() > deadline) Fail("the freed slot never came back");
  }
  again = OpenShared();
  PutAndReadBack(*again, "held-again", 1);
  for (auto& s : held) Goodbye(*s);
  Goodbye(*again);
  std::cout << "max_clients: " << FLAGS_n << " sessions filled the node; new and resumed ids got "
            << "Error{too many clients}; held sessions kept working; a freed slot was reused"
            << std::endl;
  return 0;
}

int Credits() {
  rdma::QpOptions qo;
  qo.rnr_retry = 0;  // the first RNR NAK fails our SEND: the refusal is visible
  qo.max_send_wr = 128;
  qo.max_recv_wr = 128;
  auto s = OpenShared(0, qo);
  const uint32_t credits = s->w.max_rpc_credits;
  const int n = std::min(FLAGS_n, 120);
  if (static_cast<uint32_t>(n) <= credits) Fail("--n must exceed the node's credits");
  // Separate receive buffers for every answer.
  const size_t bytes = (static_cast<size_t>(n) * proto::kMaxRpcMessageSize + 4095) / 4096 * 4096;
  auto mem = rdma::HostMemory::Allocate(bytes);
  if (!mem.ok()) Fail(mem.status().ToString());
  auto mr = rdma::Mr::Register(Ctx().pd, mem->data(), mem->size(), rdma::MrOptions{});
  if (!mr.ok()) Fail(mr.status().ToString());
  std::vector<uint64_t> recvs, sends;
  for (int i = 0; i < n; ++i) {
    const uint64_t wr = s->wr++;
    if (!s->qp
             ->PostRecv(
                 wr, rdma::LocalBuf{mr->get(), static_cast<uint64_t>(i) * proto::kMaxRpcMessageSize,
                                    proto::kMaxRpcMessageSize})
             .ok()) {
      Fail("post recv");
    }
    recvs.push_back(wr);
  }
  const std::string ping = HandRequest(proto::Opcode::kPing, s->w.client_id, 1000, "", "p");
  std::memcpy(s->mem.bytes() + Session::kSendOff, ping.data(), ping.size());
  for (int i = 0; i < n; ++i) {
    // Same bytes each time: the node answers PINGs without dedupe.
    const uint64_t wr = s->wr++;
    if (!s->qp
             ->PostSend(wr, rdma::LocalBuf{s->mr.get(), Session::kSendOff,
                                           static_cast<uint32_t>(ping.size())})
             .ok()) {
      Fail("post send");
    }
    sends.push_back(wr);
  }
  int ok = 0, rnr = 0, flushed = 0, other = 0;
  for (uint64_t wr : sends) {
    auto c = s->qp->WaitFor(wr, rdma::WrKind::kSend, RdmaDeadline());
    if (!c.ok()) Fail(absl::StrCat("send completion: ", c.status().ToString()));
    if (c->ok()) {
      ++ok;
    } else if (c->status == IBV_WC_RNR_RETRY_EXC_ERR) {
      ++rnr;
    } else if (c->status == IBV_WC_WR_FLUSH_ERR) {
      ++flushed;
    } else {
      ++other;
      Note(absl::StrCat("send completion ", ibv_wc_status_str(c->status)));
    }
  }
  Note(absl::StrCat(n, " SENDs against ", credits, " credits: ", ok, " delivered, ", rnr,
                    " refused (RNR), ", flushed, " flushed, ", other, " other"));
  if (rnr == 0) {
    Fail(absl::StrCat("no RNR refusal although ", n, " RPCs were outstanding for ", credits,
                      " credits"));
  }
  if (static_cast<uint32_t>(ok) < credits) Fail("fewer RPCs than credits were delivered");
  // Our QP is in ERR now; the node notices when its answers are not acked
  // and cuts the session (any control outcome but a crash is fine).
  absl::StatusOr<proto::ControlMessage> m = NextMessage(s->fd, s.get());
  s->dead = true;
  std::string end = m.ok() ? TypeName(*m) : m.status().ToString();
  if (m.ok()) {
    if (auto* e = std::get_if<proto::Error>(&*m)) end = absl::StrCat("Error: ", e->message);
  }
  s->qp.reset();
  (void)rdma::SafeDeregister(**mr, rdma::DeadlineIn(std::chrono::seconds(2)));
  std::cout << "credits: " << n << " RPCs sent for " << credits << " credits: " << ok
            << " delivered, " << rnr << " refused by RNR on our QP; then the node: " << end
            << std::endl;
  return 0;
}

int Sizes() {
  auto s = OpenShared();
  const std::string kmax(storage::kMaxKeySize, 'K');
  const std::string vmax = Fill("vmax", storage::kMaxValueSize, 1);
  Resp p = Rpc(*s, proto::Opcode::kPut, kmax, vmax);
  if (p.status != proto::RpcStatus::kOk) Fail(absl::StrCat("PUT at both limits: ", p.value));
  bool by_read = false;
  std::optional<std::string> got = Get(*s, kmax, &by_read);
  if (!got.has_value() || *got != vmax) Fail("value at the limits did not read back");
  const std::string k_over(storage::kMaxKeySize + 1, 'O');
  Resp a = Rpc(*s, proto::Opcode::kPut, k_over, "x");
  if (a.status != proto::RpcStatus::kRejected)
    Fail("a key one byte over the limit was not REJECTED");
  const std::string k2 = "value-over-limit";
  Resp b = Rpc(*s, proto::Opcode::kPut, k2, Fill(k2, storage::kMaxValueSize + 1, 1));
  if (b.status != proto::RpcStatus::kRejected) Fail("a value one byte over was not REJECTED");
  Resp c = Rpc(*s, proto::Opcode::kGet, k_over);
  Resp d = Rpc(*s, proto::Opcode::kGet, k2);
  if (d.status != proto::RpcStatus::kNotFound) Fail("the oversize value was stored");
  if (c.status == proto::RpcStatus::kOk) Fail("the oversize key was stored");
  PutAndReadBack(*s, "after-sizes", 1);
  Goodbye(*s);
  std::cout << "sizes: key " << kmax.size() << " + value " << vmax.size() << " accepted (read back "
            << (by_read ? "by RDMA READ" : "by RPC") << "); key +1 and value +1 REJECTED (\""
            << a.value << "\", \"" << b.value << "\"), not stored" << std::endl;
  return 0;
}

int ArenaFill() {
  auto s = OpenShared();
  const size_t vs = static_cast<size_t>(FLAGS_value_size);
  for (int i = 0; i < FLAGS_n; ++i) {
    const std::string key = absl::StrCat("fill-", i);
    Resp p = Rpc(*s, proto::Opcode::kPut, key, Fill(key, vs, 1));
    if (p.status != proto::RpcStatus::kOk) {
      Fail(absl::StrCat("PUT ", key, " refused with status ", static_cast<int>(p.status), ": ",
                        p.value));
    }
  }
  int by_read = 0, by_rpc = 0;
  for (int i = 0; i < FLAGS_n; ++i) {
    const std::string key = absl::StrCat("fill-", i);
    bool r = false;
    std::optional<std::string> got = Get(*s, key, &r);
    if (!got.has_value() || *got != Fill(key, vs, 1)) Fail(absl::StrCat(key, " lost"));
    (r ? by_read : by_rpc)++;
  }
  Goodbye(*s);
  std::cout << "arena_fill: " << FLAGS_n << " x " << vs << " bytes acknowledged and read back ("
            << by_read << " from the arena, " << by_rpc << " from RocksDB by RPC)" << std::endl;
  return by_rpc > 0 ? 0 : (Fail("nothing was evicted: the arena was not full"), 1);
}

int AimedKeys() {
  auto s = OpenShared();
  const storage::Geometry& g = s->g;
  const uint64_t target = storage::HashKey(g, "aimed-anchor").bucket;
  std::vector<std::string> accepted;
  std::string refused;
  Resp last{};
  for (uint64_t i = 0; refused.empty() && static_cast<int>(accepted.size()) < FLAGS_n; ++i) {
    const std::string key = absl::StrCat("aimed-", i);
    if (storage::HashKey(g, key).bucket != target) continue;
    last = Rpc(*s, proto::Opcode::kPut, key, "aimed");
    if (last.status == proto::RpcStatus::kOk) {
      accepted.push_back(key);
    } else if (last.status == proto::RpcStatus::kRejected &&
               last.value.find("index chain full") != std::string::npos) {
      refused = key;
    } else {
      Fail(absl::StrCat("PUT ", key, ": status ", static_cast<int>(last.status), ": ", last.value));
    }
  }
  if (refused.empty()) Fail(absl::StrCat(accepted.size(), " aimed keys accepted, none refused"));
  if (Get(*s, refused).has_value()) Fail("the refused key was stored");
  for (const std::string& k : accepted) {
    if (Rpc(*s, proto::Opcode::kDelete, k).status != proto::RpcStatus::kOk) Fail("DELETE " + k);
  }
  Resp again = Rpc(*s, proto::Opcode::kPut, refused, "fits");
  if (again.status != proto::RpcStatus::kOk)
    Fail("the refused key still does not fit: " + again.value);
  std::optional<std::string> got = Get(*s, refused);
  if (!got.has_value() || *got != "fits") Fail("the refused key did not read back");
  (void)Rpc(*s, proto::Opcode::kDelete, refused);
  Goodbye(*s);
  std::cout << "aimed_keys: bucket " << target << " of " << g.bucket_count << ": "
            << accepted.size() << " PUTs accepted, the next REJECTED (\"" << last.value
            << "\") and not stored; after deleting them it was accepted" << std::endl;
  return 0;
}

int Slowloris() {
  struct Conn {
    int fd = -1;
    int kind = 0;  // 0 silent, 1 half a Hello, 2 Hello then nothing
    absl::Time t0;
    bool closed = false;
    absl::Duration cut_after;
    std::string how;
  };
  std::vector<Conn> conns;
  proto::Hello h;
  h.auth_token = ReadToken();
  std::string hello;
  (void)proto::EncodeControl(h, &hello);
  for (int i = 0; i < FLAGS_n; ++i) {
    Conn c;
    c.fd = Dial();
    c.kind = i % 3;
    c.t0 = absl::Now();
    if (c.kind == 1) {
      (void)proto::WriteAll(c.fd, proto::AsBytes(std::string_view(hello).substr(0, 20)),
                            Deadline());
    } else if (c.kind == 2) {
      (void)proto::WriteAll(c.fd, proto::AsBytes(hello), Deadline());
    }
    conns.push_back(c);
  }
  const absl::Duration bound = absl::Seconds(FLAGS_handshake_timeout_s * 2 + 3);
  const absl::Time deadline = absl::Now() + bound + absl::Seconds(5);
  size_t open = conns.size();
  while (open > 0) {
    if (absl::Now() > deadline) Fail(absl::StrCat(open, " connections were never cut"));
    std::vector<pollfd> p;
    for (const Conn& c : conns) p.push_back({c.fd, static_cast<short>(c.closed ? 0 : POLLIN), 0});
    if (poll(p.data(), p.size(), 100) <= 0) continue;
    for (size_t i = 0; i < conns.size(); ++i) {
      Conn& c = conns[i];
      if (c.closed || (p[i].revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
      absl::StatusOr<proto::ControlMessage> m = proto::ReadControl(c.fd, Deadline());
      if (m.ok() && std::holds_alternative<proto::Welcome>(*m)) continue;  // kind 2
      if (m.ok() && std::holds_alternative<proto::Keepalive>(*m)) continue;
      if (m.ok()) {
        if (auto* g = std::get_if<proto::Goodbye>(&*m)) {
          if (g->reason != proto::GoodbyeReason::kIdleTimeout) Fail("Goodbye with another reason");
          c.how = g->message;
          continue;  // the close follows
        }
        Fail(absl::StrCat("unexpected ", TypeName(*m)));
      }
      c.closed = true;
      c.cut_after = absl::Now() - c.t0;
      --open;
      close(c.fd);
    }
  }
  absl::Duration worst;
  int goodbyes = 0;
  for (const Conn& c : conns) {
    worst = std::max(worst, c.cut_after);
    if (!c.how.empty()) ++goodbyes;
    if (c.cut_after > bound) {
      Fail(absl::StrCat("kind ", c.kind, " cut after ", absl::FormatDuration(c.cut_after)));
    }
    if (c.cut_after < absl::Seconds(FLAGS_handshake_timeout_s) - absl::Milliseconds(200)) {
      Fail(absl::StrCat("kind ", c.kind,
                        " cut before the handshake timeout: ", absl::FormatDuration(c.cut_after)));
    }
  }
  if (goodbyes != FLAGS_n) Fail(absl::StrCat("only ", goodbyes, " got Goodbye{idle timeout}"));
  std::cout << "slowloris: " << FLAGS_n
            << " unfinished handshakes (silent, half a Hello, Hello without ClientQp) each cut "
               "with Goodbye{idle timeout}, the last after "
            << absl::FormatDuration(worst) << std::endl;
  return 0;
}

int CountFds(int pid) {
  DIR* d = opendir(absl::StrCat("/proc/", pid, "/fd").c_str());
  if (d == nullptr) Fail(absl::StrCat("cannot list the node's fds: ", strerror(errno)));
  int n = 0;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] != '.') ++n;
  }
  closedir(d);
  return n;
}

int Burst() {
  absl::StatusOr<proto::HostPort> hp = proto::ParseHostPort(FLAGS_server);
  if (!hp.ok() || (hp->host != "127.0.0.1" && hp->host != "::1" && hp->host != "localhost")) {
    Fail("burst runs against a loopback address only");
  }
  if (FLAGS_node_pid <= 0 || FLAGS_max_node_fds <= 0) Fail("--node_pid and --max_node_fds");
  rlimit rl{};
  getrlimit(RLIMIT_NOFILE, &rl);
  rl.rlim_cur = std::max<rlim_t>(rl.rlim_cur, std::min<rlim_t>(rl.rlim_max, FLAGS_n + 64));
  setrlimit(RLIMIT_NOFILE, &rl);
  const int base_fds = CountFds(FLAGS_node_pid);
  int max_fds = base_fds;
  std::vector<int> fds;
  for (int i = 0; i < FLAGS_n; ++i) {
    fds.push_back(Dial(/*nonblock=*/true));
    if (i % 50 == 0) max_fds = std::max(max_fds, CountFds(FLAGS_node_pid));
  }
  // Wait until the node has closed every connection: at once for those
  // over its bound (Error{too many clients}), at the handshake timeout for
  // the others. fd counts are sampled meanwhile.
  int refused = 0, timed_out = 0, failed = 0;
  size_t open = fds.size();
  std::vector<bool> done(fds.size(), false);
  std::vector<std::string> inbuf(fds.size());
  const absl::Time deadline = absl::Now() + absl::Seconds(FLAGS_timeout_s);
  while (open > 0) {
    max_fds = std::max(max_fds, CountFds(FLAGS_node_pid));
    if (absl::Now() > deadline) break;
    std::vector<pollfd> p;
    for (size_t i = 0; i < fds.size(); ++i) {
      p.push_back({fds[i], static_cast<short>(done[i] ? 0 : POLLIN), 0});
    }
    if (poll(p.data(), p.size(), 100) <= 0) continue;
    for (size_t i = 0; i < fds.size(); ++i) {
      if (done[i] || (p[i].revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
      char buf[4096];
      const ssize_t n = recv(fds[i], buf, sizeof(buf), MSG_DONTWAIT);
      if (n > 0) {
        inbuf[i].append(buf, static_cast<size_t>(n));
        continue;
      }
      if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
      done[i] = true;
      --open;
      if (n < 0 && inbuf[i].empty()) {
        ++failed;  // reset or refused by the kernel (backlog)
        continue;
      }
      absl::StatusOr<proto::ControlMessage> m = proto::DecodeControlFrame(proto::AsBytes(inbuf[i]));
      if (m.ok() && std::holds_alternative<proto::Error>(*m) &&
          std::get<proto::Error>(*m).code == proto::ErrorCode::kTooManyClients) {
        ++refused;
      } else if (m.ok() && std::holds_alternative<proto::Goodbye>(*m)) {
        ++timed_out;
      } else {
        ++failed;
      }
    }
  }
  // Of the connections still open, which ones did the kernel never finish
  // connecting (SYN dropped by a full listen backlog, still in SYN retry)?
  int unconnected = 0;
  for (size_t i = 0; i < fds.size(); ++i) {
    sockaddr_storage peer{};
    socklen_t len = sizeof(peer);
    if (!done[i] && getpeername(fds[i], reinterpret_cast<sockaddr*>(&peer), &len) != 0) {
      ++unconnected;
    }
  }
  for (int fd : fds) close(fd);
  Note(absl::StrCat("node fds: ", base_fds, " before, at most ", max_fds, " during (bound ",
                    FLAGS_max_node_fds, ")"));
  if (max_fds > FLAGS_max_node_fds) {
    Fail(absl::StrCat("the node held ", max_fds, " fds, over the bound ", FLAGS_max_node_fds));
  }
  if (open > 0) {
    Fail(absl::StrCat(open, " connections neither refused nor cut in time (", unconnected,
                      " of them never connected: SYN dropped by a full listen backlog)"));
  }
  if (refused == 0) Fail("no connection was refused over the bound");
  std::cout << "burst: " << FLAGS_n << " connections: " << refused
            << " refused at once (Error{too many clients}), " << timed_out
            << " cut at the handshake timeout, " << failed << " reset/refused by the kernel; "
            << "node fds " << base_fds << " -> max " << max_fds << std::endl;
  return 0;
}

int AdminProbe() {
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un sun{};
  sun.sun_family = AF_UNIX;
  if (FLAGS_admin_socket.size() >= sizeof(sun.sun_path)) Fail("path too long");
  std::memcpy(sun.sun_path, FLAGS_admin_socket.data(), FLAGS_admin_socket.size());
  if (connect(fd, reinterpret_cast<sockaddr*>(&sun), sizeof(sun)) != 0) {
    std::cout << "admin_probe: connect refused: " << strerror(errno) << std::endl;
    return 0;
  }
  const std::string line = FLAGS_cmd + "\n";
  // The node may refuse (SO_PEERCRED) and close before this is written: that
  // is an answer, not a reason to die of SIGPIPE.
  (void)!send(fd, line.data(), line.size(), MSG_NOSIGNAL);
  std::string out;
  char buf[4096];
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(FLAGS_timeout_s * 1000)) <= 0) break;
    const ssize_t n = read(fd, buf, sizeof(buf));
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  if (out.empty()) {
    std::cout << "admin_probe: closed without an answer" << std::endl;
  } else {
    std::cout << "admin_probe: answered: " << out.substr(0, 80) << std::endl;
  }
  return 0;
}

// --rpcs "LABEL:OP:KEY:VALUE:SEQ[:COUNT],...": one session per label (a new
// client id, or the one --ids gives it), the RPCs in order.
int Rpcs() {
  std::map<std::string, std::pair<uint64_t, proto::ResumeSecret>> ids;
  for (absl::string_view kv : absl::StrSplit(FLAGS_ids, ',', absl::SkipEmpty())) {
    std::vector<std::string> p = absl::StrSplit(kv, absl::ByAnyChar("=:"));
    uint64_t id = 0;
    std::string secret;
    if (p.size() != 3 || !absl::SimpleAtoi(p[1], &id) ||
        p[2].size() != 2 * proto::kResumeSecretSize ||
        p[2].find_first_not_of("0123456789abcdef") != std::string::npos) {
      Fail(absl::StrCat("--ids: '", kv, "'"));
    }
    secret = absl::HexStringToBytes(p[2]);
    proto::ResumeSecret rs{};
    std::copy(secret.begin(), secret.end(), rs.begin());
    ids[p[0]] = {id, rs};
  }
  std::map<std::string, std::unique_ptr<Session>> sessions;
  for (absl::string_view item : absl::StrSplit(FLAGS_rpcs, ',', absl::SkipEmpty())) {
    std::vector<std::string> f = absl::StrSplit(item, ':');
    uint64_t seq = 0;
    int count = 1;
    if ((f.size() != 5 && f.size() != 6) || !absl::SimpleAtoi(f[4], &seq) ||
        (f.size() == 6 && !absl::SimpleAtoi(f[5], &count))) {
      Fail(absl::StrCat("--rpcs: '", item, "'"));
    }
    const std::string &label = f[0], &opname = f[1], &key = f[2], &value = f[3];
    proto::Opcode op = proto::Opcode::kPut;
    if (opname == "delete") {
      op = proto::Opcode::kDelete;
    } else if (opname == "get") {
      op = proto::Opcode::kGet;
    } else if (opname != "put") {
      Fail("--rpcs: OP must be put, delete or get");
    }
    std::unique_ptr<Session>& s = sessions[label];
    if (s == nullptr) {
      const uint64_t want = ids.count(label) ? ids[label].first : 0;
      s = want != 0 ? Resume(want, ids[label].second) : OpenShared();
      if (want != 0 && s->w.client_id != want) {
        Fail(absl::StrCat("asked to resume client ", want, ", got ", s->w.client_id));
      }
    }
    Resp r{};
    for (int i = 0; i < std::max(count, 1); ++i, ++seq) {
      const std::string v = i == 0 ? value : absl::StrCat(value, "-", i);
      r = RawRpc(*s, HandRequest(op, s->w.client_id, seq, key,
                                 op == proto::Opcode::kPut ? std::string_view(v) : ""));
      if (r.sequence != seq) Fail("response sequence mismatch");
    }
    std::cout << "rpcs: " << label << " client " << s->w.client_id << " secret "
              << Hex(s->w.resume_secret) << " seq " << seq - 1 << " " << opname << " " << key
              << " -> " << proto::RpcStatusName(r.status) << " version " << r.version << " value '"
              << r.value << "'" << std::endl;
  }
  for (auto& [label, s] : sessions) Goodbye(*s);
  return 0;
}

int Main() {
  const std::string& m = FLAGS_mode;
  if (m == "rpcs") return Rpcs();
  if (m == "bad_auth_qpn") return BadAuthQpn();
  if (m == "window_attack") return WindowAttack();
  if (m == "rejoin") return Rejoin();
  if (m == "hijack") return Hijack();
  if (m == "max_clients") return MaxClients();
  if (m == "credits") return Credits();
  if (m == "sizes") return Sizes();
  if (m == "arena_fill") return ArenaFill();
  if (m == "aimed_keys") return AimedKeys();
  if (m == "slowloris") return Slowloris();
  if (m == "burst") return Burst();
  if (m == "admin_probe") return AdminProbe();
  Fail("unknown --mode");
}

}  // namespace

int main(int argc, char** argv) {
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  kvnode::e2e::Config() = {"security_client",     FLAGS_mode,        FLAGS_server,
                           FLAGS_auth_token_file, FLAGS_rdma_device, FLAGS_timeout_s};
  return Main();
}
