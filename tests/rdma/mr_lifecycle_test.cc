// MR lifecycle on a real verbs device (rxe0 in deploy/vm/rxe-vm): protection
// (READs fail after dereg / window invalidation), refusal of unsafe
// deregistration, completion-based drain, enforced teardown order, and the
// RLIMIT_MEMLOCK error. Every test ends with zero live objects in kvrdma's
// accounting and none of this process's MRs/QPs in `rdma resource show`.

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <thread>

#include "kvnode/rdma/errors.h"
#include "kvnode/rdma/mw.h"
#include "rdma_test_util.h"

namespace kvnode::rdma::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr size_t kLen = 64 * 1024;

class MrLifecycleTest : public RdmaTest {
 protected:
  void ReleaseObjects() override {
    if (lb_ != nullptr) {
      // Orderly: drain both QPs, then let the owners go.
      for (Qp* qp : {lb_->a.get(), lb_->b.get()}) {
        if (qp != nullptr) {
          absl::Status s = qp->Drain(DeadlineIn(seconds(5)));
          EXPECT_TRUE(s.ok()) << s;
        }
      }
    }
    local_mr_.reset();
    remote_mr_.reset();
    lb_.reset();
  }

  // Loopback pair plus `remote` (served by b, REMOTE_READ) and `local` (READ
  // target of a) buffers of kLen bytes, registered.
  void SetUpPair(int remote_access = IBV_ACCESS_REMOTE_READ, std::optional<uint64_t> iova = {},
                 QpOptions qa = {}, QpOptions qb = {}) {
    KVNODE_REQUIRE_DEVICE(dev);
    device_checked_ = true;
    KVR_ASSERT_OK_AND_ASSIGN(lb_, Loopback::Create(dev, qa, qb));
    KVR_ASSERT_OK_AND_ASSIGN(remote_mem_, HostMemory::Allocate(kLen));
    KVR_ASSERT_OK_AND_ASSIGN(local_mem_, HostMemory::Allocate(kLen));
    for (size_t i = 0; i < kLen; ++i) remote_mem_.bytes()[i] = static_cast<uint8_t>(i * 131 + 7);
    MrOptions ro;
    ro.access = remote_access;
    ro.iova = iova;
    ro.label = "remote";
    KVR_ASSERT_OK_AND_ASSIGN(remote_mr_, Mr::Register(lb_->pd, remote_mem_.data(), kLen, ro));
    MrOptions lo;
    lo.label = "local";
    KVR_ASSERT_OK_AND_ASSIGN(local_mr_, Mr::Register(lb_->pd, local_mem_.data(), kLen, lo));
  }

  // One READ of `len` bytes at remote (addr, rkey) into local[0..len); the
  // completion.
  Completion ReadOnce(uint64_t addr, uint32_t rkey, uint32_t len = kLen) {
    std::memset(local_mem_.data(), 0, kLen);
    absl::Status s = lb_->a->PostRead(1, LocalBuf{local_mr_.get(), 0, len}, addr, rkey);
    EXPECT_TRUE(s.ok()) << s;
    std::vector<Completion> c = PollN(*lb_->cq_a, 1, DeadlineIn(seconds(10)));
    EXPECT_EQ(c.size(), 1u) << "no completion for the READ within 10 s";
    return c.empty() ? Completion{} : c[0];
  }

  std::unique_ptr<Loopback> lb_;
  HostMemory remote_mem_, local_mem_;
  std::shared_ptr<Mr> remote_mr_, local_mr_;
};

