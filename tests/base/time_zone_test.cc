#include "kvnode/base/time_zone.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <ctime>
#include <optional>
#include <string>

namespace kvnode::base {
namespace {

// Restores the test process's TZ whatever a test did to it.
class TimeZoneTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (const char* tz = std::getenv("TZ")) saved_ = tz;
  }
  void TearDown() override {
    if (saved_) {
      setenv("TZ", saved_->c_str(), 1);
    } else {
      unsetenv("TZ");
    }
    tzset();
  }
  std::optional<std::string> saved_;
};

std::tm Local(std::time_t t) {
  std::tm tm{};
  localtime_r(&t, &tm);
  return tm;
}

TEST_F(TimeZoneTest, UnsetBecomesTheSystemZone) {
  unsetenv("TZ");
  tzset();
  const std::time_t t = 1780000000;
  const std::tm before = Local(t);
  PinLocalTimeZone();
  const char* tz = std::getenv("TZ");
  ASSERT_NE(tz, nullptr);
  EXPECT_STREQ(tz, ":/etc/localtime");
  tzset();
  const std::tm after = Local(t);
  // The same zone as before: only when it is read changes.
  EXPECT_EQ(after.tm_hour, before.tm_hour);
  EXPECT_EQ(after.tm_gmtoff, before.tm_gmtoff);
  std::tm copy = after;
  EXPECT_EQ(std::mktime(&copy), t);
}

TEST_F(TimeZoneTest, ASetZoneIsKept) {
  setenv("TZ", "JST-9", 1);
  PinLocalTimeZone();
  EXPECT_STREQ(std::getenv("TZ"), "JST-9");
  tzset();
  EXPECT_EQ(Local(0).tm_hour, 9);
}

TEST_F(TimeZoneTest, AnEmptyZoneIsKept) {
  // TZ="" means UTC to glibc: the user chose it.
  setenv("TZ", "", 1);
  PinLocalTimeZone();
  EXPECT_STREQ(std::getenv("TZ"), "");
}

}  // namespace
}  // namespace kvnode::base
