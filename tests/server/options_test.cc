#include "kvnode/server/options.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>

namespace kvnode::server {
namespace {

ServerOptions Valid() {
  ServerOptions o;
  o.db_path = "/tmp/x";
  return o;
}

void ExpectRejected(const ServerOptions& o, const std::string& flag) {
  absl::Status s = o.Validate();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << flag;
  EXPECT_NE(s.message().find(flag), absl::string_view::npos) << s;
}

TEST(ServerOptions, DefaultsWithDbPathAreValid) { EXPECT_TRUE(Valid().Validate().ok()); }

TEST(ServerOptions, DbPathIsRequired) { ExpectRejected(ServerOptions{}, "--db_path"); }

TEST(ServerOptions, EachBadValueNamesItsFlag) {
  {
    ServerOptions o = Valid();
    o.listen = "nonsense";
    ExpectRejected(o, "--listen");
  }
  {
    ServerOptions o = Valid();
    o.max_clients = 0;
    ExpectRejected(o, "--max_clients");
  }
  {
    ServerOptions o = Valid();
    o.rpc_credits = 0;
    ExpectRejected(o, "--rpc_credits");
  }
  {
    ServerOptions o = Valid();
    o.arena_size = 4096;
    ExpectRejected(o, "--arena_size");
  }
  {
    ServerOptions o = Valid();
    o.memory_windows = "maybe";
    ExpectRejected(o, "--memory_windows");
  }
  {
    ServerOptions o = Valid();
    o.dedupe_window = 100;
    ExpectRejected(o, "--dedupe_window");
  }
  {
    ServerOptions o = Valid();
    o.handshake_timeout = absl::ZeroDuration();
    ExpectRejected(o, "--handshake_timeout_ms");
  }
  {
    ServerOptions o = Valid();
    o.shm_name = "a/b";
    ExpectRejected(o, "--shm_name");
  }
  {
    ServerOptions o = Valid();
    o.max_client_records = 1;
    ExpectRejected(o, "--max_client_records");
  }
}

TEST(ServerOptions, PortZeroAndIpv6Accepted) {
  ServerOptions o = Valid();
  o.listen = "127.0.0.1:0";
  EXPECT_TRUE(o.Validate().ok());
  o.listen = "[::1]:7000";
  EXPECT_TRUE(o.Validate().ok());
}

TEST(ServerOptions, WindowModes) {
  EXPECT_EQ(*ParseWindowMode("auto"), WindowMode::kAuto);
  EXPECT_EQ(*ParseWindowMode("on"), WindowMode::kOn);
  EXPECT_EQ(*ParseWindowMode("off"), WindowMode::kOff);
  EXPECT_FALSE(ParseWindowMode("yes").ok());
}

class TokenFile : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/kvnode-token-XXXXXX";
    const int fd = mkstemp(tmpl);
    ASSERT_GE(fd, 0);
    close(fd);
    path_ = tmpl;
  }
  void TearDown() override { unlink(path_.c_str()); }
  void Write(const std::string& content, mode_t mode) {
    std::ofstream(path_, std::ios::trunc) << content;
    ASSERT_EQ(chmod(path_.c_str(), mode), 0);
  }
  std::string path_;
};

TEST_F(TokenFile, StripsTrailingNewline) {
  Write("s3cret\n", 0600);
  absl::StatusOr<std::string> t = ReadAuthTokenFile(path_);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(*t, "s3cret");
}

TEST_F(TokenFile, RefusesGroupOrWorldReadable) {
  Write("s3cret\n", 0640);
  EXPECT_EQ(ReadAuthTokenFile(path_).status().code(), absl::StatusCode::kPermissionDenied);
  Write("s3cret\n", 0604);
  EXPECT_EQ(ReadAuthTokenFile(path_).status().code(), absl::StatusCode::kPermissionDenied);
}

TEST_F(TokenFile, RefusesEmptyAndMissing) {
  Write("\n", 0600);
  EXPECT_FALSE(ReadAuthTokenFile(path_).ok());
  EXPECT_FALSE(ReadAuthTokenFile(path_ + ".missing").ok());
}

TEST_F(TokenFile, RefusesOversizeToken) {
  Write(std::string(5000, 'x'), 0600);
  EXPECT_FALSE(ReadAuthTokenFile(path_).ok());
}

}  // namespace
}  // namespace kvnode::server
