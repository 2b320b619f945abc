// The wire-protocol peer the e2e test clients (kvnode_raw_client,
// kvnode_security_client) are built on: connect, handshake and QP setup,
// RPCs and RDMA READs with kvproto + kvrdma directly (no libkvclient), so
// that a client can also misbehave on purpose.
//
// A test tool, not a library for the node: every broken expectation ends the
// process through Fail() ("TOOL[MODE]: FAIL: why" on stderr, exit 1), which
// is the tools' contract with the e2e scripts.
#pragma once

#include <infiniband/verbs.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <variant>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "kvnode/proto/control.h"
#include "kvnode/proto/rpc.h"
#include "kvnode/rdma/cq.h"
#include "kvnode/rdma/device.h"
#include "kvnode/rdma/memory.h"
#include "kvnode/rdma/mr.h"
#include "kvnode/rdma/pd.h"
#include "kvnode/rdma/qp.h"
#include "kvnode/storage/format.h"

namespace kvnode::e2e {

// What every peer takes from its tool's flags: main() fills it in once,
// before anything below is used.
struct PeerConfig {
  std::string tool = "test_peer";         // stderr lines start "TOOL[MODE]: "
  std::string mode;                       // the tool's --mode
  std::string server = "127.0.0.1:7000";  // the node's control address
  std::string auth_token_file;            // "": Hello carries no token
  std::string rdma_device;                // "": the first ACTIVE device
  double timeout_s = 10;                  // deadline of each expected answer
};
PeerConfig& Config();

// "TOOL[MODE]: FAIL: why" on stderr, then _exit(1).
[[noreturn]] void Fail(const std::string& why);
// "TOOL[MODE]: what" on stderr.
void Note(const std::string& what);

// Now + Config().timeout_s, for the control channel and for completions.
absl::Time Deadline();
rdma::Deadline RdmaDeadline();

// The token of Config().auth_token_file without its trailing newline.
std::string ReadToken();
// A TCP connection to Config().server (TCP_NODELAY). With `nonblock` the
// connect may still be in progress.
int Dial(bool nonblock = false);

std::string TypeName(const proto::ControlMessage& m);
proto::QpInfo ToQpInfo(const rdma::PeerInfo& me);

// A device, PD and CQ (members in creation order).
struct Verbs {
  std::shared_ptr<rdma::Device> dev;
  std::shared_ptr<rdma::Pd> pd;
  std::shared_ptr<rdma::Cq> cq;
};
// Opens Config().rdma_device (Fail on error).
Verbs OpenVerbs(const rdma::CqOptions& cq_options);

// A session: the control connection, one QP and a 128 KiB registered buffer
// (receive, send and READ areas). While it is open, its keepalives are
// answered whenever the peer waits on another session (PumpLive).
struct Session {
  static constexpr uint64_t kRecvOff = 0;
  static constexpr uint64_t kSendOff = 32768;
  static constexpr uint64_t kReadOff = 65536;
  static constexpr uint64_t kBytes = 131072;

  int fd = -1;
  proto::Welcome w;
  storage::Geometry g;
  // Teardown order: QP, then MR (both in ~Session), then the verbs.
  Verbs verbs;
  rdma::HostMemory mem;
  std::shared_ptr<rdma::Mr> mr;
  std::unique_ptr<rdma::Qp> qp;
  uint64_t seq = 1;   // next RPC sequence, for a tool that counts per session
  uint64_t wr = 1;    // next work request id
  bool dead = false;  // the node closed it: not pumped any more

  ~Session();
};

struct OpenOptions {
  uint64_t client_id = 0;               // 0: a new client id; else resume this one
  proto::ResumeSecret resume_secret{};  // with client_id: its Welcome.resume_secret
  rdma::QpOptions qp;                   // our QP's options (remote_access forced to 0)
  const Verbs* verbs = nullptr;         // nullptr: a device, PD and CQ of the session's own
  bool finish = true;                   // false: stop after Welcome (no QP, no Ready)
  uint64_t features = 0;                // Hello.features
};
// Verbs, buffer and MR, then Hello (client name Config().tool, the token)
// .. Welcome .. QP, ClientQp .. Ready.
std::unique_ptr<Session> Open(const OpenOptions& o = OpenOptions());
void Goodbye(Session& s);

// Answers the pending keepalives of every open session but `skip`; any other
// message on one of them is a failure.
void PumpLive(const Session* skip = nullptr);
// The next message on fd other than a keepalive (answered) or a keepalive
// ack, the open sessions but `self` pumped meanwhile. An error status on EOF
// or at the deadline.
absl::StatusOr<proto::ControlMessage> NextMessage(int fd, const Session* self);

template <typename T>
T Expect(int fd, const char* what, const Session* self = nullptr) {
  absl::StatusOr<proto::ControlMessage> m = NextMessage(fd, self);
  if (!m.ok()) Fail(absl::StrCat("waiting for ", what, ": ", m.status().ToString()));
  if (auto* t = std::get_if<T>(&*m)) return *t;
  if (auto* e = std::get_if<proto::Error>(&*m)) {
    Fail(absl::StrCat("waiting for ", what, ": got Error ", static_cast<uint32_t>(e->code), ": ",
                      e->message));
  }
  if (auto* g = std::get_if<proto::Goodbye>(&*m)) {
    Fail(absl::StrCat("waiting for ", what, ": got Goodbye: ", g->message));
  }
  Fail(absl::StrCat("waiting for ", what, ": got ", TypeName(*m)));
}

// Expects Error{code} and then the node closing the connection. Returns the
// error's text.
std::string ExpectErrorThenClose(int fd, proto::ErrorCode code, const Session* self = nullptr);

struct Resp {
  proto::RpcStatus status;
  uint64_t sequence;
  uint64_t version;
  std::string value;
};
// Sends `bytes` as one RPC and waits for the answer (copied out).
Resp RawRpc(Session& s, std::string_view bytes);

// RDMA READ of the arena at `offset` with `rkey`; returns the completion
// status (`out` gets the bytes on success when not null).
ibv_wc_status Read(Session& s, uint64_t offset, uint32_t len, uint32_t rkey, std::string* out);
// GET by RDMA READ with the storage read path: 1 found, 0 not found, -1 the
// server must be asked.
int ReadGet(Session& s, const std::string& key, std::string* value);

// A value of `size` bytes that names its key and round.
std::string Fill(const std::string& key, size_t size, int round);

}  // namespace kvnode::e2e