TEST_F(MrLifecycleTest, ReadThroughMrSucceedsThenFailsAfterDeregistration) {
  SetUpPair();
  if (HasFatalFailure() || IsSkipped()) return;
  // The kernel's view agrees with ours while the objects are alive (and so
  // the leak check at TearDown is not vacuous).
  EXPECT_EQ(KernelObjectsOfThisProcess("mr"), 2);
  EXPECT_EQ(KernelObjectsOfThisProcess("qp"), 2);
  EXPECT_EQ(Accounting::Snapshot().of(ObjectKind::kMr), 2);
  Completion c = ReadOnce(remote_mr_->iova(), remote_mr_->rkey());
  ASSERT_TRUE(c.ok()) << c.ToStatus();
  EXPECT_EQ(c.kind, WrKind::kRead);
  EXPECT_EQ(std::memcmp(local_mem_.data(), remote_mem_.data(), kLen), 0);

  const uint32_t old_rkey = remote_mr_->rkey();
  KVR_ASSERT_OK(SafeDeregister(*remote_mr_, DeadlineIn(seconds(1))));
  EXPECT_FALSE(remote_mr_->registered());
  c = ReadOnce(remote_mr_->iova(), old_rkey);
  EXPECT_EQ(c.status, IBV_WC_REM_ACCESS_ERR) << ibv_wc_status_str(c.status);
  EXPECT_EQ(c.ToStatus().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(lb_->a->saw_error());
  auto state = lb_->a->QueryState();
  ASSERT_TRUE(state.ok());
  EXPECT_EQ(*state, IBV_QPS_ERR);
}

TEST_F(MrLifecycleTest, ReadThroughType2WindowSucceedsThenFailsAfterInvalidate) {
  // Server-style: the MR grants no remote access itself, only MW_BIND, at
  // iova 0 so the window's remote addresses are offsets.
  SetUpPair(IBV_ACCESS_MW_BIND | IBV_ACCESS_LOCAL_WRITE, /*iova=*/0);
  if (HasFatalFailure() || IsSkipped()) return;
  if (!lb_->device->caps().mw_type2) GTEST_SKIP() << "device has no type-2 windows";

  // The MR alone cannot be read remotely.
  Completion c = ReadOnce(0, remote_mr_->rkey(), 64);
  EXPECT_EQ(c.status, IBV_WC_REM_ACCESS_ERR) << ibv_wc_status_str(c.status);
  // Reconnect a fresh pair for the window part.
  KVR_ASSERT_OK(lb_->a->Drain(DeadlineIn(seconds(5))));
  KVR_ASSERT_OK(lb_->b->Drain(DeadlineIn(seconds(5))));
  {
    KVNODE_REQUIRE_DEVICE(dev);
    lb_->a.reset();
    lb_->b.reset();
    QpOptions qa, qb;
    qa.label = "qp_a2";
    qb.label = "qp_b2";
    KVR_ASSERT_OK_AND_ASSIGN(lb_->a, Qp::Create(lb_->pd, lb_->cq_a, lb_->cq_a, qa));
    KVR_ASSERT_OK_AND_ASSIGN(lb_->b, Qp::Create(lb_->pd, lb_->cq_b, lb_->cq_b, qb));
    KVR_ASSERT_OK(lb_->a->Connect(lb_->b->LocalInfo()));
    KVR_ASSERT_OK(lb_->b->Connect(lb_->a->LocalInfo()));
  }

  KVR_ASSERT_OK_AND_ASSIGN(std::shared_ptr<Mw> mw, Mw::Allocate(lb_->pd, MwType::kType2, "w"));
  // Bound on b, the QP the reads arrive on: [4096, 4096+8192) of the MR.
  KVR_ASSERT_OK_AND_ASSIGN(
      uint32_t rkey, lb_->b->PostBindMw(7, mw, remote_mr_, 4096, 8192, IBV_ACCESS_REMOTE_READ));
  KVR_ASSERT_OK_AND_ASSIGN(Completion bind,
                           lb_->b->WaitFor(7, WrKind::kBindMw, DeadlineIn(seconds(5))));
  ASSERT_TRUE(bind.ok()) << bind.ToStatus();
  EXPECT_TRUE(mw->bound());

  c = ReadOnce(4096, rkey, 8192);
  ASSERT_TRUE(c.ok()) << c.ToStatus();
  EXPECT_EQ(std::memcmp(local_mem_.data(), remote_mem_.bytes() + 4096, 8192), 0);

  KVR_ASSERT_OK(lb_->b->PostInvalidateMw(8, mw));
  KVR_ASSERT_OK_AND_ASSIGN(Completion inv,
                           lb_->b->WaitFor(8, WrKind::kInvalidateMw, DeadlineIn(seconds(5))));
  ASSERT_TRUE(inv.ok()) << inv.ToStatus();
  EXPECT_FALSE(mw->bound());
  c = ReadOnce(4096, rkey, 64);
  EXPECT_EQ(c.status, IBV_WC_REM_ACCESS_ERR) << ibv_wc_status_str(c.status);
  // rxe: the responder's QP goes to ERR too; the server must reap it.
  std::vector<Completion> flushed;
  KVR_ASSERT_OK(lb_->b->Drain(DeadlineIn(seconds(5)), &flushed));
  auto state = lb_->b->QueryState();
  ASSERT_TRUE(state.ok());
  EXPECT_EQ(*state, IBV_QPS_ERR);
}

TEST_F(MrLifecycleTest, DeregistrationRefusedWhileReadOutstanding) {
  SetUpPair();
  if (HasFatalFailure() || IsSkipped()) return;
  // The READ names local (its target) and pins remote (the memory it reads).
  KVR_ASSERT_OK(lb_->a->PostRead(5, LocalBuf{local_mr_.get(), 0, kLen}, remote_mr_->iova(),
                                 remote_mr_->rkey(), remote_mr_.get()));
  EXPECT_EQ(local_mr_->outstanding_wrs(), 1u);
  EXPECT_EQ(remote_mr_->outstanding_wrs(), 1u);
  for (Mr* mr : {local_mr_.get(), remote_mr_.get()}) {
    absl::Status s = SafeDeregister(*mr, Clock::now());
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    EXPECT_EQ(GetRdmaErrorKind(s), RdmaErrorKind::kMrInUse) << s;
    EXPECT_TRUE(IsRetryable(s));
    EXPECT_TRUE(mr->registered());
    EXPECT_TRUE(mr->closed());
  }
  // A closed MR takes no new work.
  absl::Status s =
      lb_->a->PostRead(6, LocalBuf{local_mr_.get(), 0, 64}, remote_mr_->iova(), remote_mr_->rkey());
  EXPECT_EQ(GetRdmaErrorKind(s), RdmaErrorKind::kClosed) << s;

  std::vector<Completion> c = PollN(*lb_->cq_a, 1, DeadlineIn(seconds(10)));
  ASSERT_EQ(c.size(), 1u);
  EXPECT_TRUE(c[0].ok()) << c[0].ToStatus();
  EXPECT_EQ(c[0].wr_id, 5u);
  EXPECT_EQ(std::memcmp(local_mem_.data(), remote_mem_.data(), kLen), 0);
  KVR_ASSERT_OK(SafeDeregister(*local_mr_, DeadlineIn(seconds(1))));
  KVR_ASSERT_OK(SafeDeregister(*remote_mr_, DeadlineIn(seconds(1))));
  EXPECT_FALSE(local_mr_->registered());
}

TEST_F(MrLifecycleTest, DeregistrationRacingEightReferenceTakersNeverFreesMemoryInUse) {
  SetUpPair();
  if (HasFatalFailure() || IsSkipped()) return;
  std::atomic<bool> stop{false};
  std::atomic<int> violations{0};
  std::atomic<int64_t> taken{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      while (!stop.load()) {
        absl::StatusOr<MrRef> ref = remote_mr_->Acquire();
        if (!ref.ok()) {
          if (GetRdmaErrorKind(ref.status()) != RdmaErrorKind::kClosed) violations++;
          return;  // closed for good
        }
        taken++;
        // Holding a reference: the registration must be live.
        if (!(*ref)->registered()) violations++;
        remote_mem_.bytes()[t] = static_cast<uint8_t>(t);
      }
    });
  }
  while (taken.load() < 1000) std::this_thread::yield();
  absl::Status s;
  const Deadline deadline = DeadlineIn(seconds(20));
  do {
    s = SafeDeregister(*remote_mr_, Clock::now() + milliseconds(1));
  } while (!s.ok() && IsRetryable(s) && Clock::now() < deadline);
  KVR_ASSERT_OK(s);
  stop = true;
  for (auto& th : threads) th.join();
  EXPECT_EQ(violations.load(), 0);
  EXPECT_FALSE(remote_mr_->registered());
  EXPECT_EQ(remote_mr_->references(), 0u);
}

