// libkvclient: a client session with one kvnode.
//
// A Client connects over TCP (Hello -> Welcome -> ClientQp -> Ready, see
// docs/protocol.md), opens its own verbs device context and one RC QP to the
// node, then:
//   - GET  = one-sided RDMA READs of the node's arena, decoded by the storage
//            read path (storage/read_path.h); torn reads are retried, and
//            after ClientOptions.max_read_retries, for non-resident keys
//            (kSlowPath) or without a usable geometry, the GET goes by RPC;
//   - PUT, DELETE, RPC GET, PING = SEND/RECV RPCs, never more outstanding than
//            the server's credits, each carrying (client id, sequence); a
//            retry reuses the sequence, so the server applies a write once.
// Up to ClientOptions.max_outstanding operations are in flight at once on
// the one QP (the asynchronous API: Submit + Poll). Every operation has a
// deadline and fails only when it passes. A write (PUT, DELETE) the server
// answered BUSY (writes paused during a live upgrade) is held: it leaves the
// max_outstanding budget and waits in a budget of its own
// (max_outstanding_writes, bounding every write in flight), re-sent with its
// sequence until it is applied, so GETs keep being issued and answered
// while writes wait.
//
// Resilience (the contract with the server, see docs/protocol.md):
//   - Move (live upgrade): the client opens a new session at the given
//     endpoint with the same client id while GETs keep being served by READs
//     on the old QP (RPCs wait for the new session); once the new session is
//     up, what is outstanding on the old QP finishes (BUSY answers are
//     retried on the new session) or is flushed, what did not finish is
//     retried with the same sequences, then MoveAck and Goodbye go on the
//     old control connection and the old QP is destroyed.
//   - A lost session (control connection closed or silent for
//     keepalive_timeout, Goodbye/Error from the server, a QP error): the QP
//     is flushed and destroyed, the client reconnects to the same endpoint
//     with its client id (backing off), and retries what was in flight.
//   Both run as a state machine inside Poll: every step (TCP connect, Hello,
//   Welcome, QP setup, Ready, drain, flush) advances when its socket or
//   completion is ready and has a deadline; nothing blocks the thread, so
//   the other Clients it drives keep being served.
//
// Threading: a Client is owned by ONE thread. Every method must be called
// from that thread; nothing takes a lock. Several Clients may live in one
// thread (kvload drives several per thread) or in different threads.
// Progress (completions, keep-alives, moves, retries, deadlines) happens only
// inside Submit/Poll/Wait and the synchronous calls: call Poll at least every
// second or the server may end an idle session (the client then reconnects
// transparently on next use).
// Session events (Move, reconnect) are logged through glog on the calling
// thread. A program that sets TZ at start (kvload calls
// base::PinLocalTimeZone) keeps glibc from stat()ing /etc/localtime for each
// of those lines under its process-wide time-zone lock, which would make
// threads logging at once wait on each other (docs/upgrade.md).
//
// Resources: the Client owns its device context, PD, CQ (with a completion
// channel for Wait), QP(s) and registered buffers. Close() (or the
// destructor) says Goodbye, drains the QP and releases everything: after the
// last Client is gone, rdma::Accounting shows no live verbs object.
#ifndef KVNODE_CLIENT_CLIENT_H_
#define KVNODE_CLIENT_CLIENT_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kvnode/client/errors.h"

namespace kvnode::client {

struct ClientOptions {
  // "host:port" or "[v6]:port" of the node's control listener.
  // Default "127.0.0.1:7000".
  std::string server = "127.0.0.1:7000";
  // Shared secret sent in Hello. Default "" (a node started without
  // --auth_token_file accepts anything).
  std::string auth_token;
  // Name for the server's logs. Default "kvclient".
  std::string client_name = "kvclient";
  // Verbs device, e.g. "rxe0". Default "": the first device with an ACTIVE
  // port. Each Client opens its own context on it.
  std::string rdma_device;
  // Port on that device. Default 1.
  int rdma_port = 1;
  // GID index. Default -1: automatic (rdma::DeviceOptions).
  int gid_index = -1;

