// Internals of kvnode::client::Client (not installed). Split by concern:
//   control.cc   non-blocking TCP connect and frame I/O, Error mapping
//   session.cc   the session state machine: handshake (connect, Hello,
//                Welcome, QP, Ready), Move, reconnect, drain and teardown
//   client.cc    options, Connect/Close, device setup, control messages,
//                synchronous API
//   datapath.cc  hot path: Submit, Poll, completions, GET read path, RPCs
//
// Owned by one thread (see client.h); no locks anywhere.
#ifndef KVNODE_CLIENT_LIB_CLIENT_IMPL_H_
#define KVNODE_CLIENT_LIB_CLIENT_IMPL_H_

#include <poll.h>

#include <algorithm>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kvnode/base/unique_fd.h"
#include "kvnode/client/client.h"
#include "kvnode/proto/control.h"
#include "kvnode/proto/rpc.h"
#include "kvnode/proto/shard_map.h"
#include "kvnode/rdma/cq.h"
#include "kvnode/rdma/device.h"
#include "kvnode/rdma/memory.h"
#include "kvnode/rdma/mr.h"
#include "kvnode/rdma/pd.h"
#include "kvnode/rdma/qp.h"
#include "kvnode/storage/format.h"
#include "kvnode/storage/read_path.h"
#include "location_cache.h"
#include "op_budget.h"

