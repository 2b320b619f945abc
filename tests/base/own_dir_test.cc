// base::EnsureOwnDirectory (own_dir.h) with the database directory's rule
// (0022: nobody else may write it); the admin socket's (0077) is tested
// through EnsureAdminSocketDir in server_options_test.
#include "kvnode/base/own_dir.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

namespace kvnode::base {
namespace {

class OwnDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/kv-own-dir-test.XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    base_ = tmpl;
  }
  void TearDown() override { (void)std::system(("rm -rf " + base_).c_str()); }
  std::string Dir(const std::string& name, mode_t mode) {
    const std::string d = base_ + "/" + name;
    EXPECT_EQ(mkdir(d.c_str(), 0700), 0) << d;
    EXPECT_EQ(chmod(d.c_str(), mode), 0) << d;
    return d;
  }
  std::string base_;
};

TEST_F(OwnDirTest, OthersMayReadButNotWrite) {
  EXPECT_TRUE(EnsureOwnDirectory("--db_path x", Dir("r", 0755), 0022).ok());
  for (mode_t m : {0775, 0757, 0777, 01777}) {
    const std::string d = Dir("w" + std::to_string(m), m);
    absl::Status s = EnsureOwnDirectory("--db_path " + d, d, 0022);
    EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << std::oct << m;
    EXPECT_NE(s.message().find("--db_path " + d + ": directory " + d + " has mode"),
              std::string::npos)
        << s;
    EXPECT_NE(s.message().find("group/others can write it"), std::string::npos) << s;
  }
}

TEST_F(OwnDirTest, ALinkIsRefusedWithOrWithoutATrailingSlash) {
  const std::string target = Dir("target", 0700);
  const std::string link = base_ + "/link";
  ASSERT_EQ(symlink(target.c_str(), link.c_str()), 0);
  for (const std::string& p : {link, link + "/", link + "//"}) {
    absl::Status s = EnsureOwnDirectory("--db_path " + p, p, 0022);
    EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << p;
    EXPECT_NE(s.message().find(link + " is a symbolic link"), std::string::npos) << s;
  }
}

TEST_F(OwnDirTest, MissingIsCreated0700OrAcceptedAsAsked) {
  const std::string d = base_ + "/new";
  EXPECT_TRUE(EnsureOwnDirectory("x", d, 0022, MissingDir::kAccept).ok());
  struct stat st {};
  EXPECT_NE(lstat(d.c_str(), &st), 0) << "kAccept must not create it";
  EXPECT_TRUE(EnsureOwnDirectory("x", d, 0022).ok());
  ASSERT_EQ(lstat(d.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0700u);
  absl::Status s = EnsureOwnDirectory("x", base_ + "/no/such/parent", 0022);
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(s.message().find("mkdir " + base_ + "/no/such/parent"), std::string::npos) << s;
}

TEST_F(OwnDirTest, AnotherOwnerIsNamed) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to give a directory to uid 65534";
  const std::string d = Dir("other", 0700);
  ASSERT_EQ(chown(d.c_str(), 65534, 65534), 0);
  absl::Status s = EnsureOwnDirectory("--db_path " + d, d, 0022);
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(s.message().find("directory " + d + " is owned by uid 65534, not by this node's uid 0"),
            std::string::npos)
      << s;
}

}  // namespace
}  // namespace kvnode::base