TEST_F(MrLifecycleTest, DrainWithManyOutstandingReadsAccountsForEveryOne) {
  QpOptions qa;
  qa.max_send_wr = 64;
  SetUpPair(IBV_ACCESS_REMOTE_READ, {}, qa);
  if (HasFatalFailure() || IsSkipped()) return;
  constexpr int kReads = 48;
  for (int i = 0; i < kReads; ++i) {
    KVR_ASSERT_OK(lb_->a->PostRead(100 + i, LocalBuf{local_mr_.get(), 0, kLen}, remote_mr_->iova(),
                                   remote_mr_->rkey(), remote_mr_.get()));
  }
  EXPECT_EQ(lb_->a->outstanding_sends(), static_cast<uint32_t>(kReads));
  std::vector<Completion> done;
  KVR_ASSERT_OK(lb_->a->Drain(DeadlineIn(seconds(20)), &done));
  EXPECT_EQ(lb_->a->outstanding_sends(), 0u);
  ASSERT_EQ(done.size(), static_cast<size_t>(kReads));
  std::vector<bool> seen(kReads);
  for (const Completion& c : done) {
    ASSERT_GE(c.wr_id, 100u);
    ASSERT_LT(c.wr_id, 100u + kReads);
    EXPECT_FALSE(seen[c.wr_id - 100]) << "wr_id twice";
    seen[c.wr_id - 100] = true;
    EXPECT_TRUE(c.status == IBV_WC_SUCCESS || c.status == IBV_WC_WR_FLUSH_ERR)
        << ibv_wc_status_str(c.status);
  }
  EXPECT_EQ(local_mr_->outstanding_wrs(), 0u);
  EXPECT_EQ(remote_mr_->outstanding_wrs(), 0u);
  KVR_ASSERT_OK(SafeDeregister(*local_mr_, Clock::now()));
  KVR_ASSERT_OK(SafeDeregister(*remote_mr_, Clock::now()));
}