  // Operations in flight at once (the depth of the asynchronous API).
  // Default 32. 1..256. Registered memory grows with it (~52 KiB each).
  uint32_t max_outstanding = 32;
  // PUTs and DELETEs in flight at once, held ones (answered BUSY) included.
  // Default 0: max_outstanding. 0..256. Held writes do not count against
  // max_outstanding, so the client has max_outstanding + this many slots.
  uint32_t max_outstanding_writes = 0;
  // Deadline of an operation submitted without one. Default 5 s.
  absl::Duration op_timeout = absl::Seconds(5);
  // Bound on each wait for the server during a handshake (TCP connect,
  // Welcome, Ready). Default 800 ms: a dead or hung server is noticed in < 1 s.
  // When reconnecting or moving, Welcome and Ready are awaited up to
  // max(connect_timeout, op_timeout): a connection the server has accepted
  // is not abandoned for a new one that would queue behind it.
  absl::Duration connect_timeout = absl::Milliseconds(800);
  // Torn/racing READs retried before a GET falls back to RPC. Default 8.
  uint32_t max_read_retries = 8;
  // Default true: recover lost sessions (reconnect with the same client id
  // and retry in-flight operations inside their deadlines). False: a lost
  // session fails every operation with kConnectionLost.
  bool reconnect = true;
  // First and largest pause between reconnection attempts (doubling).
  // Defaults 5 ms and 200 ms.
  absl::Duration reconnect_backoff_min = absl::Milliseconds(5);
  absl::Duration reconnect_backoff_max = absl::Milliseconds(200);
  // First and largest pause before re-sending a request answered BUSY
  // (doubling). Defaults 200 us and 20 ms.
  absl::Duration busy_backoff_min = absl::Microseconds(200);
  absl::Duration busy_backoff_max = absl::Milliseconds(20);
  // A Keepalive is sent on the control connection when nothing was sent for
  // this long. Default 1 s.
  absl::Duration keepalive_interval = absl::Seconds(1);
  // The session is considered lost when nothing was received on the control
  // connection for this long although Keepalives were sent. Default 3 s.
  absl::Duration keepalive_timeout = absl::Seconds(3);
  // How long after a Move arrives the old QP's outstanding work may take to
  // finish before it is flushed (and retried on the new session); the flush
  // never happens before the new session is up. Default 1 s; a Move's own
  // deadline_ms caps it at half of that.
  absl::Duration move_drain_timeout = absl::Seconds(1);
  // QP transport: local ACK timeout exponent and retry count. Defaults 12 and
  // 2: a dead peer fails a READ after ~60 ms on rxe.
  uint8_t qp_timeout = 12;
  uint8_t qp_retry_cnt = 2;
  // Default false: use the RDMA READ fast path for GET. True: every GET is
  // an RPC (comparison and debugging).
  bool rpc_get_only = false;
  // Entries of the location cache: where heap values (too big to live in
  // their bucket) were found, so that the next GET of the key is one READ
  // of the object instead of two (bucket, then object). Bounded (rounded
  // up to a power of two; ~24 bytes each), checked on every use: a stale
  // entry costs a round trip, never a wrong value. Default 4096. 0..2^20; 0
  // disables it.
  uint32_t location_cache_entries = 4096;

  [[nodiscard]] absl::Status Validate() const;
};

enum class OpKind : uint8_t { kGet, kPut, kDelete, kPing };
const char* OpKindName(OpKind kind);  // "get", "put", "delete", "ping"

// One operation for Submit. Key and value are copied before Submit returns.
struct OpRequest {
  OpKind kind = OpKind::kGet;
  std::string_view key;    // GET/PUT/DELETE: 1..max key size bytes
  std::string_view value;  // PUT: the value; PING: echoed; else ignored
  // Fails with kTimeout/kConnectionLost when it passes. Default (infinite
  // future): submission time + ClientOptions.op_timeout.
  absl::Time deadline = absl::InfiniteFuture();
  uint64_t user_data = 0;  // returned in the OpResult
  bool force_rpc = false;  // GET: skip the READ fast path
};

struct OpResult {
  uint64_t user_data = 0;
  OpKind kind = OpKind::kGet;
  // OK, or a typed error (errors.h): NotFound for an absent key.
  absl::Status status;
  // Version of the value read (GET) or of the write applied (PUT, DELETE).
  uint64_t version = 0;
  // GET/PING when OK: the bytes. Points into the Client's buffers; valid
  // until the next Submit, Poll, Wait or Close on this Client.
  std::string_view value;
  bool via_rpc = false;       // GET: answered by the server, not by READ
  uint32_t read_retries = 0;  // GET: torn/racing READs retried
  uint32_t sends = 0;         // RPC: times the request was sent (> 1: retried)
  absl::Time submitted;
  absl::Time completed;
};

// Counters since Connect (monotonic; never reset).
struct ClientStats {
  uint64_t ops_completed = 0;
  uint64_t ops_failed = 0;
  uint64_t gets_by_read = 0;  // GETs answered by the READ fast path
  uint64_t gets_by_rpc = 0;   // GETs answered by RPC
  uint64_t reads_posted = 0;
  uint64_t read_retries = 0;   // torn/racing READs
  uint64_t rpc_fallbacks = 0;  // GETs that fell back to RPC
  uint64_t rpcs_sent = 0;
  uint64_t rpc_resends = 0;  // same sequence sent again (BUSY, lost session, move)
  uint64_t busy = 0;         // BUSY answers
  uint64_t sessions = 0;     // sessions established (1 + reconnects + moves)
  uint64_t reconnects = 0;
  uint64_t moves = 0;
  // Moves refused because the node at the Move's endpoint was not the same
  // node's next generation (CheckMoveTarget); the client stayed where it was.
  uint64_t moves_refused = 0;
  uint64_t timeouts = 0;
  uint64_t stale_responses = 0;  // responses for no in-flight op (dropped)
  // GETs through the location cache that found the value, and those whose
  // location was stale (then read from the bucket).
  uint64_t location_hits = 0;
  uint64_t location_stale = 0;
  // GETs whose READs showed that the node no longer serves the key's slot
  // (its slot word read 0 after the data; cluster sessions with slot
  // words only): the data was not used, the GET went by RPC (and from
  // there, answered WRONG_SHARD, to the slot's owner).
  uint64_t reads_not_served = 0;
};

struct GetResult {
  std::string value;
  uint64_t version = 0;
};

class Client {
 public:
  // Connects (one attempt, each wait bounded by connect_timeout; a refused or
  // silent server fails with kConnectionLost, a refusal by the server with
  // kRejected). The verbs device is opened once the server has answered.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<Client>> Connect(ClientOptions options);