namespace kvnode::client {

// --- control connection (control.cc) ----------------------------------------

// A connected TCP socket (non-blocking), closed on destruction.
using Fd = base::UniqueFd;

// Starts a TCP connect to "host:port" (TCP_NODELAY, non-blocking) and returns
// the socket with the connection established or in progress: wait for
// POLLOUT, then TcpConnectDone. Unavailable when refused at once.
absl::StatusOr<Fd> TcpConnectStart(const std::string& endpoint);
// Without waiting: true once the connect of a TcpConnectStart socket has
// succeeded, false while in progress, Unavailable when it failed.
absl::StatusOr<bool> TcpConnectDone(int fd, const std::string& endpoint);
// Both, waiting until `deadline` (DeadlineExceeded when silent).
absl::StatusOr<Fd> TcpConnect(const std::string& endpoint, absl::Time deadline);

// Sends one control frame without waiting for room: a frame that does not
// fit in the socket's send buffer means the peer stopped reading, and the
// error then means "close the connection".
absl::Status SendFrame(int fd, const proto::ControlMessage& m);
// Appends whatever has arrived on `fd` to `assembler` without waiting.
// Unavailable once the peer closed (bytes before the close are appended).
absl::Status ReceiveAvailable(int fd, proto::FrameAssembler* assembler);
// poll() on `fds` until one is ready or `until` (at most 1 s); EINTR retried.
void PollFds(std::span<pollfd> fds, absl::Time until);

// The rdma layer's deadline type for an absl::Time.
rdma::Deadline ToRdmaDeadline(absl::Time t);

// Maps an Error frame from the server to a typed status.
absl::Status ServerErrorStatus(const proto::Error& e, std::string_view during);

// A Move must lead to the same node's next generation: the Welcome found at
// Move.endpoint names the arena that `from` (the Welcome of the session the
// Move leaves) named, Geometry::arena_id in index_geometry (a new process
// maps its predecessor's arena), and a generation of at least
// Move.new_generation. FailedPrecondition saying what differs otherwise (a
// wrong --advertise_address on the node, a stale or forged Move): the client
// refuses to move there.
absl::Status CheckMoveTarget(const proto::Welcome& from, const proto::Move& move,
                             const proto::Welcome& to);

// A node's WRONG_SHARD answer as an op's status: FailedPrecondition with the
// message a plain Client has always reported, plus a payload carrying the
// node's map epoch. ClusterClient finds the epoch with WrongShardEpochOf and
// reroutes the op (nothing was applied: the answer guarantees it); a plain
// Client, which never asks for shard maps, never gets one. `what`: the op
// kind's name. (errors.cc)
absl::Status WrongShardSignal(uint64_t node_epoch, std::string_view what);
std::optional<uint64_t> WrongShardEpochOf(const absl::Status& status);

// --- wr_id layout -------------------------------------------------------------
// bits 32..63 session epoch, bit 31 receive, bits 0..30 slot or receive index.
inline uint64_t MakeWrId(uint32_t epoch, bool recv, uint32_t index) {
  return (uint64_t{epoch} << 32) | (recv ? (1u << 31) : 0u) | index;
}
inline uint32_t WrEpoch(uint64_t wr_id) { return static_cast<uint32_t>(wr_id >> 32); }
inline bool WrIsRecv(uint64_t wr_id) { return (wr_id & (1u << 31)) != 0; }
inline uint32_t WrIndex(uint64_t wr_id) { return static_cast<uint32_t>(wr_id) & ~(1u << 31); }

// --- session (session.cc) --------------------------------------------------------

// Where a Session is. The handshake (kConnecting..kAwaitReady) and the
// retirement (kDraining, kFlushing) advance from Poll, one step when its fd
// or completion is ready, each step bounded by Session::step_deadline;
// nothing waits.
enum class SessionState : uint8_t {
  kConnecting,    // TCP connect in progress: wait for POLLOUT
  kAwaitWelcome,  // Hello sent
  kAwaitReady,    // QP in RTS, ClientQp sent
  kUp,            // serving
  kDraining,      // left by a Move: what is outstanding on its QP finishes
  kFlushing,      // QP in ERR: waiting for the flushed completions
};
const char* SessionStateName(SessionState s);

// One connection to one server process: the control socket, the RC QP and
// its receive buffers. A Client has one, and more while it moves or
// reconnects (current_, pending_, retiring_).
struct Session {
  uint32_t epoch = 0;  // tags this session's wr_ids
  std::string endpoint;
  SessionState state = SessionState::kConnecting;
  absl::Time step_deadline;  // the current step fails (or gives up) then
  bool for_move = false;     // handshake started by a Move (not a reconnect)
  bool first = false;        // Connect()'s: every wait bounded by connect_timeout
  proto::Welcome welcome;
  std::optional<storage::Geometry> geometry;  // nullopt: no READ fast path
  // The node's slot-words table (kFeatureSlotWords negotiated): its arena
  // offset; 0 without one. READs check the words while the client's map is
  // older than check_below_epoch (the node's guard: Welcome, then Guard).
  uint64_t slot_words_offset = 0;
  uint64_t check_below_epoch = 0;
  // A Guard to acknowledge once no READ posted here without a word check is
  // outstanding (TryAckGuard).
  bool guard_ack_due = false;
  uint64_t guard_ack_nonce = 0;

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
  bool moving = false;  // Move received: READs go on, RPCs wait for the new session
  proto::Move move;     // the Move received (moving), or followed (for_move)
  // for_move: the Welcome of the session the Move leaves, checked against
  // this one's (CheckMoveTarget); refused_move once that check failed.
  proto::Welcome move_from;
  bool refused_move = false;
  absl::Time move_drain_deadline;
  bool moved = false;   // retired by a Move: MoveAck and Goodbye once drained
  bool broken = false;  // lost or retiring: post nothing here
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
  // GET read path. The key's hash is computed once per operation, with the
  // hash seed it was computed for (a session on another arena has another).
  storage::KeyHash hash;
  uint64_t hash_seed = 0;
  bool hashed = false;
  storage::ReadStep step;
  uint32_t read_attempts = 0;  // FirstRead restarts (torn reads)
  uint32_t reads = 0;          // READs issued for this GET
  // The key's shard slot (Impl::num_slots_ > 0) and whether the READ in
  // flight is followed by the READ of its slot word (into WordBuf).
  uint32_t shard_slot = 0;
  bool word_read = false;
  // Work requests of this slot not yet completed, and where they were posted.
  uint8_t reads_outstanding = 0;
  uint8_t sends_outstanding = 0;
  bool awaiting_response = false;
  bool in_queue = false;  // an entry for this slot is in Impl::queue_
  bool held = false;      // a write outside max_outstanding (Impl::Hold)
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
  absl::Status Init();  // first session (device, PD, CQ, buffers on its Welcome)
  // Init without waiting for the server: the first handshake runs from Poll
  // as a reconnection does, and operations submitted meanwhile wait for it
  // (each until its deadline). ClusterClient opens node sessions this way,
  // on first use, without stopping the others of its thread.
  absl::Status InitAsync();
  absl::Status Close(absl::Time deadline);
  OpResult Execute(const OpRequest& op);

