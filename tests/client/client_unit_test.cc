// libkvclient pieces that need no device: typed errors, options, the TCP and
// admin-socket plumbing against in-process peers, token files, wr_id layout,
// the read and write budgets.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <utility>

#include "client_impl.h"
#include "kvnode/client/admin.h"
#include "kvnode/client/client.h"
#include "kvnode/client/errors.h"
#include "location_cache.h"
#include "op_budget.h"

namespace kvnode::client {

// Drives Client::Impl's completion handling against sessions the test sets
// up by hand: no device, no peer.
class ImplTestPeer {
 public:
  // An arena of 8 MiB with a 1024-bucket index at 4096.
  static storage::Geometry SmallGeometry() {
    storage::Geometry g;
    g.arena_size = 8 << 20;
    g.index_offset = 4096;
    g.bucket_count = 1024;
    g.hash_seed = 7;
    return g;
  }
  // Zeroed memory for one operation slot's buffers.
  static void GiveSlotMemory(Client::Impl& c) {
    absl::StatusOr<rdma::HostMemory> mem =
        rdma::HostMemory::Allocate((size_t{Client::Impl::kSlotStride} + 4095) / 4096 * 4096);
    EXPECT_TRUE(mem.ok()) << mem.status();
    c.slot_mem_ = *std::move(mem);
  }

  // Slot 0 holds a GET whose READ of a cached location was posted on session
  // 1, which is now retiring (lost, or left by a Move), and `current` (or
  // none) is where new work goes. The READ completes with bytes that are
  // not the key's object: the location is stale. Returns the slot's state.
  static Slot::State StaleCachedReadDone(std::unique_ptr<Session> current) {
    Client::Impl c(ClientOptions{});
    const storage::Geometry g = SmallGeometry();
    GiveSlotMemory(c);  // zeros: no object there
    auto old = std::make_unique<Session>();
    old->epoch = 1;
    old->geometry = g;
    old->broken = true;
    old->state = SessionState::kFlushing;
    c.retiring_.push_back(std::move(old));
    c.current_ = std::move(current);
    c.slots_.resize(1);
    Slot& s = c.slots_[0];
    s.state = Slot::State::kReading;
    s.key = "key";
    s.epoch = 1;
    s.deadline = absl::InfiniteFuture();
    s.step.kind = storage::ReadStep::Kind::kCached;
    s.step.offset = g.index_offset + g.index_bytes();
    s.step.length = 64;
    s.step.owner = g.index_offset;
    c.OnReadDone(0, s, absl::Now());
    const Slot::State state = s.state;
    c.closed_ = true;  // nothing to tear down: no device, no socket
    return state;
  }

  // Slot 0 holds a GET whose home-bucket READ and the READ of its slot
  // word (kFeatureSlotWords) have both completed on the current session.
  // The bucket is empty: decoded, it says NotFound. The word's byte of the
  // key's slot is `word`. Returns the slot's state afterwards, its status,
  // and the client's reads_not_served.
  struct WordedRead {
    Slot::State state;
    absl::Status status;
    uint64_t not_served;
  };
  static WordedRead WordedReadDone(uint8_t word) {
    Client::Impl c(ClientOptions{});
    const storage::Geometry g = SmallGeometry();
    GiveSlotMemory(c);
    auto ses = std::make_unique<Session>();
    ses->epoch = 1;
    ses->geometry = g;
    ses->state = SessionState::kUp;
    ses->slot_words_offset = 1 << 20;
    ses->welcome.arena_size = g.arena_size;
    ses->welcome.max_rpc_message_size = 4096;
    c.current_ = std::move(ses);
    c.SetShardMap(4096, 1);
    c.slots_.resize(1);
    Slot& s = c.slots_[0];
    s.state = Slot::State::kReading;
    s.kind = OpKind::kGet;
    s.key = "key";
    s.epoch = 1;
    s.deadline = absl::InfiniteFuture();
    s.shard_slot = 13;
    s.word_read = true;
    s.step = storage::FirstRead(g, c.KeyHashOf(s, g));
    const_cast<uint8_t*>(c.WordBuf(0))[13 % 8] = word;
    c.OnReadDone(0, s, absl::Now());
    WordedRead r{s.state, s.status, c.stats_.reads_not_served};
    c.closed_ = true;
    return r;
  }