TEST_F(MrLifecycleTest, DrainCountsPostedReceivesAndIdleDrainIsFast) {
  SetUpPair();
  if (HasFatalFailure() || IsSkipped()) return;
  // An idle connected QP drains well within a short deadline.
  KVR_ASSERT_OK(lb_->a->Drain(DeadlineIn(milliseconds(500))));
  // Receives posted before ERR are flushed and counted (rxe never completes
  // a receive marker, so none is used).
  for (int i = 0; i < 16; ++i) {
    KVR_ASSERT_OK(lb_->b->PostRecv(i, LocalBuf{local_mr_.get(), uint64_t(i) * 1024, 1024}));
  }
  EXPECT_EQ(lb_->b->outstanding_recvs(), 16u);
  std::vector<Completion> done;
  KVR_ASSERT_OK(lb_->b->Drain(DeadlineIn(seconds(5)), &done));
  EXPECT_EQ(lb_->b->outstanding_recvs(), 0u);
  ASSERT_EQ(done.size(), 16u);
  for (const Completion& c : done) {
    EXPECT_EQ(c.kind, WrKind::kRecv);
    EXPECT_EQ(c.status, IBV_WC_WR_FLUSH_ERR);
  }
  EXPECT_EQ(local_mr_->outstanding_wrs(), 0u);
}

