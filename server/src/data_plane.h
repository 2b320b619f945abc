// The data-plane thread: owns the shared CQ (with its completion channel),
// every client QP and memory window, the RPC buffer pool's slots and the
// dedupe records. Nothing here is touched by another thread: the control
// thread hands it work through a TaskQueue (Post) and hears back through
// callbacks that post to the control thread's queue.
//
// One DataSession per client control connection, keyed by the control
// connection id. Teardown of a session, on every path (client goodbye, QP in
// ERR, replaced, shutdown), in this order (contract):
//   1. deallocate the client's window (invalidates its rkey) -- windows go
//      before their QP: rxe blocks ~50 s destroying a QP with a bound window;
//   2. QP to ERR;  3. drain (marker + receive count, bounded);
//   4. destroy the QP;  5. return its RPC buffers to the pool.
#ifndef KVNODE_SERVER_SRC_DATA_PLANE_H_
#define KVNODE_SERVER_SRC_DATA_PLANE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kvnode/proto/control.h"
#include "kvnode/rdma/cq.h"
#include "kvnode/rdma/device.h"
#include "kvnode/rdma/mr.h"
#include "kvnode/rdma/mw.h"
#include "kvnode/rdma/pd.h"
#include "kvnode/rdma/qp.h"
#include "kvnode/server/admin.h"
#include "kvnode/server/client_records.h"
#include "kvnode/server/dedupe.h"
#include "kvnode/server/metrics.h"
#include "kvnode/server/rpc_handler.h"
#include "kvnode/server/shard_gate.h"
#include "task_queue.h"

namespace kvnode::server {

struct DataPlaneConfig {
  uint32_t max_clients = 64;
  uint32_t credits = 8;  // receive buffers per client
  uint32_t dedupe_window = 1024;
  uint32_t max_client_records = 4096;
  bool use_windows = true;
  uint32_t spin_us = 20;
  uint32_t spin_max_us = 0;  // ServerOptions::spin_max_us; 0: fixed spin_us
  bool group_commit = true;  // ServerOptions::group_commit
  // Responses up to this many bytes are posted inline (IBV_SEND_INLINE);
  // a device that refuses it at QP creation gets 0.
  uint32_t response_inline_bytes = 64;
  uint8_t qp_timeout = 12;                          // ServerOptions::qp_timeout
  uint8_t qp_retry_cnt = 2;                         // ServerOptions::qp_retry_cnt
  absl::Duration drain_timeout = absl::Seconds(2);  // per QP
  // ServerOptions::shard_gate: null serves every key; set, only the slots of
  // its current view (RpcContext::sharded).
  std::shared_ptr<ShardGate> shard_gate;
};

// Memory and verbs objects created by the Server and shared with the data
// plane. The Server keeps its own references and deregisters the MRs after
// the data plane is gone.
struct DataPlaneResources {
  std::shared_ptr<rdma::Device> device;
  std::shared_ptr<rdma::Pd> pd;
  std::shared_ptr<rdma::Mr> arena_mr;  // MW_BIND (windows) or REMOTE_READ, iova 0
  std::shared_ptr<rdma::Mr> pool_mr;   // LOCAL_WRITE; RPC buffers
  uint8_t* pool_base = nullptr;
  uint64_t arena_size = 0;
  // The arena's slot-words table (a cluster node's; docs/format.md "Slot
  // words"), its arena offset; null and 0 when the arena has none yet
  // (SetSlotWords gives it later).
  uint8_t* slot_words = nullptr;
  uint64_t slot_words_offset = 0;
};

// What the control thread needs to answer Hello.
struct SessionSetup {
  uint64_t client_id = 0;
  ResumeSecret secret{};  // Welcome.resume_secret
  // Set when the Hello asked to resume a client id it did not prove it owns
  // (unknown id, wrong secret): it got a fresh id instead.
  bool resume_refused = false;
  proto::QpInfo qp;
  uint32_t rkey = 0;  // predicted rkey of the window (bound at Connect), or the MR's
  // The slot-words table's arena offset when the data plane keeps one
  // (Welcome.slot_words_offset with kFeatureSlotWords), else 0. Its words
  // show the gate's view as of this session's creation.
  uint64_t slot_words_offset = 0;
  // Set when this Hello resumed a client id that had a live session: that
  // session's control connection must be told Goodbye{kReplaced}.
  std::optional<uint64_t> replaced_conn;
};

// Size of one RPC buffer slot in the pool (kMaxRpcMessageSize rounded up).
size_t RpcBufferStride();
// Bytes of pool memory for `config`.
size_t RpcPoolBytes(uint32_t max_clients, uint32_t credits);

class DataPlane {
 public:
  // Called on the data thread when a session ends on its own (QP error):
  // conn_id, why, kind. The Server posts it to the control thread.
  using LostFn = std::function<void(uint64_t conn_id, std::string why, ErrorKind kind)>;