  // A Guard arrives on the current session while slot 0's READ is
  // outstanding, posted with (`checked`) or without a word check. Returns
  // whether a GuardAck went out at once, and whether one had gone out once
  // the READ completed (reads_outstanding 0), read from the socket's other
  // end: the acknowledgement promises no unchecked READ is left.
  static std::pair<bool, bool> GuardAcked(bool checked) {
    Client::Impl c(ClientOptions{});
    int fds[2];
    EXPECT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, fds), 0);
    base::UniqueFd node(fds[1]);
    auto ses = std::make_unique<Session>();
    ses->epoch = 1;
    ses->state = SessionState::kUp;
    ses->fd.Reset(fds[0]);
    ses->slot_words_offset = 1 << 20;
    ses->welcome.features = proto::kFeatureShardMap | proto::kFeatureSlotWords;
    c.hello_features_ = ses->welcome.features;
    Session* raw = ses.get();
    c.current_ = std::move(ses);
    c.slots_.resize(1);
    Slot& s = c.slots_[0];
    s.state = Slot::State::kReading;
    s.epoch = 1;
    s.word_read = checked;
    s.reads_outstanding = checked ? 2 : 1;
    auto acked = [&] {
      std::string bytes(256, '\0');
      const ssize_t n = read(node.get(), bytes.data(), bytes.size());
      if (n <= 0) return false;
      absl::StatusOr<proto::ControlMessage> m =
          proto::DecodeControlFrame(proto::AsBytes(std::string_view(bytes.data(), n)));
      EXPECT_TRUE(m.ok()) << m.status();
      return m.ok() && std::get<proto::GuardAck>(*m).nonce == 9;
    };
    c.OnGuard(raw, proto::Guard{9, proto::kGuardUp});
    EXPECT_EQ(raw->check_below_epoch, proto::kGuardUp);
    const bool at_once = acked();
    s.reads_outstanding = 0;
    c.TryAckGuard(raw);
    const bool after = at_once || acked();
    c.closed_ = true;
    return {at_once, after};
  }
};