TEST_F(MrLifecycleTest, WrongTeardownOrderCannotBeWritten) {
  SetUpPair(IBV_ACCESS_MW_BIND | IBV_ACCESS_LOCAL_WRITE, /*iova=*/0);
  if (HasFatalFailure() || IsSkipped()) return;
  if (!lb_->device->caps().mw_type2) GTEST_SKIP() << "device has no type-2 windows";
  KVR_ASSERT_OK_AND_ASSIGN(std::shared_ptr<Mw> mw, Mw::Allocate(lb_->pd, MwType::kType2, "w"));
  KVR_ASSERT_OK_AND_ASSIGN(uint32_t rkey,
                           lb_->b->PostBindMw(1, mw, remote_mr_, 0, 4096, IBV_ACCESS_REMOTE_READ));
  (void)rkey;
  KVR_ASSERT_OK_AND_ASSIGN(Completion bind,
                           lb_->b->WaitFor(1, WrKind::kBindMw, DeadlineIn(seconds(5))));
  ASSERT_TRUE(bind.ok()) << bind.ToStatus();

  // 1. Dropping the device and PD first does not close them: children hold them.
  std::weak_ptr<Pd> weak_pd = lb_->pd;
  std::weak_ptr<Device> weak_dev = lb_->device;
  lb_->pd.reset();
  lb_->device.reset();
  EXPECT_FALSE(weak_pd.expired());
  EXPECT_EQ(Accounting::Snapshot().of(ObjectKind::kPd), 1);

  // 2. Dropping the MR while a window is bound keeps it registered (the
  //    window holds it); deregistering it deallocates the window first
  //    instead of failing with EINVAL as raw ibv_dereg_mr would on rxe.
  std::weak_ptr<Mr> weak_mr = remote_mr_;
  Mr* raw_mr = remote_mr_.get();
  remote_mr_.reset();
  ASSERT_FALSE(weak_mr.expired());
  EXPECT_TRUE(raw_mr->registered());
  // 3. Destroying the QP a type-2 window is bound to deallocates the window
  //    first (rxe blocks ~50 s in destroy_qp otherwise).
  KVR_ASSERT_OK(lb_->b->Drain(DeadlineIn(seconds(5))));
  lb_->b.reset();
  EXPECT_FALSE(mw->alive());
  EXPECT_FALSE(mw->bound());
  EXPECT_TRUE(weak_mr.expired()) << "the window's link to the MR must be gone";

  // And an explicit SafeDeregister with a bound window: windows go first.
  {
    KVR_ASSERT_OK_AND_ASSIGN(auto mem, HostMemory::Allocate(4096));
    MrOptions o;
    o.access = IBV_ACCESS_MW_BIND | IBV_ACCESS_LOCAL_WRITE;
    o.label = "mr2";
    KVR_ASSERT_OK_AND_ASSIGN(auto mr2, Mr::Register(weak_pd.lock(), mem.data(), 4096, o));
    KVR_ASSERT_OK_AND_ASSIGN(auto w1, Mw::Allocate(weak_pd.lock(), MwType::kType2, "w1"));
    KVR_ASSERT_OK_AND_ASSIGN(uint32_t k,
                             lb_->a->PostBindMw(2, w1, mr2, 0, 4096, IBV_ACCESS_REMOTE_READ));
    (void)k;
    KVR_ASSERT_OK_AND_ASSIGN(Completion b2,
                             lb_->a->WaitFor(2, WrKind::kBindMw, DeadlineIn(seconds(5))));
    ASSERT_TRUE(b2.ok()) << b2.ToStatus();
    KVR_ASSERT_OK(SafeDeregister(*mr2, DeadlineIn(seconds(1))));
    EXPECT_FALSE(w1->alive());
    EXPECT_FALSE(mr2->registered());
  }
  mw.reset();
  KVR_ASSERT_OK(lb_->a->Drain(DeadlineIn(seconds(5))));
  lb_.reset();
  local_mr_.reset();
  EXPECT_TRUE(weak_pd.expired());
  EXPECT_TRUE(weak_dev.expired());
}

// A window of another PD is refused by both window operations: the QP's PD
// lock guards the binding graph, so it must be the window's lock too.
TEST_F(MrLifecycleTest, WindowOfAnotherPdIsRefused) {
  SetUpPair(IBV_ACCESS_MW_BIND | IBV_ACCESS_LOCAL_WRITE, /*iova=*/0);
  if (HasFatalFailure() || IsSkipped()) return;
  if (!lb_->device->caps().mw_type2) GTEST_SKIP() << "device has no type-2 windows";
  KVR_ASSERT_OK_AND_ASSIGN(std::shared_ptr<Pd> other_pd, Pd::Create(lb_->device));
  KVR_ASSERT_OK_AND_ASSIGN(std::shared_ptr<Mw> mw, Mw::Allocate(other_pd, MwType::kType2, "w"));
  EXPECT_TRUE(absl::IsInvalidArgument(
      lb_->b->PostBindMw(1, mw, remote_mr_, 0, 4096, IBV_ACCESS_REMOTE_READ).status()));
  const absl::Status inv = lb_->b->PostInvalidateMw(2, mw);
  EXPECT_TRUE(absl::IsInvalidArgument(inv)) << inv;
  EXPECT_FALSE(mw->bound());
}