  // datapath.cc
  absl::Status Submit(const OpRequest& op);
  size_t Poll(std::span<OpResult> out);
  void Wait(absl::Time until);
  void AppendWaitFds(std::vector<struct pollfd>* fds, absl::Time* until);
  uint32_t slot_count() const { return budget_.slots(); }
  uint32_t available() const { return budget_.available(); }
  uint32_t available(OpKind kind) const { return budget_.available(kind); }
  uint32_t outstanding() const { return static_cast<uint32_t>(slots_.size() - free_.size()); }
  uint32_t held_writes() const { return budget_.held(); }

  // --- cluster hooks (ClusterClient; a plain Client leaves them alone) -------
  // Shard maps received on the control channel since the last call.
  std::vector<proto::ShardMap> TakeMaps() { return std::exchange(maps_, {}); }
  // Asks the current session's node for its map (MapRequest); false when no
  // session is up or it did not negotiate kFeatureShardMap.
  bool RequestMap(uint64_t known_epoch);
  // The features both sides of the current session set (0: none up yet).
  uint64_t session_features() const;
  // The cluster client's shard map (its num_slots and epoch): with it, a GET
  // on a session with slot words READs the word of SlotOf(key, num_slots)
  // after each READ while `epoch` is below the node's guard. num_slots 0 (a
  // plain Client): no word READs.
  void SetShardMap(uint32_t num_slots, uint64_t epoch) {
    num_slots_ = num_slots;
    map_epoch_ = epoch;
  }
  bool connected() const { return current_ != nullptr && !current_->broken; }
  // Handles what has arrived on the current session's control connection
  // now: Poll looks at most every 200 us, and only on every kIdlePolls-th
  // idle call (ClusterClient's Connect waits for the first map with it).
  void PollControlNow() {
    if (current_ != nullptr) PollControl(current_.get(), absl::Now());
  }
  // Completes every operation not finished yet (queued, held, waiting for a
  // session, READ or RPC in flight) with status_of(its slot), as Close and
  // a lost session without reconnection do; Poll reports each once. A slot
  // whose work requests are still posted is freed when they complete or its
  // session is flushed; a late response finds no slot awaiting it (stale).
  // Returns how many were completed.
  uint32_t FailOutstanding(absl::FunctionRef<absl::Status(const Slot&)> status_of);

  ClientOptions options_;
  // Hello.features. 0 for a plain Client (its Hello is what it always was);
  // ClusterClient sets proto::kFeatureShardMap (and kFeatureSlotWords)
  // before Init.
  uint64_t hello_features_ = 0;
  ClientStats stats_;
  uint64_t client_id_ = 0;
  // Welcome.resume_secret of client_id_: a Hello that resumes the id must
  // present it (the node gives anyone else a fresh id). Zeros while 0.
  proto::ResumeSecret resume_secret_{};
  uint64_t generation_ = 0;
  std::string endpoint_;  // current endpoint (changes with Move)
  bool closed_ = false;

 private:
  friend class Client;
  friend class ImplTestPeer;  // tests/client: a completion against chosen sessions

  // --- client.cc ---------------------------------------------------------------
  // Device context, PD, CQ and registered buffers: on the first Welcome, so
  // they are set up while the server answers.
  absl::Status InitDevice();
  // Control frames of the current session: Keepalive/Move/Goodbye/...
  void PollControl(Session* s, absl::Time now);
  // A ShardMap frame: kept for TakeMaps when the session negotiated
  // kFeatureShardMap, else the session is broken as by any unexpected frame.
  // A frame that belongs to `feature`: true when the session negotiated it,
  // else the session is broken as by any unexpected frame.
  bool SessionAsked(Session* s, uint64_t feature, const char* message, const char* what);
  void OnShardMap(Session* s, const proto::ShardMapMsg& m);
  // A Guard frame (kFeatureSlotWords): the new guard applies to READs
  // posted from now on; the GuardAck waits for those posted before it.
  void OnGuard(Session* s, const proto::Guard& g);
  void TryAckGuard(Session* s);
  // Slots, free list and backoff: what Init and InitAsync share.
  void InitSlots();
  void SendControl(Session* s, const proto::ControlMessage& m);