namespace {

// A Guard is acknowledged at once when every READ in flight checks its slot
// word, and only once the unchecked one has completed otherwise.
TEST(Guard, AcknowledgedOnceNoUncheckedReadIsLeft) {
  EXPECT_EQ(ImplTestPeer::GuardAcked(true), std::make_pair(true, true));
  EXPECT_EQ(ImplTestPeer::GuardAcked(false), std::make_pair(false, true));
}

// A READ that completes after its session stopped being the current one
// (the node said Goodbye, or a Move installed another) goes back to the
// queue for the next session, which starts it again from FirstStep. Nothing
// on that path may need a current session: after a Goodbye there is none
// until the reconnection.
TEST(ReadDone, StaleCachedReadOnARetiredSessionIsRequeued) {
  EXPECT_EQ(ImplTestPeer::StaleCachedReadDone(nullptr), Slot::State::kQueued);
  auto other = std::make_unique<Session>();
  other->epoch = 2;
  other->state = SessionState::kUp;
  EXPECT_EQ(ImplTestPeer::StaleCachedReadDone(std::move(other)), Slot::State::kQueued);
}

// A READ whose slot word says the node does not serve the key's slot
// (byte 0) is not decoded, whatever it holds: the GET goes to the node by
// RPC (here queued for a credit) and is counted; with the byte 1 the same
// bytes are the answer (an empty bucket: NotFound).
TEST(ReadDone, ASlotWordOfZeroSendsTheGetToTheNode) {
  const ImplTestPeer::WordedRead not_served = ImplTestPeer::WordedReadDone(0);
  EXPECT_NE(not_served.state, Slot::State::kDone);
  EXPECT_EQ(not_served.state, Slot::State::kQueued);
  EXPECT_EQ(not_served.not_served, 1u);
  const ImplTestPeer::WordedRead served = ImplTestPeer::WordedReadDone(1);
  EXPECT_EQ(served.state, Slot::State::kDone);
  EXPECT_TRUE(absl::IsNotFound(served.status)) << served.status;
  EXPECT_EQ(served.not_served, 0u);
}

// The location cache is bounded, keyed by the whole hash (bucket and
// fingerprint), and forgets everything when the arena changes.
TEST(LocationCache, BoundedExactAndPerArena) {
  LocationCache off(0);
  EXPECT_FALSE(off.enabled());
  storage::CachedLocation loc;
  off.Insert({1, 2}, {8, 9});
  EXPECT_FALSE(off.Lookup({1, 2}, &loc));

  LocationCache c(100);  // rounded up to 128 entries
  ASSERT_TRUE(c.enabled());
  c.ForArena(7);
  c.Insert({5, 3}, {100, 200});
  ASSERT_TRUE(c.Lookup({5, 3}, &loc));
  EXPECT_EQ(loc.slot, 100u);
  EXPECT_EQ(loc.word, 200u);
  EXPECT_FALSE(c.Lookup({5, 4}, &loc)) << "another fingerprint";
  EXPECT_FALSE(c.Lookup({5 + 128, 3}, &loc)) << "another bucket";
  // One entry: every key shares it, an insert replaces, an erase of another
  // key keeps it.
  LocationCache one(1);
  one.Insert({5, 3}, {100, 200});
  one.Insert({5 + 128, 3}, {300, 400});
  EXPECT_FALSE(one.Lookup({5, 3}, &loc));
  ASSERT_TRUE(one.Lookup({5 + 128, 3}, &loc));
  EXPECT_EQ(loc.slot, 300u);
  one.Erase({5, 3});
  EXPECT_TRUE(one.Lookup({5 + 128, 3}, &loc));
  one.Erase({5 + 128, 3});
  EXPECT_FALSE(one.Lookup({5 + 128, 3}, &loc));
  c.Insert({0, 0}, {1, 1});  // the zero hash is a key like any other
  EXPECT_TRUE(c.Lookup({0, 0}, &loc));
  c.ForArena(7);
  EXPECT_TRUE(c.Lookup({0, 0}, &loc));
  c.ForArena(8);  // a new segment: offsets mean nothing there
  EXPECT_FALSE(c.Lookup({0, 0}, &loc));
}

// Keys of few buckets (an arena's index has fewer buckets than the cache has
// entries) still spread over the whole cache: most of them stay cached.
TEST(LocationCache, KeysOfFewBucketsSpreadOverTheCache) {
  LocationCache c(16384);
  constexpr uint64_t kBuckets = 1024;
  constexpr uint32_t kKeys = 4000;
  for (uint32_t i = 0; i < kKeys; ++i) {
    c.Insert({i % kBuckets, static_cast<uint16_t>((i * 2654435761u) >> 18)}, {8 * i, i});
  }
  uint32_t kept = 0;
  storage::CachedLocation loc;
  for (uint32_t i = 0; i < kKeys; ++i) {
    kept += c.Lookup({i % kBuckets, static_cast<uint16_t>((i * 2654435761u) >> 18)}, &loc) &&
            loc.word == i;
  }
  // Direct-mapped, 4000 keys in 16384 entries: about e^(-4000/16384) = 78 %.
  EXPECT_GT(kept, kKeys * 7 / 10);
}

TEST(ErrorKind, MapsStatusCodes) {
  EXPECT_EQ(ErrorKindOf(absl::OkStatus()), ErrorKind::kOk);
  EXPECT_TRUE(IsKeyNotFound(absl::NotFoundError("x")));
  EXPECT_TRUE(IsTimeout(absl::DeadlineExceededError("x")));
  EXPECT_TRUE(IsConnectionLost(absl::UnavailableError("x")));
  EXPECT_TRUE(IsRejected(absl::InvalidArgumentError("x")));
  EXPECT_TRUE(IsRejected(absl::PermissionDeniedError("x")));
  EXPECT_TRUE(IsRejected(absl::FailedPreconditionError("x")));
  EXPECT_EQ(ErrorKindOf(absl::InternalError("x")), ErrorKind::kInternal);
  EXPECT_EQ(ErrorKindName(ErrorKind::kConnectionLost), "connection_lost");
}

TEST(ServerError, TypedByCode) {
  proto::Error e;
  e.code = proto::ErrorCode::kAuthFailed;
  EXPECT_TRUE(IsRejected(ServerErrorStatus(e, "Hello")));
  e.code = proto::ErrorCode::kUnsupportedVersion;
  EXPECT_TRUE(IsRejected(ServerErrorStatus(e, "Hello")));
  e.code = proto::ErrorCode::kTooManyClients;
  EXPECT_TRUE(IsRejected(ServerErrorStatus(e, "Hello")));
  e.code = proto::ErrorCode::kUnknownClient;  // the client retries as a new id
  EXPECT_TRUE(absl::IsNotFound(ServerErrorStatus(e, "Hello")));
  e.code = proto::ErrorCode::kInternal;  // retryable
  EXPECT_TRUE(IsConnectionLost(ServerErrorStatus(e, "Hello")));
  e.code = static_cast<proto::ErrorCode>(99);  // open enum: generic
  EXPECT_TRUE(IsConnectionLost(ServerErrorStatus(e, "Hello")));
}

TEST(ClientOptions, ValidateNamesTheProblem) {
  ClientOptions o;
  EXPECT_TRUE(o.Validate().ok());
  o.max_outstanding = 0;
  EXPECT_NE(o.Validate().message().find("--depth"), std::string::npos);
  o = ClientOptions();
  o.server = "no-port";
  EXPECT_NE(o.Validate().message().find("--server"), std::string::npos);
  o = ClientOptions();
  o.keepalive_timeout = o.keepalive_interval;
  EXPECT_FALSE(o.Validate().ok());
  o = ClientOptions();
  o.qp_retry_cnt = 8;
  EXPECT_FALSE(o.Validate().ok());
}

// The Welcome of a session on the arena `arena_id` at `generation`.
proto::Welcome WelcomeOf(uint64_t arena_id, uint64_t generation) {
  storage::Geometry g;
  g.arena_size = 1 << 20;
  g.index_offset = 4096;
  g.bucket_count = 1024;
  g.hash_seed = 7;
  g.arena_id = arena_id;
  proto::Welcome w;
  w.client_id = 5;
  w.server_generation = generation;
  w.index_geometry = g.Encode();
  return w;
}

proto::Move MoveTo(uint64_t new_generation) {
  proto::Move m;
  m.endpoint = "127.0.0.1:7000";
  m.new_generation = new_generation;
  return m;
}

TEST(MoveTarget, SameArenaNextGenerationAccepted) {
  EXPECT_TRUE(CheckMoveTarget(WelcomeOf(0xa1, 3), MoveTo(4), WelcomeOf(0xa1, 4)).ok());
  // A later generation of the same node (it was upgraded again meanwhile).
  EXPECT_TRUE(CheckMoveTarget(WelcomeOf(0xa1, 3), MoveTo(4), WelcomeOf(0xa1, 5)).ok());
}

TEST(MoveTarget, AnotherNodeRefused) {
  // Another node, even at the announced generation.
  absl::Status s = CheckMoveTarget(WelcomeOf(0xa1, 3), MoveTo(4), WelcomeOf(0xb2, 4));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("another node"), absl::string_view::npos) << s;
  EXPECT_NE(s.message().find("b2"), absl::string_view::npos) << s;
  // A fresh node (generation 1) at the Move's address.
  EXPECT_FALSE(CheckMoveTarget(WelcomeOf(0xa1, 3), MoveTo(4), WelcomeOf(0xc3, 1)).ok());
}