TEST_F(MrLifecycleTest, RegistrationBeyondMemlockAsNonRootFailsClearly) {
  KVNODE_REQUIRE_DEVICE(dev);
  device_checked_ = true;
  if (geteuid() != 0) GTEST_SKIP() << "needs root to switch to the nobody user";
  // Child: drop to nobody (no CAP_IPC_LOCK) with an 8 MiB memlock limit and
  // try to register 16 MiB: once with kvrdma's own check, once letting the
  // kernel refuse. Exit code 0 = all as expected.
  fflush(nullptr);
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    rlimit rl{8u << 20, 8u << 20};
    if (setrlimit(RLIMIT_MEMLOCK, &rl) != 0) _exit(10);
    if (setresgid(65534, 65534, 65534) != 0 || setresuid(65534, 65534, 65534) != 0) _exit(11);
    DeviceOptions o;
    o.name = dev.name;
    o.port = dev.port;
    {
      auto d = Device::Open(o);
      if (!d.ok()) {
        fprintf(stderr, "child: %s\n", d.status().ToString().c_str());
        _exit(12);
      }
      auto pd = Pd::Create(*d);
      if (!pd.ok()) _exit(13);
      auto mem = HostMemory::Allocate(16u << 20, MemoryOptions{PageKind::k4K, true});
      if (!mem.ok()) _exit(14);
      for (bool own_check : {true, false}) {
        MrOptions mo;
        mo.check_memlock = own_check;
        mo.label = "too-big";
        auto mr = Mr::Register(*pd, mem->data(), mem->size(), mo);
        if (mr.ok()) _exit(own_check ? 15 : 16);
        fprintf(stderr, "child (%s check): %s\n", own_check ? "kvrdma" : "kernel",
                mr.status().ToString().c_str());
        if (GetRdmaErrorKind(mr.status()) != RdmaErrorKind::kMemlockLimit) _exit(17);
        if (mr.status().message().find("RLIMIT_MEMLOCK") == absl::string_view::npos) _exit(18);
      }
      // A registration within the limit still works.
      MrOptions small;
      small.label = "small";
      auto ok = Mr::Register(*pd, mem->data(), 1u << 20, small);
      if (!ok.ok()) _exit(19);
    }
    if (!Accounting::CheckNoLeaks().ok()) _exit(20);
    if (KernelObjectsOfThisProcess("mr") != 0) _exit(21);
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "child failed at step " << WEXITSTATUS(status);
}