  static absl::StatusOr<std::unique_ptr<DataPlane>> Create(const DataPlaneConfig& config,
                                                           DataPlaneResources resources,
                                                           KvBackend* backend, Metrics* metrics,
                                                           LostFn on_lost);
  // Joins the thread if still running (Shutdown first for an orderly stop).
  ~DataPlane();

  void Start();
  // Runs `task` on the data thread. Any thread.
  void Post(std::function<void()> task) { tasks_->Post(std::move(task)); }
  // Tears every session down (the order above), stops the loop and joins.
  // Any thread but the data thread; blocks.
  void Shutdown();

  // --- data thread only (call through Post) ---------------------------------
  // Resumes `requested_client_id` (its record: dedupe window, secret; a
  // live session of it is replaced) only when `presented_secret` is that
  // record's secret; any other Hello gets a fresh id and secret from the
  // kernel CSPRNG, never another client's state. `shard_map_feature`: the
  // session negotiated kFeatureShardMap (WRONG_SHARD, not REJECTED).
  absl::StatusOr<SessionSetup> CreateSession(uint64_t conn_id, uint64_t requested_client_id,
                                             const ResumeSecret& presented_secret, std::string peer,
                                             bool shard_map_feature = false);
  // Client QP info -> RTR/RTS, window bound (waits for the bind completion).
  absl::Status ConnectSession(uint64_t conn_id, const proto::QpInfo& client);
  // Orderly teardown; no LostFn call. Unknown ids are ignored. forget_client
  // (the client said Goodbye{client done}): its dedupe record goes too, in
  // memory and in RocksDB, unless another session of the id is live.
  void CloseSession(uint64_t conn_id, const std::string& why, bool forget_client = false);
  void SetWritesPaused(bool paused) { writes_paused_ = paused; }
  // Adopts the gate's current view now (RefreshShardView): the server posts
  // it when the gate publishes, so that the slot words change with the map
  // and not with the next RPC.
  void AdoptShardView() { RefreshShardView(); }
  // The slot-words table of an arena that had none when the data plane was
  // created (made by this process once it became the writer); its words
  // are stored from the current view at once. Sessions created from now on
  // are offered it.
  void SetSlotWords(uint8_t* words, uint64_t offset);
  bool writes_paused() const { return writes_paused_; }
  std::vector<ClientRow> ClientRows() const;
  std::vector<MrRow> WindowRows() const;
  // The records of clients with a live session (when `with_live`) and of
  // every other client whose record changed after `changed_after` (0: all).
  RecordsExport ExportRecords(uint64_t changed_after, bool with_live) const;
  // A record replaces the one held for its id, unless that id has a live
  // session. Does not trim to --max_client_records (RetainRecords does).
  void ImportRecords(const std::vector<ClientRecordExport>& records);
  // Drops every record not of `client_ids`, then trims. DataLoss when one
  // of them has no record.
  absl::Status RetainRecords(const std::vector<uint64_t>& client_ids);

  // Any thread (atomics).
  uint64_t live_sessions() const { return live_sessions_.load(std::memory_order_relaxed); }
  uint64_t ready_sessions() const { return ready_sessions_.load(std::memory_order_relaxed); }
  // Dedupe records held (live and departed clients), at most --max_client_records.
  uint64_t client_records() const { return client_records_.load(std::memory_order_relaxed); }

 private:
  struct Session;
  DataPlane(const DataPlaneConfig& config, DataPlaneResources resources, KvBackend* backend,
            Metrics* metrics, LostFn on_lost);

