#include "kvnode/upgrade/sd_notify.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "kvnode/base/unique_fd.h"

namespace kvnode::upgrade {
namespace {

// A datagram socket standing in for systemd, at a path or an abstract name.
class FakeSystemd {
 public:
  explicit FakeSystemd(bool abstract) {
    fd_.Reset(socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0));
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    name_ = abstract ? "@kvupgrade-notify-" + std::to_string(getpid())
                     : "/tmp/kvupgrade-notify-" + std::to_string(getpid());
    if (!abstract) unlink(name_.c_str());
    std::memcpy(a.sun_path, name_.data(), name_.size());
    if (abstract) a.sun_path[0] = '\0';
    const socklen_t len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + name_.size());
    ok_ = bind(fd_.get(), reinterpret_cast<sockaddr*>(&a), len) == 0;
    setenv("NOTIFY_SOCKET", name_.c_str(), 1);
  }
  ~FakeSystemd() {
    unsetenv("NOTIFY_SOCKET");
    if (name_[0] == '/') unlink(name_.c_str());
  }
  bool ok() const { return ok_; }
  std::string Next() {
    char buf[512];
    const ssize_t n = recv(fd_.get(), buf, sizeof(buf), MSG_DONTWAIT);
    return n < 0 ? "<nothing>" : std::string(buf, static_cast<size_t>(n));
  }

 private:
  base::UniqueFd fd_;
  std::string name_;
  bool ok_ = false;
};

TEST(SdNotify, PathSocket) {
  FakeSystemd sd(/*abstract=*/false);
  ASSERT_TRUE(sd.ok());
  ASSERT_TRUE(SdNotifyReady().ok());
  EXPECT_EQ(sd.Next(), "READY=1");
  ASSERT_TRUE(SdNotifyNewMainPid(4242).ok());
  EXPECT_EQ(sd.Next(), "MAINPID=4242\nREADY=1");
  ASSERT_TRUE(SdNotifyMainPid(4243).ok());
  EXPECT_EQ(sd.Next(), "MAINPID=4243");
  ASSERT_TRUE(SdNotifyReloading().ok());
  EXPECT_EQ(sd.Next().rfind("RELOADING=1\nMONOTONIC_USEC=", 0), 0u);
  ASSERT_TRUE(SdNotifyStatus("upgrading to generation 3").ok());
  EXPECT_EQ(sd.Next(), "STATUS=upgrading to generation 3");
  EXPECT_FALSE(SdNotifyStatus("two\nlines").ok());
  ASSERT_TRUE(SdNotifyStopping().ok());
  EXPECT_EQ(sd.Next(), "STOPPING=1");
}

TEST(SdNotify, AbstractSocket) {
  FakeSystemd sd(/*abstract=*/true);
  ASSERT_TRUE(sd.ok());
  ASSERT_TRUE(SdNotifyNewMainPid(7).ok());
  EXPECT_EQ(sd.Next(), "MAINPID=7\nREADY=1");
}

TEST(SdNotify, UnsetIsANoOpAndNonsenseIsAnError) {
  unsetenv("NOTIFY_SOCKET");
  EXPECT_TRUE(SdNotifyReady().ok());
  setenv("NOTIFY_SOCKET", "relative/path", 1);
  EXPECT_TRUE(absl::IsInvalidArgument(SdNotifyReady()));
  setenv("NOTIFY_SOCKET", "/nonexistent/kvupgrade/notify", 1);
  EXPECT_TRUE(absl::IsUnavailable(SdNotifyReady()));
  unsetenv("NOTIFY_SOCKET");
}

}  // namespace
}  // namespace kvnode::upgrade