// Rule 4a (docs/rdma.md): a chain posted by PostReads asks for one
// completion (its last READ), yet every READ of it is tracked: its pin holds
// the local MR until the completion that retires it is polled, and Poll
// returns one completion per READ, in post order.
TEST_F(MrLifecycleTest, UnsignaledReadsOfAChainAreTrackedUntilTheSignaledCompletion) {
  SetUpPair();
  if (HasFatalFailure() || IsSkipped()) return;
  constexpr int kN = 8;
  constexpr uint32_t kPiece = 512;
  std::vector<ReadWr> wrs(kN);
  for (int i = 0; i < kN; ++i) {
    wrs[i].wr_id = 100 + i;
    wrs[i].dst = LocalBuf{local_mr_.get(), uint64_t{kPiece} * i, kPiece};
    // Pieces in reverse order, so a READ that landed in the wrong place shows.
    wrs[i].remote_addr = remote_mr_->iova() + uint64_t{kPiece} * (kN - 1 - i);
    wrs[i].rkey = remote_mr_->rkey();
  }
  std::memset(local_mem_.data(), 0, kLen);
  absl::StatusOr<size_t> posted = lb_->a->PostReads(wrs);
  ASSERT_TRUE(posted.ok()) << posted.status();
  ASSERT_EQ(*posted, size_t{kN});
  EXPECT_EQ(lb_->a->outstanding_sends(), uint32_t{kN});

  // Not one pin is released before a completion is polled, whatever the
  // device has done meanwhile: the MR cannot go.
  absl::Status st = SafeDeregister(*local_mr_, DeadlineIn(milliseconds(200)));
  EXPECT_EQ(GetRdmaErrorKind(st), RdmaErrorKind::kMrInUse) << st;

  std::vector<Completion> c = PollN(*lb_->cq_a, kN, DeadlineIn(seconds(10)));
  ASSERT_EQ(c.size(), size_t{kN}) << "one completion per READ of the chain";
  for (int i = 0; i < kN; ++i) {
    EXPECT_EQ(c[i].wr_id, uint64_t(100 + i)) << "post order";
    EXPECT_TRUE(c[i].ok()) << c[i].ToStatus();
    EXPECT_EQ(c[i].kind, WrKind::kRead);
    EXPECT_EQ(std::memcmp(local_mem_.bytes() + kPiece * i,
                          remote_mem_.bytes() + kPiece * (kN - 1 - i), kPiece),
              0)
        << "piece " << i;
  }
  EXPECT_EQ(lb_->a->outstanding_sends(), 0u);
  EXPECT_EQ(lb_->a->send_slots_free(), QpOptions{}.max_send_wr);
  KVR_ASSERT_OK(SafeDeregister(*local_mr_, DeadlineIn(seconds(1))));
}

// A chain that fails: the failing READ and every READ after it complete on
// their own (error, flush); none is lost, nothing stays pinned, the QP drains.
TEST_F(MrLifecycleTest, AFailedReadChainCompletesEveryReadAndDrains) {
  SetUpPair();
  if (HasFatalFailure() || IsSkipped()) return;
  constexpr int kN = 6;
  std::vector<ReadWr> wrs(kN);
  for (int i = 0; i < kN; ++i) {
    wrs[i].wr_id = 200 + i;
    wrs[i].dst = LocalBuf{local_mr_.get(), 64u * i, 64};
    wrs[i].remote_addr = remote_mr_->iova() + 64u * i;
    wrs[i].rkey = remote_mr_->rkey() ^ 0x5a5a00;  // not a key of this device
  }
  absl::StatusOr<size_t> posted = lb_->a->PostReads(wrs);
  ASSERT_TRUE(posted.ok()) << posted.status();
  ASSERT_EQ(*posted, size_t{kN});
  std::vector<Completion> c = PollN(*lb_->cq_a, kN, DeadlineIn(seconds(10)));
  ASSERT_EQ(c.size(), size_t{kN});
  for (int i = 0; i < kN; ++i) {
    EXPECT_EQ(c[i].wr_id, uint64_t(200 + i));
    EXPECT_FALSE(c[i].ok()) << "READ " << i << " of a chain with a bad rkey";
  }
  EXPECT_EQ(lb_->a->outstanding_sends(), 0u);
  KVR_ASSERT_OK(lb_->a->Drain(DeadlineIn(seconds(5))));
  KVR_ASSERT_OK(SafeDeregister(*local_mr_, DeadlineIn(seconds(1))));
}

// Drain without polling first: every READ of an unsignaled chain comes back
// through Drain (completed or flushed), and then the MR can go.
TEST_F(MrLifecycleTest, DrainReturnsEveryReadOfAnUnpolledChain) {
  SetUpPair();
  if (HasFatalFailure() || IsSkipped()) return;
  constexpr int kN = 5;
  std::vector<ReadWr> wrs(kN);
  for (int i = 0; i < kN; ++i) {
    wrs[i].wr_id = 300 + i;
    wrs[i].dst = LocalBuf{local_mr_.get(), 1024u * i, 1024};
    wrs[i].remote_addr = remote_mr_->iova() + 1024u * i;
    wrs[i].rkey = remote_mr_->rkey();
  }
  absl::StatusOr<size_t> posted = lb_->a->PostReads(wrs);
  ASSERT_TRUE(posted.ok()) << posted.status();
  ASSERT_EQ(*posted, size_t{kN});
  std::vector<Completion> got;
  KVR_ASSERT_OK(lb_->a->Drain(DeadlineIn(seconds(5)), &got));
  ASSERT_EQ(got.size(), size_t{kN});
  for (int i = 0; i < kN; ++i) EXPECT_EQ(got[i].wr_id, uint64_t(300 + i));
  EXPECT_EQ(lb_->a->outstanding_sends(), 0u);
  KVR_ASSERT_OK(SafeDeregister(*local_mr_, DeadlineIn(seconds(1))));
}