  void Loop();
  // Hot path (data_plane_datapath.cc).
  void HandleCompletion(const rdma::Completion& c);
  // False when the session was reaped (do not touch it any more). A write
  // is staged for the poll round's group commit, not answered.
  bool HandleRequest(Session& s, uint32_t recv_slot, uint32_t byte_len);
  // The end of a poll round, and before any task runs: FlushWrites, then
  // PostAnswers. Everything received so far is then answered on the wire.
  void FlushRound();
  // Group commit: applies the staged writes in one KvBackend::Write and
  // answers them, in the order received.
  void FlushWrites();
  // Re-posts the request's receive buffer and queues the response for
  // PostAnswers. False when the session was reaped.
  bool Respond(Session& s, uint32_t recv_slot, uint32_t send_slot, uint32_t byte_len,
               const RpcResult& r);
  // Posts the queued responses, one chain per session in the order they
  // were queued (Qp::PostSends: one doorbell and one completion per chain).
  void PostAnswers();
  RpcContext ContextFor(ClientRecord& record) const;
  // Re-reads the gate's view when it was published since (one atomic load
  // otherwise), and stores the slot words of a new view (the data thread is
  // their one writer) before anything is served by it.
  void RefreshShardView() {
    if (config_.shard_gate == nullptr) return;
    const uint64_t v = config_.shard_gate->version();
    if (v == shard_version_) return;
    shard_version_ = v;
    shard_view_ = config_.shard_gate->Current();
    WriteSlotWords();
  }
  void WriteSlotWords();
  absl::Status PostRecvSlot(Session& s, uint32_t slot);
  uint64_t RecvOffset(const Session& s, uint32_t slot) const;
  uint64_t SendOffset(const Session& s, uint32_t slot) const;

  // Teardown (the order in the file comment). notify: call on_lost_.
  void Reap(Session& s, const std::string& why, std::optional<ErrorKind> kind, bool notify);
  // A fresh client id (random, != 0, unused), from getrandom(2).
  absl::Status NewClientId(uint64_t* client_id) const;
  // Down to --max_client_records (the longest idle first); publishes the count.
  void TrimRecords();
  // ClientRecords' view of which ids are in session.
  auto Live() const {
    return [this](uint64_t id) { return by_client_.contains(id); };
  }
  // Drops a client's dedupe record, in memory and persisted.
  void ForgetRecord(uint64_t client_id);

  const DataPlaneConfig config_;
  DataPlaneResources res_;
  KvBackend* const backend_;
  Metrics* const metrics_;
  const LostFn on_lost_;
  std::unique_ptr<TaskQueue> tasks_;
  std::shared_ptr<rdma::Cq> cq_;  // shared by all client QPs (send and recv)
  std::thread thread_;
  bool started_ = false;
  bool stop_ = false;  // data thread only

  // --- data thread only -------------------------------------------------------
  absl::flat_hash_map<uint64_t, std::unique_ptr<Session>> by_conn_;
  absl::flat_hash_map<uint32_t, Session*> by_serial_;  // wr_id -> session
  absl::flat_hash_map<uint64_t, Session*> by_client_;  // live session of a client id
  ClientRecords records_;
  std::vector<uint32_t> free_blocks_;
  uint32_t next_serial_ = 1;
  uint32_t response_inline_bytes_;  // config_'s, 0 once the device refused it
  bool writes_paused_ = false;
  // The poll round's writes (FlushWrites): where each came from and goes to,
  // and what it asks (its views point into its receive buffer).
  struct StagedWrite {
    uint32_t serial = 0;
    uint32_t recv_slot = 0;
    uint32_t send_slot = 0;
    uint32_t byte_len = 0;
    ClientRecord* record = nullptr;
    uint8_t* response = nullptr;  // the send buffer
  };
  std::vector<StagedWrite> staged_;
  std::vector<WriteRequest> staged_requests_;
  std::vector<WriteReply> staged_replies_;
  // Responses queued by Respond for PostAnswers.
  struct Answer {
    uint32_t serial = 0;
    uint32_t send_slot = 0;
    uint32_t size = 0;
  };
  std::vector<Answer> answers_;
  std::vector<rdma::SendWr> chain_;  // PostAnswers' scratch
  // The gate's view as of shard_version_ (the gate starts at version 0
  // with no view).
  std::shared_ptr<const ShardView> shard_view_;
  uint64_t shard_version_ = 0;

  std::atomic<uint64_t> live_sessions_{0};
  std::atomic<uint64_t> ready_sessions_{0};
  std::atomic<uint64_t> client_records_{0};
};

}  // namespace kvnode::server

#endif  // KVNODE_SERVER_SRC_DATA_PLANE_H_