  ~Client();  // Close() with a short deadline if not closed yet.
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // --- synchronous API (only while no asynchronous op is outstanding) -------
  [[nodiscard]] absl::StatusOr<GetResult> Get(std::string_view key,
                                              absl::Time deadline = absl::InfiniteFuture());
  // Returns the version the server assigned.
  [[nodiscard]] absl::StatusOr<uint64_t> Put(std::string_view key, std::string_view value,
                                             absl::Time deadline = absl::InfiniteFuture());
  [[nodiscard]] absl::StatusOr<uint64_t> Delete(std::string_view key,
                                                absl::Time deadline = absl::InfiniteFuture());
  [[nodiscard]] absl::Status Ping(absl::Time deadline = absl::InfiniteFuture());
  // Runs one operation synchronously.
  [[nodiscard]] OpResult Execute(const OpRequest& op);

  // --- asynchronous API -------------------------------------------------------
  // Operations that may still be submitted: max_outstanding - in flight,
  // held writes not counted.
  uint32_t available() const;
  // Operations of `kind` that may still be submitted: available() for GET
  // and PING; for PUT and DELETE also bounded by max_outstanding_writes -
  // writes in flight (held or not). Pick the next operation with it to keep
  // reads going while writes are held.
  uint32_t available(OpKind kind) const;
  // Every operation in flight (held writes included; finished ones until
  // Poll returned them).
  uint32_t outstanding() const;
  // Writes in flight that the server answered BUSY and that wait to be
  // re-sent (outside max_outstanding).
  uint32_t writes_held() const;
  // Starts `op`. ResourceExhausted when available(op.kind) == 0; InvalidArgument
  // for a bad key/value (nothing started); Unavailable when the client is
  // closed or (reconnect off) the session is lost. Anything else is reported
  // in the op's OpResult. A GET's READs may go out at the next Poll or Wait
  // (a burst of Submits is posted as one chain of work requests).
  [[nodiscard]] absl::Status Submit(const OpRequest& op);
  // Makes progress without blocking and returns finished operations (at
  // most out.size()); 0 if none.
  size_t Poll(std::span<OpResult> out);
  // Blocks until a completion, a control message or `until` (or the next
  // internal timer); then call Poll. Spurious wake-ups are fine.
  void Wait(absl::Time until);
  // Wait() over several clients owned by this thread.
  static void WaitAny(std::span<Client* const> clients, absl::Time until);

  // --- session ------------------------------------------------------------------
  // Says Goodbye (reason "client done": this id is never resumed, so the
  // node drops its dedupe record), fails whatever is outstanding with
  // Unavailable after giving it until `deadline` to finish, drains the QP
  // and releases every verbs object and buffer. Idempotent.
  absl::Status Close(absl::Time deadline = absl::Now() + absl::Seconds(1));

  uint64_t client_id() const;
  uint64_t server_generation() const;
  bool connected() const;               // a session is up right now
  bool fast_get() const;                // the READ fast path is usable (geometry known)
  const std::string& endpoint() const;  // where the current session is
  const ClientStats& stats() const;
  const ClientOptions& options() const;

  class Impl;

 private:
  explicit Client(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvnode::client

#endif  // KVNODE_CLIENT_CLIENT_H_