TEST(MoveTarget, OlderGenerationRefused) {
  // The same arena but not the announced generation (the old process
  // itself, or a stale Move).
  absl::Status s = CheckMoveTarget(WelcomeOf(0xa1, 3), MoveTo(4), WelcomeOf(0xa1, 3));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("expected at least 4"), absl::string_view::npos) << s;
}

TEST(MoveTarget, UnknownArenaRefused) {
  proto::Welcome none = WelcomeOf(0xa1, 4);
  none.index_geometry.clear();
  EXPECT_EQ(CheckMoveTarget(WelcomeOf(0xa1, 3), MoveTo(4), none).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(CheckMoveTarget(none, MoveTo(4), WelcomeOf(0xa1, 4)).code(),
            absl::StatusCode::kFailedPrecondition);
}

// A client with depth 4 under YCSB A (every other operation a write, as
// kvload picks them: a GET when available(kPut) == 0) while the server
// answers every write BUSY (writes paused during a live upgrade): what the
// datapath does with the budget on each answer. Returns the GETs completed
// in `rounds` rounds; `hold` false plays the rule before held writes
// existed (a BUSY write kept its place in max_outstanding).
uint64_t GetsWhileWritesPaused(bool hold, uint32_t rounds) {
  OpBudget b(4, 0);
  std::vector<std::pair<OpKind, bool>> in_flight;  // kind, held
  uint64_t gets = 0;
  uint32_t pick = 0;
  for (uint32_t r = 0; r < rounds; ++r) {
    // Submit while the client takes more, as kvload's loop does.
    while (b.available() > 0) {
      OpKind k = (pick++ % 2 == 0) ? OpKind::kPut : OpKind::kGet;
      if (b.available(k) == 0) k = OpKind::kGet;
      b.Start(k);
      in_flight.emplace_back(k, false);
    }
    EXPECT_LE(in_flight.size(), b.slots());
    // Answers: GETs complete (by READ on the old QP), writes are BUSY and
    // wait to be re-sent.
    std::vector<std::pair<OpKind, bool>> still;
    for (auto& [k, held] : in_flight) {
      if (k == OpKind::kGet) {
        b.End(k, held);
        ++gets;
      } else {
        if (hold && b.Hold(k, held)) held = true;
        still.emplace_back(k, held);
      }
    }
    in_flight = std::move(still);
  }
  // Writes resume: every held write is applied and ends.
  for (auto& [k, held] : in_flight) b.End(k, held);
  EXPECT_EQ(b.active(), 0u);
  EXPECT_EQ(b.held(), 0u);
  EXPECT_EQ(b.writes(), 0u);
  EXPECT_EQ(b.available(OpKind::kPut), 4u);
  return gets;
}

TEST(OpBudget, GetsKeepCompletingWhileEveryWriteIsHeld) {
  // Held writes leave max_outstanding: after the first rounds all 4 write
  // slots hold paused writes and every round completes 4 GETs.
  EXPECT_GE(GetsWhileWritesPaused(/*hold=*/true, 100), 4u * 98);
  // The rule before: paused writes pin every slot within a few rounds and
  // GETs stop although they could be served.
  EXPECT_LE(GetsWhileWritesPaused(/*hold=*/false, 100), 8u);
}

TEST(OpBudget, WritesBoundedHeldOrNot) {
  OpBudget b(4, 2);
  EXPECT_EQ(b.slots(), 6u);
  b.Start(OpKind::kPut);
  b.Start(OpKind::kDelete);
  EXPECT_EQ(b.available(), 2u);
  EXPECT_EQ(b.available(OpKind::kPut), 0u);  // 2 writes in flight
  EXPECT_EQ(b.available(OpKind::kGet), 2u);
  EXPECT_TRUE(b.Hold(OpKind::kPut, false));
  EXPECT_FALSE(b.Hold(OpKind::kPut, true));   // once
  EXPECT_FALSE(b.Hold(OpKind::kGet, false));  // only writes are held
  EXPECT_EQ(b.available(), 3u);
  EXPECT_EQ(b.available(OpKind::kDelete), 0u);  // held writes still count
  b.End(OpKind::kPut, true);
  EXPECT_EQ(b.available(OpKind::kPut), 1u);
  b.End(OpKind::kDelete, false);
  EXPECT_EQ(b.available(), 4u);
  EXPECT_EQ(b.available(OpKind::kPut), 2u);
}

TEST(WrId, RoundTrips) {
  const uint64_t a = MakeWrId(7, false, 31);
  EXPECT_EQ(WrEpoch(a), 7u);
  EXPECT_FALSE(WrIsRecv(a));
  EXPECT_EQ(WrIndex(a), 31u);
  const uint64_t b = MakeWrId(0xffffffffu, true, 255);
  EXPECT_EQ(WrEpoch(b), 0xffffffffu);
  EXPECT_TRUE(WrIsRecv(b));
  EXPECT_EQ(WrIndex(b), 255u);
}

// A TCP listener on 127.0.0.1 with a kernel-chosen port.
struct Listener {
  int fd = -1;
  uint16_t port = 0;
  Listener() {
    fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    EXPECT_EQ(listen(fd, 4), 0);
    socklen_t len = sizeof(a);
    getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    port = ntohs(a.sin_port);
  }
  ~Listener() { close(fd); }
};

TEST(TcpConnect, ConnectsAndReportsRefusal) {
  uint16_t closed_port;
  {
    Listener l;
    absl::StatusOr<Fd> fd =
        TcpConnect(absl::StrCat("127.0.0.1:", l.port), absl::Now() + absl::Seconds(5));
    ASSERT_TRUE(fd.ok()) << fd.status();
    EXPECT_GE(fd->get(), 0);
    closed_port = l.port;
  }
  // Nobody listens there any more: refused, typed as connection lost.
  absl::StatusOr<Fd> fd =
      TcpConnect(absl::StrCat("127.0.0.1:", closed_port), absl::Now() + absl::Seconds(5));
  ASSERT_FALSE(fd.ok());
  EXPECT_TRUE(IsConnectionLost(fd.status())) << fd.status();
  EXPECT_FALSE(TcpConnect("nonsense", absl::Now() + absl::Seconds(1)).ok());
}

// A Unix-socket peer that reads one line and answers with `answer` (or
// nothing, or stays silent until told to stop).
class FakeAdmin {
 public:
  enum class Mode { kAnswer, kCloseSilently, kHang };
  FakeAdmin(Mode mode, std::string answer) : mode_(mode), answer_(std::move(answer)) {
    dir_ = ::testing::TempDir() + "/kvctl-test-XXXXXX";
    EXPECT_NE(mkdtemp(dir_.data()), nullptr);
    path_ = dir_ + "/admin.sock";
    fd_ = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::snprintf(a.sun_path, sizeof(a.sun_path), "%s", path_.c_str());
    EXPECT_EQ(bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    EXPECT_EQ(listen(fd_, 1), 0);
    thread_ = std::thread([this] { Serve(); });
  }
  ~FakeAdmin() {
    shutdown(fd_, SHUT_RDWR);
    {
      // Under the lock: Serve may be closing the connection meanwhile, and
      // its number could be reused by then.
      std::lock_guard<std::mutex> l(mu_);
      if (conn_ >= 0) shutdown(conn_, SHUT_RDWR);
    }
    thread_.join();
    close(fd_);
    unlink(path_.c_str());
    rmdir(dir_.c_str());
  }
  const std::string& path() const { return path_; }
  std::string request() {
    std::lock_guard<std::mutex> l(mu_);
    return request_;
  }

 private:
  void Serve() {
    int c = accept(fd_, nullptr, nullptr);
    if (c < 0) return;
    {
      std::lock_guard<std::mutex> l(mu_);
      conn_ = c;
    }
    std::string line;
    char ch;
    while (read(c, &ch, 1) == 1 && ch != '\n') line.push_back(ch);
    {
      std::lock_guard<std::mutex> l(mu_);
      request_ = line;
    }
    if (mode_ == Mode::kAnswer) {
      std::string out = answer_ + "\n";
      (void)!write(c, out.data(), out.size());
    } else if (mode_ == Mode::kHang) {
      while (read(c, &ch, 1) > 0) {
      }
    }
    std::lock_guard<std::mutex> l(mu_);
    conn_ = -1;
    close(c);
  }

  Mode mode_;
  std::string answer_;
  std::string dir_, path_;
  int fd_ = -1;
  std::thread thread_;
  std::mutex mu_;
  int conn_ = -1;  // guarded by mu_
  std::string request_;
};

TEST(AdminRequest, SendsOneLineAndReadsTheAnswer) {
  FakeAdmin peer(FakeAdmin::Mode::kAnswer, R"({"ok":true,"pid":42})");
  absl::StatusOr<std::string> a =
      AdminRequest(peer.path(), "upgrade /opt/kvnode", absl::Now() + absl::Seconds(10));
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(*a, R"({"ok":true,"pid":42})");
  EXPECT_EQ(peer.request(), "upgrade /opt/kvnode");
}

TEST(AdminRequest, NoAnswerIsAnError) {
  FakeAdmin peer(FakeAdmin::Mode::kCloseSilently, "");
  absl::StatusOr<std::string> a =
      AdminRequest(peer.path(), "stats", absl::Now() + absl::Seconds(10));
  ASSERT_FALSE(a.ok());
  EXPECT_TRUE(IsConnectionLost(a.status())) << a.status();
}

TEST(AdminRequest, SilentPeerHitsTheDeadline) {
  FakeAdmin peer(FakeAdmin::Mode::kHang, "");
  absl::StatusOr<std::string> a =
      AdminRequest(peer.path(), "stats", absl::Now() + absl::Milliseconds(100));
  ASSERT_FALSE(a.ok());
  EXPECT_TRUE(IsTimeout(a.status())) << a.status();
}

TEST(AdminRequest, NobodyListening) {
  absl::StatusOr<std::string> a = AdminRequest(::testing::TempDir() + "/no-such-admin.sock", "ping",
                                               absl::Now() + absl::Seconds(1));
  ASSERT_FALSE(a.ok());
  EXPECT_TRUE(IsConnectionLost(a.status())) << a.status();
}

TEST(AuthToken, ReadLikeTheNodeAndRefuseLooseModes) {
  const std::string path = ::testing::TempDir() + "/kvclient-token-test";
  { std::ofstream(path) << "s3cret\n"; }
  chmod(path.c_str(), 0600);
  absl::StatusOr<std::string> t = ReadAuthTokenFile(path);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(*t, "s3cret");
  chmod(path.c_str(), 0644);
  EXPECT_TRUE(absl::IsPermissionDenied(ReadAuthTokenFile(path).status()));
  { std::ofstream(path, std::ios::trunc) << "\n"; }
  chmod(path.c_str(), 0600);
  EXPECT_FALSE(ReadAuthTokenFile(path).ok());
  unlink(path.c_str());
  EXPECT_FALSE(ReadAuthTokenFile(path).ok());
}

TEST(AdminPath, CandidatesInTheNodesOrder) {
  std::vector<std::string> c = DefaultAdminSocketCandidates();
  ASSERT_GE(c.size(), 2u);
  EXPECT_EQ(c.front(), "/run/kvnode/admin.sock");
  EXPECT_EQ(c.back(), absl::StrCat("/tmp/kvnode-", geteuid(), "/admin.sock"));
}

}  // namespace
}  // namespace kvnode::client
