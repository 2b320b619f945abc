// The registration cache, chunk pool and batch deregistration on a real
// device: sub-allocated buffers work as READ targets, cache hits return the
// same registration, the byte budget evicts idle entries only, and batch
// deregistration (serial and parallel) leaves nothing behind.

#include "kvnode/rdma/reg_cache.h"

#include <cstring>

#include "kvnode/rdma/batch_dereg.h"
#include "rdma_test_util.h"

namespace kvnode::rdma::testing {
namespace {

using std::chrono::seconds;

class RegCacheTest : public RdmaTest {};

TEST_F(RegCacheTest, ChunkPoolCacheAndBatchDeregistration) {
  KVNODE_REQUIRE_DEVICE(dev);
  device_checked_ = true;
  KVR_ASSERT_OK_AND_ASSIGN(auto lb, Loopback::Create(dev));
  {
    // Chunk pool: two buffers from one chunk, one READ target, one source.
    ChunkPoolOptions co;
    co.chunk_bytes = 1u << 20;
    co.max_chunks = 2;
    KVR_ASSERT_OK_AND_ASSIGN(auto pool, ChunkPool::Create(lb->pd, co));
    KVR_ASSERT_OK_AND_ASSIGN(RegisteredBuffer dst, pool->Allocate(4000));
    KVR_ASSERT_OK_AND_ASSIGN(RegisteredBuffer src, pool->Allocate(4000));
    EXPECT_EQ(pool->chunks(), 1);
    EXPECT_EQ(dst.mr(), src.mr());
    EXPECT_NE(dst.offset(), src.offset());
    for (uint32_t i = 0; i < src.size(); ++i) src.data()[i] = static_cast<uint8_t>(i ^ 0x5a);
    // The pool's MR is local-write only: READ from a REMOTE_READ cache entry.
    KVR_ASSERT_OK_AND_ASSIGN(
        auto cache,
        RegistrationCache::Create(lb->pd, RegCacheOptions{.budget_bytes = 12288, .label = "rc"}));
    KVR_ASSERT_OK_AND_ASSIGN(MrRef remote,
                             cache->Get(src.data(), src.size(), IBV_ACCESS_REMOTE_READ));
    KVR_ASSERT_OK(lb->a->PostRead(1, dst.local(), remote->iova(), remote->rkey()));
    auto c = PollN(*lb->cq_a, 1, DeadlineIn(seconds(10)));
    ASSERT_EQ(c.size(), 1u);
    ASSERT_TRUE(c[0].ok()) << c[0].ToStatus();
    EXPECT_EQ(std::memcmp(dst.data(), src.data(), src.size()), 0);

    // Hit: the same registration.
    KVR_ASSERT_OK_AND_ASSIGN(MrRef again,
                             cache->Get(src.data(), src.size(), IBV_ACCESS_REMOTE_READ));
    EXPECT_EQ(again.get(), remote.get());
    EXPECT_EQ(cache->stats().hits, 1u);
    // Budget 12 KiB: 3 more 4000-byte entries evict only idle ones.
    remote.Release();
    again.Release();
    KVR_ASSERT_OK_AND_ASSIGN(auto mem, HostMemory::Allocate(1u << 16));
    std::vector<MrRef> held;
    for (int i = 0; i < 3; ++i) {
      KVR_ASSERT_OK_AND_ASSIGN(MrRef r,
                               cache->Get(mem.bytes() + i * 8192, 4000, IBV_ACCESS_LOCAL_WRITE));
      held.push_back(std::move(r));
    }
    EXPECT_EQ(cache->stats().evictions, 1u);  // the idle src entry
    // All held: a fourth goes over budget rather than evicting in-use ones.
    KVR_ASSERT_OK_AND_ASSIGN(MrRef r4,
                             cache->Get(mem.bytes() + 3 * 8192, 4000, IBV_ACCESS_LOCAL_WRITE));
    EXPECT_EQ(cache->stats().evictions, 1u);
    for (auto& r : held) EXPECT_TRUE(r->registered());
    // Invalidate refuses while referenced, succeeds after release.
    absl::Status s = cache->Invalidate(mem.data(), mem.size(), Clock::now());
    EXPECT_EQ(GetRdmaErrorKind(s), RdmaErrorKind::kMrInUse) << s;
    held.clear();
    r4.Release();
    KVR_ASSERT_OK(cache->Clear(DeadlineIn(seconds(1))));
    EXPECT_EQ(cache->stats().entries, 0u);

    // Pool close refuses while buffers exist.
    s = pool->Close(Clock::now());
    EXPECT_EQ(GetRdmaErrorKind(s), RdmaErrorKind::kMrInUse) << s;
  }
  {
    // Batch: 64 small MRs, serial and parallel, one with a reference held.
    KVR_ASSERT_OK_AND_ASSIGN(auto mem, HostMemory::Allocate(128 * 4096));
    for (int threads : {1, 2}) {
      std::vector<std::shared_ptr<Mr>> mrs;
      for (int i = 0; i < 64; ++i) {
        MrOptions o;
        o.label = absl::StrCat("batch", i);
        KVR_ASSERT_OK_AND_ASSIGN(auto mr, Mr::Register(lb->pd, mem.bytes() + i * 8192, 4096, o));
        mrs.push_back(std::move(mr));
      }
      KVR_ASSERT_OK_AND_ASSIGN(MrRef busy, mrs[10]->Acquire());
      BatchDeregResult r =
          DeregisterBatch(mrs, Clock::now(), BatchDeregOptions{.threads = threads});
      EXPECT_EQ(r.threads_used, threads);
      EXPECT_EQ(GetRdmaErrorKind(r.overall), RdmaErrorKind::kMrInUse) << r.overall;
      for (int i = 0; i < 64; ++i) EXPECT_EQ(r.statuses[i].ok(), i != 10) << i;
      busy.Release();
      r = DeregisterBatch(mrs, Clock::now(), BatchDeregOptions{.threads = threads});
      KVR_ASSERT_OK(r.overall);
    }
  }
  KVR_ASSERT_OK(lb->a->Drain(DeadlineIn(seconds(5))));
  KVR_ASSERT_OK(lb->b->Drain(DeadlineIn(seconds(5))));
}

}  // namespace
}  // namespace kvnode::rdma::testing
