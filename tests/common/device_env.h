// Finding the verbs device a test runs on.
//
// Tests that need RDMA call KVNODE_REQUIRE_DEVICE() first: it skips the test
// with a clear message when the machine has no ACTIVE verbs device, so unit
// runs on a plain host stay green, while deploy/test.sh refuses a device run
// in which anything skipped.
#ifndef KVNODE_TESTS_COMMON_DEVICE_ENV_H_
#define KVNODE_TESTS_COMMON_DEVICE_ENV_H_

#include <gtest/gtest.h>

#include <optional>
#include <string>

namespace kvnode::testing {

struct TestDevice {
  std::string name;  // e.g. "rxe0"
  int port = 1;
};

// The device to test on: $KVNODE_TEST_DEVICE (name[:port]) if set, else the
// first device with an ACTIVE port. std::nullopt, with `why` filled in, when
// there is none (or the named one is missing or not ACTIVE).
std::optional<TestDevice> FindTestDevice(std::string* why);

}  // namespace kvnode::testing

#define KVNODE_REQUIRE_DEVICE(dev)                                  \
  std::string kvnode_why_;                                          \
  auto dev##_opt = ::kvnode::testing::FindTestDevice(&kvnode_why_); \
  if (!dev##_opt) {                                                 \
    GTEST_SKIP() << "no RDMA device: " << kvnode_why_;              \
  }                                                                 \
  const ::kvnode::testing::TestDevice dev = *dev##_opt

#endif  // KVNODE_TESTS_COMMON_DEVICE_ENV_H_
