#include "test_peer.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <span>
#include <utility>
#include <vector>

#include "absl/time/clock.h"
#include "kvnode/proto/frame_io.h"
#include "kvnode/storage/read_path.h"

namespace kvnode::e2e {
namespace {

// The sessions whose keepalives PumpLive answers.
std::vector<Session*>& Live() {
  static auto* live = new std::vector<Session*>;
  return *live;
}

}  // namespace

PeerConfig& Config() {
  static auto* config = new PeerConfig;
  return *config;
}

void Fail(const std::string& why) {
  std::cerr << Config().tool << "[" << Config().mode << "]: FAIL: " << why << std::endl;
  _exit(1);
}

void Note(const std::string& what) {
  std::cerr << Config().tool << "[" << Config().mode << "]: " << what << std::endl;
}

absl::Time Deadline() { return absl::Now() + absl::Seconds(Config().timeout_s); }

rdma::Deadline RdmaDeadline() {
  return rdma::DeadlineIn(
      std::chrono::milliseconds(static_cast<int64_t>(Config().timeout_s * 1000)));
}

std::string ReadToken() {
  const std::string& path = Config().auth_token_file;
  if (path.empty()) return "";
  FILE* f = fopen(path.c_str(), "r");
  if (f == nullptr) Fail("cannot open token file");
  char buf[2048];
  const size_t n = fread(buf, 1, sizeof(buf), f);
  fclose(f);
  std::string t(buf, n);
  while (!t.empty() && (t.back() == '\n' || t.back() == '\r')) t.pop_back();
  return t;
}

int Dial(bool nonblock) {
  const std::string& server = Config().server;
  absl::StatusOr<proto::HostPort> hp = proto::ParseHostPort(server);
  if (!hp.ok()) Fail(hp.status().ToString());
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(hp->host.c_str(), std::to_string(hp->port).c_str(), &hints, &res) != 0) {
    Fail("getaddrinfo");
  }
  const int fd =
      socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC | (nonblock ? SOCK_NONBLOCK : 0), 0);
  if (fd < 0) Fail(absl::StrCat("socket: ", strerror(errno)));
  if (connect(fd, res->ai_addr, res->ai_addrlen) != 0 && !(nonblock && errno == EINPROGRESS)) {
    Fail(absl::StrCat("connect ", server, ": ", strerror(errno)));
  }
  freeaddrinfo(res);
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return fd;
}

std::string TypeName(const proto::ControlMessage& m) {
  return proto::MessageTypeName(static_cast<uint16_t>(proto::TypeOf(m)));
}

proto::QpInfo ToQpInfo(const rdma::PeerInfo& me) {
  proto::QpInfo q;
  q.qpn = me.qp_num;
  q.psn = me.psn;
  std::memcpy(q.gid.data(), me.gid, 16);
  q.lid = me.lid;
  q.mtu = me.mtu;
  q.port = me.port;
  return q;
}

Verbs OpenVerbs(const rdma::CqOptions& cq_options) {
  Verbs v;
  rdma::DeviceOptions dopt;
  dopt.name = Config().rdma_device;
  auto dev = rdma::Device::Open(dopt);
  if (!dev.ok()) Fail(dev.status().ToString());
  v.dev = *dev;
  auto pd = rdma::Pd::Create(v.dev);
  if (!pd.ok()) Fail(pd.status().ToString());
  v.pd = *pd;
  auto cq = rdma::Cq::Create(v.dev, cq_options);
  if (!cq.ok()) Fail(cq.status().ToString());
  v.cq = *cq;
  return v;
}

Session::~Session() {
  std::vector<Session*>& live = Live();
  live.erase(std::remove(live.begin(), live.end(), this), live.end());
  qp.reset();
  if (mr) (void)rdma::SafeDeregister(*mr, rdma::DeadlineIn(std::chrono::seconds(2)));
  if (fd >= 0) close(fd);
}

void PumpLive(const Session* skip) {
  for (Session* s : Live()) {
    if (s == skip || s->dead) continue;
    for (;;) {
      pollfd p{s->fd, POLLIN, 0};
      if (poll(&p, 1, 0) <= 0) break;
      auto m = proto::ReadControl(s->fd, Deadline());
      if (!m.ok()) {
        Fail(absl::StrCat("session of client ", s->w.client_id,
                          " lost its control connection: ", m.status().ToString()));
      }
      if (auto* k = std::get_if<proto::Keepalive>(&*m)) {
        (void)proto::WriteControl(s->fd, proto::KeepaliveAck{k->nonce}, Deadline());
      } else if (auto* e = std::get_if<proto::Error>(&*m)) {
        Fail(absl::StrCat("session of client ", s->w.client_id, ": node sent Error ",
                          static_cast<uint32_t>(e->code), ": ", e->message));
      } else if (auto* g = std::get_if<proto::Goodbye>(&*m)) {
        Fail(absl::StrCat("session of client ", s->w.client_id,
                          ": node sent Goodbye: ", g->message));
      } else if (!std::holds_alternative<proto::KeepaliveAck>(*m)) {
        Fail(absl::StrCat("session of client ", s->w.client_id, " got ", TypeName(*m)));
      }
    }
  }
}

