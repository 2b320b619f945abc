// Internals of kvnode::client::Client (not installed). Split by concern:
//   control.cc   TCP connect, the Hello..Ready handshake, control frames
//   session.cc   Session: QP, receive buffers, teardown
//   client.cc    Connect/Close, lost sessions, Move, synchronous API
//   datapath.cc  hot path: Submit, Poll, completions, GET read path, RPCs
//
// Owned by one thread (see client.h); no locks anywhere.
#ifndef KVNODE_CLIENT_LIB_CLIENT_IMPL_H_
#define KVNODE_CLIENT_LIB_CLIENT_IMPL_H_

#include <poll.h>

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kvnode/client/client.h"
#include "kvnode/proto/control.h"
#include "kvnode/proto/rpc.h"
#include "kvnode/rdma/cq.h"
#include "kvnode/rdma/device.h"
#include "kvnode/rdma/memory.h"
#include "kvnode/rdma/mr.h"
#include "kvnode/rdma/pd.h"
#include "kvnode/rdma/qp.h"
#include "kvnode/storage/format.h"
#include "kvnode/storage/read_path.h"

namespace kvnode::client {

// --- control connection (control.cc) ----------------------------------------

// A connected TCP socket (non-blocking), closed on destruction.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  Fd& operator=(Fd&& o) noexcept;
  ~Fd() { Reset(); }
  int get() const { return fd_; }
  void Reset();

 private:
  int fd_ = -1;
};

// TCP connect to "host:port" before `deadline`; TCP_NODELAY, non-blocking.
// Unavailable when refused/unreachable, DeadlineExceeded when silent.
absl::StatusOr<Fd> TcpConnect(const std::string& endpoint, absl::Time deadline);

// Maps an Error frame from the server to a typed status.
absl::Status ServerErrorStatus(const proto::Error& e, std::string_view during);

// --- wr_id layout -------------------------------------------------------------
// bits 32..63 session epoch, bit 31 receive, bits 0..30 slot or receive index.
inline uint64_t MakeWrId(uint32_t epoch, bool recv, uint32_t index) {
  return (uint64_t{epoch} << 32) | (recv ? (1u << 31) : 0u) | index;
}
inline uint32_t WrEpoch(uint64_t wr_id) { return static_cast<uint32_t>(wr_id >> 32); }
inline bool WrIsRecv(uint64_t wr_id) { return (wr_id & (1u << 31)) != 0; }
inline uint32_t WrIndex(uint64_t wr_id) { return static_cast<uint32_t>(wr_id) & ~(1u << 31); }

// --- session (session.cc) --------------------------------------------------------

// One connection to one server process: the control socket, the RC QP and
// its receive buffers. A Client has one, and two while it moves.
struct Session {
  uint32_t epoch = 0;  // tags this session's wr_ids
  std::string endpoint;
  proto::Welcome welcome;
  std::optional<storage::Geometry> geometry;  // nullopt: no READ fast path

  Fd fd;
  proto::FrameAssembler assembler;
  // Receive buffers: one of the Client's two pre-registered sides (a Move
  // needs two sessions at once; registering per session would lengthen the
  // blackout). Owned by Impl, which outlives every Session.
  uint32_t side = 0;
  rdma::Mr* recv_mr = nullptr;
  const uint8_t* recv_base = nullptr;
  std::unique_ptr<rdma::Qp> qp;

  uint32_t recv_buffers = 0;      // posted at connect, reposted after each response
  uint32_t credits = 0;           // min(Welcome.max_rpc_credits, recv_buffers)
  uint32_t rpcs_outstanding = 0;  // requests sent minus responses received

  absl::Time last_rx;   // last control frame received
  absl::Time last_tx;   // last control frame sent
  bool moving = false;  // Move received: post nothing new here
  proto::Move move;
  absl::Time move_drain_deadline;
  bool broken = false;  // lost: drain and destroy
  absl::Status broken_why;
};

// --- operation slots -----------------------------------------------------------

struct Slot {
  enum class State : uint8_t {
    kFree,
    kQueued,   // waiting in Impl::queue_ (credits, backoff, session)
    kReading,  // READ posted (read_outstanding)
    kRpc,      // request sent, waiting for the response
    kDone,     // finished; in done_ until Poll reports it, then freed when
               // no work request names its buffers any more
  };
  State state = State::kFree;
  OpKind kind = OpKind::kGet;
  uint64_t user_data = 0;
  absl::Time deadline;
  absl::Time submitted;
  absl::Time not_before;  // queued: earliest retry (BUSY backoff)
  std::string key;        // capacity reserved once
  // RPC: sequence (0 = none yet); the request is encoded in the send buffer
  // (send_len bytes) and re-sent unchanged on retry.
  uint64_t sequence = 0;
  uint32_t send_len = 0;
  bool use_rpc = false;  // GET: go by RPC
  bool force_rpc = false;
  // GET read path.
  storage::ReadStep step;
  uint32_t read_attempts = 0;  // FirstRead restarts (torn reads)
  uint32_t reads = 0;          // READs issued for this GET
  // Work requests of this slot not yet completed, and where they were posted.
  uint8_t reads_outstanding = 0;
  uint8_t sends_outstanding = 0;
  bool awaiting_response = false;
  bool in_queue = false;  // an entry for this slot is in Impl::queue_
  bool reported = false;  // returned by Poll
  uint32_t epoch = 0;     // session epoch of the outstanding work
  uint32_t sends = 0;
  uint32_t busy_count = 0;
  uint32_t internal_count = 0;
  // Result (GET/PING value is in the slot's read buffer).
  absl::Status status;
  uint64_t version = 0;
  uint32_t value_off = 0;  // value at ReadBuf + value_off
  uint32_t value_len = 0;
  bool via_rpc = false;
};

