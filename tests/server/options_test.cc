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
    o.max_chain_buckets = 0;
    ExpectRejected(o, "--max_chain_buckets");
    o.max_chain_buckets = 65;
    ExpectRejected(o, "--max_chain_buckets");
    o.max_chain_buckets = 64;
    EXPECT_TRUE(o.Validate().ok());
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
  {
    ServerOptions o = Valid();
    o.qp_timeout = 32;
    ExpectRejected(o, "--qp_timeout");
  }
  {
    ServerOptions o = Valid();
    o.qp_retry_cnt = 8;
    ExpectRejected(o, "--qp_retry_cnt");
  }
  {
    ServerOptions o = Valid();
    o.spin_max_us = 1000001;
    ExpectRejected(o, "--spin_max_us");
  }
  {
    ServerOptions o = Valid();
    o.spin_us = 20;
    o.spin_max_us = 20;  // would never adapt: a mistake, not a setting
    ExpectRejected(o, "--spin_max_us");
  }
}

TEST(ServerOptions, AdaptiveSpinBoundAboveTheFixedSpinIsValid) {
  ServerOptions o = Valid();
  o.spin_max_us = 200;
  EXPECT_TRUE(o.Validate().ok());
}

TEST(ServerOptions, PortZeroAndIpv6Accepted) {
  ServerOptions o = Valid();
  o.listen = "127.0.0.1:0";
  EXPECT_TRUE(o.Validate().ok());
  o.listen = "[::1]:7000";
  EXPECT_TRUE(o.Validate().ok());
}

// A wildcard listener has no address to send moved clients to: without
// --advertise_address the node must refuse to start, naming the flag.
TEST(ServerOptions, WildcardListenNeedsAdvertiseAddress) {
  for (const char* listen :
       {"0.0.0.0:7000", "0.0.0.0:0", "[::]:7000", "0:7000", "[::ffff:0.0.0.0]:7000"}) {
    ServerOptions o = Valid();
    o.listen = listen;
    absl::Status s = o.Validate();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << listen;
    EXPECT_NE(s.message().find("--advertise_address"), absl::string_view::npos) << s;
    EXPECT_NE(s.message().find("wildcard"), absl::string_view::npos) << s;
    o.advertise_address = "192.0.2.10";
    EXPECT_TRUE(o.Validate().ok()) << listen << ": " << o.Validate();
  }
  // Specific listen addresses need none (the default is the listen address).
  for (const char* listen : {"127.0.0.1:7000", "[::1]:7000", "localhost:0", "192.0.2.10:7000"}) {
    ServerOptions o = Valid();
    o.listen = listen;
    EXPECT_TRUE(o.Validate().ok()) << listen << ": " << o.Validate();
  }
}

TEST(ServerOptions, AdvertiseAddressForms) {
  ServerOptions o = Valid();
  o.listen = "0.0.0.0:7000";
  for (const char* good : {"192.0.2.10", "192.0.2.10:7001", "node-1.example.org",
                           "node-1.example.org:7000", "[2001:db8::1]", "[2001:db8::1]:7000"}) {
    o.advertise_address = good;
    EXPECT_TRUE(o.Validate().ok()) << good << ": " << o.Validate();
  }
  for (const char* bad : {"0.0.0.0", "0.0.0.0:7000", "[::]", "[::]:7000", "2001:db8::1", "host:0",
                          "host:70000", ":7000", "[2001:db8::1", "a b", "a/b", "[]"}) {
    o.advertise_address = bad;
    ExpectRejected(o, "--advertise_address");
  }
  o.advertise_address = std::string(600, 'a');
  ExpectRejected(o, "--advertise_address");
}

TEST(ServerOptions, AdvertisedEndpoint) {
  // Default: the bound address, when it is specific.
  EXPECT_EQ(*AdvertisedEndpoint("", "127.0.0.1:40001"), "127.0.0.1:40001");
  EXPECT_EQ(*AdvertisedEndpoint("", "[::1]:40001"), "[::1]:40001");
  // A host alone takes the port actually bound (--listen with port 0).
  EXPECT_EQ(*AdvertisedEndpoint("127.0.0.1", "0.0.0.0:40001"), "127.0.0.1:40001");
  EXPECT_EQ(*AdvertisedEndpoint("[2001:db8::1]", "[::]:40001"), "[2001:db8::1]:40001");
  EXPECT_EQ(*AdvertisedEndpoint("node.example.org:7000", "0.0.0.0:40001"), "node.example.org:7000");
  // Never a wildcard.
  absl::StatusOr<std::string> e = AdvertisedEndpoint("", "0.0.0.0:40001");
  EXPECT_EQ(e.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(e.status().message().find("--advertise_address"), absl::string_view::npos);
  EXPECT_FALSE(AdvertisedEndpoint("", "[::]:40001").ok());
  EXPECT_FALSE(AdvertisedEndpoint("0.0.0.0", "127.0.0.1:40001").ok());
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

class AdminDir : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/kvnode-admindir-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    base_ = tmpl;
  }
  void TearDown() override { ASSERT_EQ(std::system(("rm -rf " + base_).c_str()), 0); }
  std::string Dir(const std::string& name, mode_t mode) {
    const std::string d = base_ + "/" + name;
    EXPECT_EQ(mkdir(d.c_str(), 0700), 0);
    EXPECT_EQ(chmod(d.c_str(), mode), 0);
    return d;
  }
  static mode_t ModeOf(const std::string& p) {
    struct stat st {};
    EXPECT_EQ(lstat(p.c_str(), &st), 0) << p;
    return st.st_mode & 07777;
  }
  std::string base_;
};

TEST_F(AdminDir, PrivateDirAccepted) {
  EXPECT_TRUE(EnsureAdminSocketDir(Dir("ok", 0700) + "/admin.sock").ok());
}

TEST_F(AdminDir, MissingDirCreated0700) {
  const std::string d = base_ + "/new";
  absl::Status s = EnsureAdminSocketDir(d + "/admin.sock");
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(ModeOf(d), 0700u);
}

TEST_F(AdminDir, GroupOrWorldAccessRefused) {
  for (mode_t m : {0777, 01777, 0770, 0750, 0705, 0720}) {
    const std::string d = Dir("m" + std::to_string(m), m);
    absl::Status s = EnsureAdminSocketDir(d + "/admin.sock");
    EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << std::oct << m;
    EXPECT_NE(s.message().find("directory " + d + " has mode"), absl::string_view::npos) << s;
    EXPECT_EQ(ModeOf(d), m) << "the check must not repair (or touch) the directory";
  }
}

TEST_F(AdminDir, SymlinkAndNonDirectoryRefused) {
  const std::string target = Dir("target", 0700);
  const std::string link = base_ + "/link";
  ASSERT_EQ(symlink(target.c_str(), link.c_str()), 0);
  absl::Status s = EnsureAdminSocketDir(link + "/admin.sock");
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(s.message().find("is a symbolic link"), absl::string_view::npos) << s;
  const std::string file = base_ + "/file";
  std::ofstream(file) << "x";
  s = EnsureAdminSocketDir(file + "/admin.sock");
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
}

TEST_F(AdminDir, OtherOwnerRefused) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to give a directory to uid 65534";
  const std::string d = Dir("other", 0700);
  ASSERT_EQ(chown(d.c_str(), 65534, 65534), 0);
  absl::Status s = EnsureAdminSocketDir(d + "/admin.sock");
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(s.message().find("owned by uid 65534"), absl::string_view::npos) << s;
}

}  // namespace
}  // namespace kvnode::server