absl::StatusOr<proto::ControlMessage> NextMessage(int fd, const Session* self) {
  const absl::Time deadline = Deadline();
  for (;;) {
    PumpLive(self);
    pollfd p{fd, POLLIN, 0};
    const int r = poll(&p, 1, 50);
    if (r == 0) {
      if (absl::Now() > deadline) return absl::DeadlineExceededError("no message in time");
      continue;
    }
    absl::StatusOr<proto::ControlMessage> m = proto::ReadControl(fd, Deadline());
    if (!m.ok()) return m.status();
    if (auto* k = std::get_if<proto::Keepalive>(&*m)) {
      (void)proto::WriteControl(fd, proto::KeepaliveAck{k->nonce}, Deadline());
      continue;
    }
    if (std::holds_alternative<proto::KeepaliveAck>(*m)) continue;
    return m;
  }
}

std::string ExpectErrorThenClose(int fd, proto::ErrorCode code, const Session* self) {
  absl::StatusOr<proto::ControlMessage> m = NextMessage(fd, self);
  if (!m.ok()) Fail(absl::StrCat("waiting for Error: ", m.status().ToString()));
  auto* e = std::get_if<proto::Error>(&*m);
  if (e == nullptr) Fail(absl::StrCat("expected Error, got ", TypeName(*m)));
  if (e->code != code) {
    Fail(absl::StrCat("expected Error code ", static_cast<uint32_t>(code), ", got ",
                      static_cast<uint32_t>(e->code), ": ", e->message));
  }
  absl::StatusOr<proto::ControlMessage> after = NextMessage(fd, self);
  if (after.ok()) Fail(absl::StrCat("the node sent ", TypeName(*after), " after Error"));
  return e->message;
}

std::unique_ptr<Session> Open(const OpenOptions& o) {
  auto s = std::make_unique<Session>();
  if (o.finish) {
    // Before dialling: the node's handshake deadline (5 s) runs from accept,
    // and opening rxe0 and registering can take longer on a loaded guest.
    // The QP comes after the Welcome (bad_auth_qpn counts QP numbers).
    s->verbs = o.verbs != nullptr ? *o.verbs : OpenVerbs(rdma::CqOptions{});
    auto mem = rdma::HostMemory::Allocate(Session::kBytes);
    if (!mem.ok()) Fail(mem.status().ToString());
    s->mem = std::move(*mem);
    auto mr = rdma::Mr::Register(s->verbs.pd, s->mem.data(), s->mem.size(), rdma::MrOptions{});
    if (!mr.ok()) Fail(mr.status().ToString());
    s->mr = *mr;
  }
  s->fd = Dial();
  proto::Hello h;
  h.client_id = o.client_id;
  h.resume_secret = o.resume_secret;
  h.auth_token = ReadToken();
  h.client_name = Config().tool;
  h.features = o.features;
  if (!proto::WriteControl(s->fd, h, Deadline()).ok()) Fail("send Hello");
  s->w = Expect<proto::Welcome>(s->fd, "Welcome");
  // No geometry: the node offers no READs to this session (GETs by RPC).
  if (!s->w.index_geometry.empty()) {
    absl::StatusOr<storage::Geometry> g = storage::Geometry::Decode(s->w.index_geometry);
    if (!g.ok()) Fail(absl::StrCat("geometry: ", g.status().ToString()));
    s->g = *g;
  }
  if (!o.finish) return s;
  rdma::QpOptions qo = o.qp;
  qo.remote_access = 0;
  auto qp = rdma::Qp::Create(s->verbs.pd, s->verbs.cq, s->verbs.cq, qo);
  if (!qp.ok()) Fail(qp.status().ToString());
  s->qp = std::move(*qp);
  rdma::PeerInfo peer;
  peer.qp_num = s->w.server_qp.qpn;
  peer.psn = s->w.server_qp.psn;
  std::memcpy(peer.gid, s->w.server_qp.gid.data(), 16);
  peer.lid = s->w.server_qp.lid;
  peer.mtu = s->w.server_qp.mtu;
  peer.port = s->w.server_qp.port;
  peer.use_grh = s->verbs.dev->is_roce() ? 1 : 0;
  if (absl::Status st = s->qp->Connect(peer); !st.ok()) Fail(st.ToString());
  proto::ClientQp cq_msg;
  cq_msg.qp = ToQpInfo(s->qp->LocalInfo());
  if (!proto::WriteControl(s->fd, cq_msg, Deadline()).ok()) Fail("send ClientQp");
  (void)Expect<proto::Ready>(s->fd, "Ready", s.get());
  Live().push_back(s.get());
  return s;
}