// The same rule for PostSends (the server's answers): one completion asked
// for, one per SEND returned in post order, each SEND's pin held until then,
// and every message delivered whole and in order, a zero-length one too.
TEST_F(MrLifecycleTest, UnsignaledSendsOfAChainAreTrackedUntilTheSignaledCompletion) {
  SetUpPair(IBV_ACCESS_REMOTE_READ | IBV_ACCESS_LOCAL_WRITE);
  if (HasFatalFailure() || IsSkipped()) return;
  constexpr int kN = 6;
  constexpr uint32_t kPiece = 1024;
  for (int i = 0; i < kN; ++i) {
    KVR_ASSERT_OK(
        lb_->b->PostRecv(500 + i, LocalBuf{remote_mr_.get(), uint64_t{kPiece} * i, kPiece}));
  }
  for (size_t i = 0; i < kLen; ++i) local_mem_.bytes()[i] = static_cast<uint8_t>(i * 7 + 3);
  std::vector<SendWr> wrs(kN);
  auto length_of = [&](int i) { return i == 2 ? 0u : 100u * (i + 1); };
  for (int i = 0; i < kN; ++i) {
    wrs[i].wr_id = 400 + i;
    if (length_of(i) > 0)
      wrs[i].src = LocalBuf{local_mr_.get(), uint64_t{kPiece} * i, length_of(i)};
  }
  absl::StatusOr<size_t> posted = lb_->a->PostSends(wrs);
  ASSERT_TRUE(posted.ok()) << posted.status();
  ASSERT_EQ(*posted, size_t{kN});
  EXPECT_EQ(lb_->a->outstanding_sends(), uint32_t{kN});
  absl::Status st = SafeDeregister(*local_mr_, DeadlineIn(milliseconds(200)));
  EXPECT_EQ(GetRdmaErrorKind(st), RdmaErrorKind::kMrInUse) << st;

  std::vector<Completion> sent = PollN(*lb_->cq_a, kN, DeadlineIn(seconds(10)));
  ASSERT_EQ(sent.size(), size_t{kN}) << "one completion per SEND of the chain";
  std::vector<Completion> got = PollN(*lb_->cq_b, kN, DeadlineIn(seconds(10)));
  ASSERT_EQ(got.size(), size_t{kN});
  for (int i = 0; i < kN; ++i) {
    EXPECT_EQ(sent[i].wr_id, uint64_t(400 + i)) << "post order";
    EXPECT_TRUE(sent[i].ok()) << sent[i].ToStatus();
    EXPECT_EQ(sent[i].kind, WrKind::kSend);
    ASSERT_TRUE(got[i].ok()) << got[i].ToStatus();
    EXPECT_EQ(got[i].wr_id, uint64_t(500 + i)) << "delivered in order";
    EXPECT_EQ(got[i].byte_len, length_of(i));
    EXPECT_EQ(std::memcmp(remote_mem_.bytes() + kPiece * i, local_mem_.bytes() + kPiece * i,
                          length_of(i)),
              0)
        << "message " << i;
  }
  EXPECT_EQ(lb_->a->outstanding_sends(), 0u);
  EXPECT_EQ(lb_->a->send_slots_free(), QpOptions{}.max_send_wr);
  KVR_ASSERT_OK(SafeDeregister(*local_mr_, DeadlineIn(seconds(1))));
}

}  // namespace
}  // namespace kvnode::rdma::testing
