// Shared pieces of the kvrdma device tests: a loopback pair of connected RC
// QPs on the test device, completion polling with a deadline, and the
// end-of-test leak checks (kvrdma's Accounting and the kernel's own view via
// `rdma resource show`).
#ifndef KVNODE_TESTS_RDMA_RDMA_TEST_UTIL_H_
#define KVNODE_TESTS_RDMA_RDMA_TEST_UTIL_H_

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/device_env.h"
#include "kvnode/rdma/accounting.h"
#include "kvnode/rdma/cq.h"
#include "kvnode/rdma/device.h"
#include "kvnode/rdma/memory.h"
#include "kvnode/rdma/mr.h"
#include "kvnode/rdma/pd.h"
#include "kvnode/rdma/qp.h"

namespace kvnode::rdma::testing {

#define KVR_ASSERT_OK(expr)                              \
  do {                                                   \
    const ::absl::Status kvr_s_ = (expr);                \
    ASSERT_TRUE(kvr_s_.ok()) << #expr << ": " << kvr_s_; \
  } while (0)

#define KVR_ASSERT_OK_AND_ASSIGN(lhs, expr)                       \
  auto KVR_CONCAT(kvr_or_, __LINE__) = (expr);                    \
  ASSERT_TRUE(KVR_CONCAT(kvr_or_, __LINE__).ok())                 \
      << #expr << ": " << KVR_CONCAT(kvr_or_, __LINE__).status(); \
  lhs = std::move(*KVR_CONCAT(kvr_or_, __LINE__))
#define KVR_CONCAT_(a, b) a##b
#define KVR_CONCAT(a, b) KVR_CONCAT_(a, b)

// How many objects of `kind` ("mr", "qp") the kernel lists for this pid.
// -1 if the rdma tool could not be run.
inline int KernelObjectsOfThisProcess(const char* kind) {
  std::string cmd = absl::StrCat("rdma -j resource show ", kind, " 2>/dev/null");
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return -1;
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  if (pclose(p) != 0) return -1;
  const std::string needle = absl::StrCat("\"pid\":", getpid(), ",");
  int count = 0;
  for (size_t pos = out.find(needle); pos != std::string::npos; pos = out.find(needle, pos + 1)) {
    ++count;
  }
  return count;
}

// Base fixture: at TearDown every object must be gone, in kvrdma's
// accounting and in the kernel's resource tables (read while we are alive).
class RdmaTest : public ::testing::Test {
 protected:
  void TearDown() override {
    ReleaseObjects();
    const absl::Status leaks = Accounting::CheckNoLeaks();
    EXPECT_TRUE(leaks.ok()) << leaks;
    EXPECT_EQ(Accounting::Snapshot().undrained_destroys, 0)
        << "a QP was destroyed with work outstanding";
    if (device_checked_) {
      EXPECT_EQ(KernelObjectsOfThisProcess("mr"), 0) << "kernel still lists MRs of this process";
      EXPECT_EQ(KernelObjectsOfThisProcess("qp"), 0) << "kernel still lists QPs of this process";
    }
  }
  // Tests release their fixture-held objects here.
  virtual void ReleaseObjects() {}

  bool device_checked_ = false;
};

// Two connected RC QPs on one device sharing a PD: `a` reads from memory
// served by `b`. Each QP has its own CQ.
struct Loopback {
  std::shared_ptr<Device> device;
  std::shared_ptr<Pd> pd;
  std::shared_ptr<Cq> cq_a, cq_b;
  std::unique_ptr<Qp> a, b;

  static absl::StatusOr<std::unique_ptr<Loopback>> Create(const kvnode::testing::TestDevice& dev,
                                                          QpOptions qa = {}, QpOptions qb = {}) {
    auto lb = std::make_unique<Loopback>();
    DeviceOptions dopt;
    dopt.name = dev.name;
    dopt.port = dev.port;
    auto d = Device::Open(dopt);
    if (!d.ok()) return d.status();
    lb->device = *d;
    auto pd = Pd::Create(lb->device);
    if (!pd.ok()) return pd.status();
    lb->pd = *pd;
    CqOptions co;
    co.depth = 256;
    co.label = "cq_a";
    auto ca = Cq::Create(lb->device, co);
    if (!ca.ok()) return ca.status();
    lb->cq_a = *ca;
    co.label = "cq_b";
    auto cb = Cq::Create(lb->device, co);
    if (!cb.ok()) return cb.status();
    lb->cq_b = *cb;
    if (qa.label == "qp") qa.label = "qp_a";
    if (qb.label == "qp") qb.label = "qp_b";
    auto a = Qp::Create(lb->pd, lb->cq_a, lb->cq_a, qa);
    if (!a.ok()) return a.status();
    lb->a = std::move(*a);
    auto b = Qp::Create(lb->pd, lb->cq_b, lb->cq_b, qb);
    if (!b.ok()) return b.status();
    lb->b = std::move(*b);
    if (auto s = lb->a->Connect(lb->b->LocalInfo()); !s.ok()) return s;
    if (auto s = lb->b->Connect(lb->a->LocalInfo()); !s.ok()) return s;
    return lb;
  }
};

// Polls `cq` until `n` completions arrived or the deadline passed.
inline std::vector<Completion> PollN(Cq& cq, size_t n, Deadline deadline) {
  std::vector<Completion> out;
  Completion buf[16];
  while (out.size() < n && Clock::now() < deadline) {
    auto got = cq.Poll(std::span<Completion>(buf, std::min<size_t>(16, n - out.size())));
    if (!got.ok()) break;
    for (int i = 0; i < *got; ++i) out.push_back(buf[i]);
  }
  return out;
}

}  // namespace kvnode::rdma::testing

#endif  // KVNODE_TESTS_RDMA_RDMA_TEST_UTIL_H_