void Goodbye(Session& s) {
  (void)proto::WriteControl(s.fd, proto::Goodbye{proto::GoodbyeReason::kClientClose, "bye"},
                            Deadline());
}

Resp RawRpc(Session& s, std::string_view bytes) {
  PumpLive();
  const uint64_t rwr = s.wr++;
  if (absl::Status st = s.qp->PostRecv(
          rwr, rdma::LocalBuf{s.mr.get(), Session::kRecvOff, proto::kMaxRpcMessageSize});
      !st.ok()) {
    Fail(st.ToString());
  }
  std::memcpy(s.mem.bytes() + Session::kSendOff, bytes.data(), bytes.size());
  const uint64_t swr = s.wr++;
  if (absl::Status st = s.qp->PostSend(
          swr, rdma::LocalBuf{s.mr.get(), Session::kSendOff, static_cast<uint32_t>(bytes.size())});
      !st.ok()) {
    Fail(st.ToString());
  }
  auto sc = s.qp->WaitFor(swr, rdma::WrKind::kSend, RdmaDeadline());
  if (!sc.ok() || !sc->ok()) {
    Fail(absl::StrCat("send completion: ",
                      sc.ok() ? sc->ToStatus().ToString() : sc.status().ToString()));
  }
  auto rc = s.qp->WaitFor(rwr, rdma::WrKind::kRecv, RdmaDeadline());
  if (!rc.ok() || !rc->ok()) {
    Fail(absl::StrCat("recv completion: ",
                      rc.ok() ? rc->ToStatus().ToString() : rc.status().ToString()));
  }
  auto r = proto::DecodeResponse(
      std::span<const uint8_t>(s.mem.bytes() + Session::kRecvOff, rc->byte_len));
  if (!r.ok()) Fail(absl::StrCat("response: ", r.status().ToString()));
  return Resp{r->status, r->sequence, r->version, std::string(r->value)};
}

ibv_wc_status Read(Session& s, uint64_t offset, uint32_t len, uint32_t rkey, std::string* out) {
  const uint64_t wr = s.wr++;
  if (absl::Status st = s.qp->PostRead(wr, rdma::LocalBuf{s.mr.get(), Session::kReadOff, len},
                                       s.w.arena_remote_addr + offset, rkey);
      !st.ok()) {
    Fail(st.ToString());
  }
  auto c = s.qp->WaitFor(wr, rdma::WrKind::kRead, RdmaDeadline());
  if (!c.ok()) Fail(absl::StrCat("READ: no completion: ", c.status().ToString()));
  if (c->ok() && out != nullptr) {
    out->assign(reinterpret_cast<const char*>(s.mem.bytes() + Session::kReadOff), len);
  }
  return c->status;
}

int ReadGet(Session& s, const std::string& key, std::string* value) {
  for (int attempt = 0; attempt < 16; ++attempt) {
    storage::ReadStep step = storage::FirstRead(s.g, key);
    for (int hops = 0; hops < 70; ++hops) {
      std::string bytes;
      if (Read(s, step.offset, step.length, s.w.rkey, &bytes) != IBV_WC_SUCCESS) {
        Fail("READ with our own rkey failed");
      }
      storage::ReadResult r = storage::Decode(s.g, key, step, bytes);
      switch (r.outcome) {
        case storage::ReadResult::Outcome::kFound:
          value->assign(r.value);
          return 1;
        case storage::ReadResult::Outcome::kNotFound:
          return 0;
        case storage::ReadResult::Outcome::kSlowPath:
          return -1;
        case storage::ReadResult::Outcome::kNext:
          step = r.next;
          continue;
        case storage::ReadResult::Outcome::kRetry:
          break;
      }
      break;
    }
  }
  return -1;
}

std::string Fill(const std::string& key, size_t size, int round) {
  std::string v = absl::StrCat(key, "#", round, "#");
  while (v.size() < size) v.push_back(static_cast<char>('a' + v.size() % 26));
  v.resize(size);
  return v;
}

}  // namespace kvnode::e2e