class Client::Impl {
 public:
  explicit Impl(ClientOptions options) : options_(std::move(options)) {}
  ~Impl();

  // client.cc
  absl::Status Init();  // device, PD, CQ, slot buffers, first session
  absl::Status Close(absl::Time deadline);
  OpResult Execute(const OpRequest& op);

  // datapath.cc
  absl::Status Submit(const OpRequest& op);
  size_t Poll(std::span<OpResult> out);
  void Wait(absl::Time until);
  void AppendWaitFds(std::vector<struct pollfd>* fds, absl::Time* until);
  uint32_t available() const { return static_cast<uint32_t>(free_.size()); }
  uint32_t outstanding() const { return options_.max_outstanding - available(); }

  ClientOptions options_;
  ClientStats stats_;
  uint64_t client_id_ = 0;
  uint64_t generation_ = 0;
  std::string endpoint_;  // current endpoint (changes with Move)
  bool closed_ = false;

 private:
  friend class Client;

  // --- client.cc: sessions -------------------------------------------------
  // One connection attempt to `endpoint` with client_id_ (0: new id). Each
  // wait for the server (TCP connect, Welcome, Ready) is bounded by
  // options_.connect_timeout; local verbs setup is not.
  absl::StatusOr<std::unique_ptr<Session>> OpenSession(const std::string& endpoint);
  absl::Status Handshake(Session* s);
  // Tears a session down: QP to ERR, drain (flushed work requests of slots
  // are accounted and the slots requeued), destroy, close the socket after
  // sending `goodbye` if set.
  void DestroySession(std::unique_ptr<Session>& holder, bool say_goodbye);
  // Lost session: destroy it and schedule reconnection.
  void OnSessionLost(std::unique_ptr<Session>& holder);
  // Reconnect when due; true if a session is up afterwards.
  bool MaybeReconnect(absl::Time now);
  // The Move state machine, from Poll.
  void ProgressMove(absl::Time now);
  // Control frames: reads what arrived, handles Keepalive/Move/Goodbye/...
  void PollControl(Session* s, absl::Time now);
  void SendControl(Session* s, const proto::ControlMessage& m);

  // --- datapath.cc -------------------------------------------------------------
  int PollCq();
  void OnCompletion(const rdma::Completion& c);
  void OnReadDone(uint32_t idx, Slot& slot);
  void OnResponse(Session* s, uint32_t recv_index, uint32_t byte_len);
  // Starts (or restarts) a slot on the current session, or queues it.
  void Start(uint32_t idx);
  void PostRead(uint32_t idx, Slot& slot);
  void SendRpc(uint32_t idx, Slot& slot);
  absl::Status EncodeRpc(uint32_t idx, std::string_view value);
  void MarkBroken(Session* s, absl::Status why);
  void Requeue(uint32_t idx, absl::Time not_before);
  void Finish(uint32_t idx, absl::Status status);
  void MaybeFree(uint32_t idx);
  void RunQueue(absl::Time now);
  void CheckDeadlines(absl::Time now);
  void RepostRecv(Session* s, uint32_t recv_index);
  Session* SessionByEpoch(uint32_t epoch);
  bool SessionUsable() const {
    return current_ != nullptr && !current_->broken && !current_->moving;
  }
  char* SendBuf(uint32_t idx) { return static_cast<char*>(slot_mem_.data()) + idx * kSlotStride; }
  char* ReadBuf(uint32_t idx) { return SendBuf(idx) + kSendBufSize; }

 public:
  static constexpr uint32_t kSendBufSize = (proto::kMaxRpcMessageSize + 63) / 64 * 64;
  static constexpr uint32_t kReadBufSize = (storage::kMaxObjectSize + 63) / 64 * 64;
  static constexpr uint32_t kSlotStride = kSendBufSize + kReadBufSize;
  static constexpr uint32_t kRecvBufSize = kSendBufSize;

 private:
  // Declared in creation order so C++ releases them in teardown order:
  // sessions (QPs, receive MRs) first, then the slot MR, its memory, the CQ,
  // the PD and last the device context.
  std::shared_ptr<rdma::Device> device_;
  std::shared_ptr<rdma::Pd> pd_;
  std::shared_ptr<rdma::Cq> cq_;
  rdma::HostMemory slot_mem_;
  std::shared_ptr<rdma::Mr> slot_mr_;
  rdma::HostMemory recv_mem_[2];
  std::shared_ptr<rdma::Mr> recv_mr_[2];
  bool side_in_use_[2] = {false, false};
  std::unique_ptr<Session> old_;      // the session being left by a Move
  std::unique_ptr<Session> current_;  // where new work goes

  std::vector<Slot> slots_;
  std::vector<uint32_t> free_;
  std::deque<uint32_t> queue_;  // slots in State::kQueued
  std::deque<uint32_t> done_;   // finished, not yet returned by Poll
  uint64_t next_sequence_ = 1;
  uint32_t next_epoch_ = 1;
  uint32_t sync_tag_ = 0;

  // Reconnection.
  bool need_reconnect_ = false;
  absl::Time next_reconnect_;
  absl::Duration reconnect_backoff_;
  absl::Status last_connect_error_;

  absl::Time next_control_check_;
  absl::Time next_deadline_check_;
};

}  // namespace kvnode::client

#endif  // KVNODE_CLIENT_LIB_CLIENT_IMPL_H_