  // --- session.cc: the session state machine -------------------------------------
  // Everything below runs from Poll (and Connect/Close) and never waits.
  void ProgressSessions(absl::Time now);
  // Handshake of pending_ with `endpoint` as client_id_ (0: new id). One
  // function per step; each returns an error that ends the attempt.
  void StartHandshake(const std::string& endpoint, bool for_move, absl::Time now);
  void StepHandshake(absl::Time now);
  absl::Status StepConnect(Session* s, absl::Time now);  // POLLOUT -> Hello
  absl::Status SendHello(Session* s, absl::Time now);
  absl::Status StepReceive(Session* s, absl::Time now);         // Welcome or Ready
  absl::Status OnWelcome(Session* s, const proto::Welcome& w);  // QP, ClientQp
  void OnReady(Session* s, absl::Time now);
  void HandshakeFailed(absl::Status why, absl::Time now);
  // pending_ is up: it becomes current_; a moved current_ is retired.
  void InstallPending(absl::Time now);
  // A session leaves: drained (kDraining, moved) and flushed (kFlushing)
  // from StepRetiring, then destroyed (FinishRetire).
  void Retire(std::unique_ptr<Session> s, absl::Time now);
  void StepRetiring(absl::Time now);
  void FinishRetire(std::unique_ptr<Session> s, absl::Time now);
  bool HasOutstandingWork(const Session* s) const;
  // Slots whose work was on `s` (now gone): requeued with the same sequence.
  void ReleaseSlots(const Session* s, absl::Time now);
  // The current session was lost: retire it, schedule reconnection.
  void OnSessionLost(absl::Time now);
  // Blocking teardown for Close(): drain with a deadline, destroy.
  void DestroySession(std::unique_ptr<Session>& holder, bool say_goodbye);
  bool SideFree() const { return !side_in_use_[0] || !side_in_use_[1]; }
  // How long a handshake step waits for the server's Welcome or Ready.
  absl::Duration AnswerWait(const Session* s) const;

  // --- datapath.cc -------------------------------------------------------------
  int PollCq(absl::Time now);
  static constexpr int kPollBatch = 16;
  static constexpr uint32_t kIdlePolls = 32;
  void OnCompletion(const rdma::Completion& c, absl::Time now);
  void OnReadDone(uint32_t idx, Slot& slot, absl::Time now);
  void OnResponse(Session* s, uint32_t recv_index, uint32_t byte_len, absl::Time now);
  // Starts (or restarts) a slot on the current session, or queues it.
  // `now`: the caller's one clock reading for the event it handles.
  void Start(uint32_t idx, absl::Time now);
  // The key's hash for geometry `g` (computed once per hash seed). The
  // caller names the geometry: a READ may complete on a session that is no
  // longer the current one, or when there is none.
  const storage::KeyHash& KeyHashOf(Slot& slot, const storage::Geometry& g);
  // The first READ step of a GET: through the location cache when it knows
  // the key, else the home bucket.
  void FirstStep(Slot& slot);
  // Queues the READ of slot.step in read_batch_ (posted by FlushReads).
  void PostRead(uint32_t idx, Slot& slot, absl::Time now);
  // Runs `post` (one chain of `asked` WRs) on the session of `epoch` if it is
  // still the current one and whole; returns how many WRs went. An error
  // other than a full queue, or a chain cut short with entries free, breaks
  // the session.
  size_t PostChain(uint32_t epoch, size_t asked, const char* what,
                   absl::FunctionRef<absl::StatusOr<size_t>(rdma::Qp&)> post);
  // Posts read_batch_ on the current session as one chain (only its last
  // READ signaled; rdma::Qp::PostReads), or requeues what could not go.
  void FlushReads(absl::Time now);
  // Queues the slot's request in send_batch_ (posted by FlushSends); it
  // holds its credit from now on.
  void SendRpc(uint32_t idx, Slot& slot, absl::Time now);
  // The same for send_batch_ (rdma::Qp::PostSends).
  void FlushSends(absl::Time now);
  // FlushReads and FlushSends. Called at the start and end of Poll, before
  // waiting, and after a retired session's work was restarted, so a burst
  // of Submits and what one completion loop issues go out together: one
  // doorbell per chain (on rxe, one write() into the kernel).
  void FlushPosts(absl::Time now);
  absl::Status EncodeRpc(uint32_t idx, std::string_view value);
  void MarkBroken(Session* s, absl::Status why);
  void Requeue(uint32_t idx, absl::Time not_before);
  // A write that waits (BUSY, or no session to send it on) leaves the
  // max_outstanding budget until it finishes.
  void Hold(uint32_t idx);
  void Finish(uint32_t idx, absl::Status status);
  void MaybeFree(uint32_t idx);
  void RunQueue(absl::Time now);
  void CheckDeadlines(absl::Time now);
  void RepostRecv(Session* s, uint32_t recv_index);
  Session* SessionByEpoch(uint32_t epoch);
  // READs keep going on the current session while a Move's handshake runs;
  // RPCs wait for the new session.
  bool CanRead() const { return current_ != nullptr && !current_->broken; }
  bool CanSend() const { return CanRead() && !current_->moving; }
  char* SendBuf(uint32_t idx) { return static_cast<char*>(slot_mem_.data()) + idx * kSlotStride; }
  char* ReadBuf(uint32_t idx) { return SendBuf(idx) + kSendBufSize; }
  // Where the READ of a slot word lands: the start of the kWordBufSize
  // bytes after the read buffer.
  const uint8_t* WordBuf(uint32_t idx) {
    return reinterpret_cast<const uint8_t*>(ReadBuf(idx) + kReadBufSize);
  }

