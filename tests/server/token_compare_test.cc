// TokensEqual (control_session.h), the auth token comparison, attacked
// without timing (no timed unit tests): a timing side channel needs the
// comparison to stop at the first differing byte, so these tests prove that
// it reads every byte even after a mismatch, and that no single-bit
// difference anywhere goes unnoticed.
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <string_view>

#include "gtest/gtest.h"
#include "kvnode/proto/control.h"
#include "kvnode/server/control_session.h"

namespace kvnode::server {
namespace {

TEST(TokensEqualAttack, EveryBitOfEveryByteCounts) {
  std::string token(64, '\0');
  for (size_t i = 0; i < token.size(); ++i) token[i] = static_cast<char>(i * 37 + 11);
  ASSERT_TRUE(TokensEqual(token, token));
  for (size_t i = 0; i < token.size(); ++i) {
    for (int bit = 0; bit < 8; ++bit) {
      std::string other = token;
      other[i] = static_cast<char>(other[i] ^ (1 << bit));
      EXPECT_FALSE(TokensEqual(other, token)) << "byte " << i << " bit " << bit;
      EXPECT_FALSE(TokensEqual(token, other)) << "byte " << i << " bit " << bit;
    }
  }
}

TEST(TokensEqualAttack, LengthDifferenceIsRefused) {
  EXPECT_FALSE(TokensEqual("secret", "secret\n"));
  EXPECT_FALSE(TokensEqual("secret", ""));
  EXPECT_FALSE(TokensEqual(std::string_view("a\0", 2), "a"));
}

// The guard page: the candidate token's tail lies on a page that is not
// readable; touching it raises SIGSEGV, whose handler makes the page
// readable, notes the touch and lets the load run again.
char* g_guard = nullptr;
size_t g_page = 0;
volatile sig_atomic_t g_touched = 0;

void OnSegv(int sig, siginfo_t* info, void* /*ctx*/) {
  char* addr = static_cast<char*>(info->si_addr);
  if (g_guard != nullptr && addr >= g_guard && addr < g_guard + g_page) {
    g_touched = 1;
    mprotect(g_guard, g_page, PROT_READ);
    return;
  }
  signal(sig, SIG_DFL);  // not ours: crash as usual
}

class GuardPage : public ::testing::Test {
 protected:
  void SetUp() override {
    g_page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    void* p = mmap(nullptr, 2 * g_page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ASSERT_NE(p, MAP_FAILED);
    base_ = static_cast<char*>(p);
    struct sigaction sa {};
    sa.sa_sigaction = OnSegv;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    ASSERT_EQ(sigaction(SIGSEGV, &sa, &old_segv_), 0);
  }
  void TearDown() override {
    sigaction(SIGSEGV, &old_segv_, nullptr);
    g_guard = nullptr;
    munmap(base_, 2 * g_page);
  }
  // The token's first `on_first_page` bytes end the first page, the rest
  // lies on the second, which is then made unreadable.
  std::string_view Place(const std::string& token, size_t on_first_page) {
    char* at = base_ + g_page - on_first_page;
    std::memcpy(at, token.data(), token.size());
    g_guard = base_ + g_page;
    g_touched = 0;
    EXPECT_EQ(mprotect(g_guard, g_page, PROT_NONE), 0);
    return std::string_view(at, token.size());
  }

  char* base_ = nullptr;
  struct sigaction old_segv_ {};
};

TEST_F(GuardPage, ReadsPastTheFirstMismatch) {
  // The longest token (1024 bytes), 128 of them before the guard page: an
  // early exit, even a vectorised one like memcmp's (32 or 64 bytes per
  // step), returns long before the guard page.
  const std::string token(proto::kMaxAuthTokenSize, 't');
  std::string presented = token;
  presented[0] = 'x';  // differs at the very first byte
  const std::string_view guarded = Place(presented, 128);
  EXPECT_FALSE(TokensEqual(guarded, token));
  EXPECT_EQ(g_touched, 1) << "the comparison stopped at the first differing byte: its time "
                             "tells an attacker how long a prefix of the token it guessed";
}

TEST_F(GuardPage, ReadsTheWholeTokenWhenEqual) {
  const std::string token(proto::kMaxAuthTokenSize, 's');
  const std::string_view guarded = Place(token, 128);
  EXPECT_TRUE(TokensEqual(token, guarded));
  EXPECT_EQ(g_touched, 1);
}

}  // namespace
}  // namespace kvnode::server