 public:
  static constexpr uint32_t kSendBufSize = (proto::kMaxRpcMessageSize + 63) / 64 * 64;
  static constexpr uint32_t kReadBufSize = (storage::kMaxObjectSize + 63) / 64 * 64;
  static constexpr uint32_t kWordBufSize = 64;  // the 8-byte word, in a cache line of its own
  static constexpr uint32_t kSlotStride = kSendBufSize + kReadBufSize + kWordBufSize;
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
  std::unique_ptr<Session> current_;                // where new work goes (kUp)
  std::unique_ptr<Session> pending_;                // handshake in progress (Move or reconnect)
  std::vector<std::unique_ptr<Session>> retiring_;  // draining/flushing, then destroyed

  std::vector<Slot> slots_;
  std::vector<uint32_t> free_;
  OpBudget budget_{options_.max_outstanding, options_.max_outstanding_writes};
  std::deque<uint32_t> queue_;  // slots in State::kQueued
  std::deque<uint32_t> done_;   // finished, not yet returned by Poll
  // READs queued by PostRead for FlushReads: the slot of each and its work
  // request, all for the session of epoch read_batch_epoch_.
  std::vector<uint32_t> read_batch_slot_;
  std::vector<rdma::ReadWr> read_batch_;
  uint32_t read_batch_epoch_ = 0;
  // Requests queued by SendRpc for FlushSends, likewise.
  std::vector<uint32_t> send_batch_slot_;
  std::vector<rdma::SendWr> send_batch_;
  uint32_t send_batch_epoch_ = 0;
  LocationCache location_cache_{options_.location_cache_entries};
  // Polls that found nothing since the last full pass of Poll (which reads
  // the clock): an empty poll costs one ibv_poll_cq and no clock read.
  uint32_t idle_polls_ = 0;
  uint64_t next_sequence_ = 1;
  uint32_t next_epoch_ = 1;
  uint32_t sync_tag_ = 0;

  // Reconnection; next_reconnect_ also paces a Move's handshake attempts.
  bool need_reconnect_ = false;
  absl::Time next_reconnect_;
  absl::Duration reconnect_backoff_;
  absl::Status last_connect_error_;

  absl::Time next_control_check_;
  absl::Time next_deadline_check_;
  std::vector<proto::ShardMap> maps_;  // for TakeMaps
  uint32_t num_slots_ = 0;             // SetShardMap
  uint64_t map_epoch_ = 0;             // SetShardMap
};

}  // namespace kvnode::client

#endif  // KVNODE_CLIENT_LIB_CLIENT_IMPL_H_
