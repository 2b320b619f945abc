#include "kvnode/upgrade/process.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "kvnode/upgrade/channel.h"
#include "kvnode/upgrade/fault.h"

namespace kvnode::upgrade {
namespace {

absl::Time Soon() { return absl::Now() + absl::Seconds(10); }

class TempDir {
 public:
  TempDir() {
    char t[] = "/tmp/kvupgrade-proc-XXXXXX";
    path_ = mkdtemp(t);
  }
  ~TempDir() { (void)system(("rm -rf " + path_).c_str()); }
  const std::string& path() const { return path_; }
  std::string Script(const std::string& name, mode_t mode) const {
    const std::string p = path_ + "/" + name;
    std::ofstream(p) << "#!/bin/sh\nexit 0\n";
    chmod(p.c_str(), mode);
    return p;
  }

 private:
  std::string path_;
};

TEST(ResolveBinary, AbsoluteRelativeAndPath) {
  TempDir d;
  const std::string exe = d.Script("kvnode-x", 0755);
  EXPECT_EQ(*ResolveStartBinary(exe), exe);

  char cwd[4096];
  ASSERT_NE(getcwd(cwd, sizeof(cwd)), nullptr);
  ASSERT_EQ(chdir(d.path().c_str()), 0);
  absl::StatusOr<std::string> rel = ResolveStartBinary("./kvnode-x");
  ASSERT_EQ(chdir(cwd), 0);
  ASSERT_TRUE(rel.ok()) << rel.status();
  EXPECT_EQ(*rel, exe);

  const char* old_path = getenv("PATH");
  const std::string saved = old_path ? old_path : "";
  setenv("PATH", ("/nonexistent:" + d.path()).c_str(), 1);
  absl::StatusOr<std::string> found = ResolveStartBinary("kvnode-x");
  absl::StatusOr<std::string> missing = ResolveStartBinary("kvnode-nope");
  setenv("PATH", saved.c_str(), 1);
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(*found, exe);
  EXPECT_TRUE(absl::IsNotFound(missing.status())) << missing.status();

  // Symlinks are kept, so that flipping the link upgrades to its new target.
  const std::string link = d.path() + "/current";
  ASSERT_EQ(symlink(exe.c_str(), link.c_str()), 0);
  EXPECT_EQ(*ResolveStartBinary(link), link);

  EXPECT_FALSE(ResolveStartBinary("").ok());
  EXPECT_FALSE(ResolveStartBinary(d.path()).ok());  // a directory
  // A file without any x bit is refused, even for root (access(X_OK)).
  const std::string noexec = d.Script("plain", 0644);
  EXPECT_TRUE(absl::IsPermissionDenied(CheckUpgradeBinary(noexec).status()))
      << CheckUpgradeBinary(noexec).status();
  EXPECT_TRUE(absl::IsNotFound(CheckUpgradeBinary(d.path() + "/nope").status()));
  EXPECT_EQ(*CheckUpgradeBinary(exe), exe);
}

TEST(HandoffArgs, FormatParseAndChildArgv) {
  EXPECT_EQ(FormatHandoffArg({5, 1234}), "--upgrade_handoff=5:1234");
  EXPECT_EQ(*ParseHandoffArg("5:1234"), (HandoffArg{5, 1234}));
  for (const char* bad : {"", "5", "5:", ":7", "x:7", "5:0", "-1:7", "5:7:9", "5:99999999999"}) {
    EXPECT_FALSE(ParseHandoffArg(bad).ok()) << bad;
  }
  const std::vector<std::string> argv = {"/bin/kvnode",           "--listen=1:2",
                                         "--upgrade_handoff=3:4", "-upgrade_handoff=3:4",
                                         "--upgrade_handoff",     "3:4",
                                         "-upgrade_handoff",      "3:4",
                                         "--upgrade_handoff_x=1", "--upgrade_fault=n_ready:hang"};
  EXPECT_EQ(BuildChildArgv(argv, {9, 10}),
            (std::vector<std::string>{"/bin/kvnode", "--listen=1:2", "--upgrade_handoff_x=1",
                                      "--upgrade_fault=n_ready:hang", "--upgrade_handoff=9:10"}));
  EXPECT_EQ(WithoutHandoffArg(argv),
            (std::vector<std::string>{"/bin/kvnode", "--listen=1:2", "--upgrade_handoff_x=1",
                                      "--upgrade_fault=n_ready:hang"}));
}

TEST(Spawn, ExecFailureIsReported) {
  absl::StatusOr<HandoffChannel::Pair> pair = HandoffChannel::CreatePair();
  ASSERT_TRUE(pair.ok());
  absl::StatusOr<Process> p =
      SpawnWithHandoff({"/nonexistent/kvnode", {"kvnode"}}, std::move(pair->child_end));
  EXPECT_TRUE(absl::IsNotFound(p.status())) << p.status();
  EXPECT_NE(p.status().message().find("/nonexistent/kvnode"), std::string_view::npos);
}

// The spawn must not copy the caller's page tables: a fork write-protects
// every private page of O, and O's data thread then takes a fault on each
// page it writes (and waits on O's mmap lock while the fork copies). Counted
// in page faults, not time: after a fork, rewriting 16384 pages faults
// 16384 times; after posix_spawn, not at all.
TEST(Spawn, LeavesTheCallersPagesWritable) {
  constexpr size_t kPages = 16384;
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t bytes = kPages * page;
  void* m = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(m, MAP_FAILED);
  (void)madvise(m, bytes, MADV_NOHUGEPAGE);  // one fault per page, not per huge page
  auto* p = static_cast<volatile char*>(m);
  auto write_all = [&] {
    for (size_t i = 0; i < bytes; i += page) p[i] = static_cast<char>(i);
  };
  auto faults = [] {
    rusage ru{};
    getrusage(RUSAGE_THREAD, &ru);
    return ru.ru_minflt;
  };
  write_all();  // populated and writable

  absl::StatusOr<HandoffChannel::Pair> pair = HandoffChannel::CreatePair();
  ASSERT_TRUE(pair.ok());
  absl::StatusOr<Process> child =
      SpawnWithHandoff({"/bin/true", {"true"}}, std::move(pair->child_end));
  ASSERT_TRUE(child.ok()) << child.status();
  absl::StatusOr<ExitStatus> st = child->Reap(Soon());
  ASSERT_TRUE(st.ok()) << st.status();

  const long before = faults();
  write_all();
  EXPECT_LT(faults() - before, static_cast<long>(kPages / 16));
  munmap(m, bytes);
}

struct Listener {
  base::UniqueFd fd;
  uint16_t port = 0;
};
Listener Listen() {
  Listener l;
  l.fd.Reset(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(l.fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a));
  listen(l.fd.get(), 4);
  socklen_t len = sizeof(a);
  getsockname(l.fd.get(), reinterpret_cast<sockaddr*>(&a), &len);
  l.port = ntohs(a.sin_port);
  return l;
}

// O's side of the whole conversation against the real exec'd helper.
TEST(Spawn, FullHandoffWithExecdPeer) {
  absl::StatusOr<HandoffChannel::Pair> pair = HandoffChannel::CreatePair();
  ASSERT_TRUE(pair.ok());
  base::UniqueFd stray(open("/dev/null", O_RDONLY));  // not CLOEXEC: must not reach N
  // A blocked signal in O must not be blocked in N.
  sigset_t usr2, old;
  sigemptyset(&usr2);
  sigaddset(&usr2, SIGUSR2);
  pthread_sigmask(SIG_BLOCK, &usr2, &old);
  absl::StatusOr<Process> n =
      SpawnWithHandoff({KVNODE_HANDOFF_PEER, {"handoff_peer", "--upgrade_handoff=99:1"}},
                       std::move(pair->child_end));
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  ASSERT_TRUE(n.ok()) << n.status();
  HandoffChannel& ch = pair->parent;
  ch.SetPeerPid(n->pid());

  absl::StatusOr<ReceivedMessage> hello = ch.Receive(Soon());
  ASSERT_TRUE(hello.ok()) << hello.status();
  const Hello& h = std::get<Hello>(hello->message);
  EXPECT_EQ(h.pid, static_cast<uint32_t>(n->pid()));
  // Exactly stdin/out/err plus the channel (on 3); nothing blocked.
  EXPECT_EQ(h.build_id, "fds=0,1,2,3 sigblk=0");
  ASSERT_TRUE(std::holds_alternative<Ready>(ch.Receive(Soon())->message));

  Listener l = Listen();
  const int fds[] = {l.fd.get()};
  ASSERT_TRUE(ch.Send(HandOver{2, {FdRole::kListenTcp}, {}, {}}, fds, Soon()).ok());
  absl::StatusOr<ReceivedMessage> owned = ch.Receive(Soon());
  ASSERT_TRUE(owned.ok()) << owned.status();
  ASSERT_TRUE(std::holds_alternative<Owned>(owned->message));
  l.fd.Reset();  // only N's copy accepts now
  base::UniqueFd c(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(l.port);
  ASSERT_EQ(connect(c.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  char b = 0;
  ASSERT_EQ(read(c.get(), &b, 1), 1);
  EXPECT_EQ(b, 'N');
  ASSERT_TRUE(ch.Send(Gone{1, 0, {}}, Soon()).ok());
  absl::StatusOr<ExitStatus> st = n->Reap(Soon());
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_TRUE(st->success()) << st->ToString();
}

// Each n_* phase x each action, as O sees it: crash -> EOF and exit 86;
// hang -> O's deadline, then SIGKILL; fail -> Abort{kInjectedFault}.
TEST(Spawn, FaultMatrixOnTheNewSide) {
  const Phase phases[] = {Phase::kNAttach, Phase::kNRegister, Phase::kNReady, Phase::kNOpenDb,
                          Phase::kNAccepting};
  for (Phase phase : phases) {
    for (const char* action : {"crash", "hang", "fail"}) {
      const std::string fault = std::string(PhaseName(phase)) + ":" + action;
      SCOPED_TRACE(fault);
      absl::StatusOr<HandoffChannel::Pair> pair = HandoffChannel::CreatePair();
      ASSERT_TRUE(pair.ok());
      absl::StatusOr<Process> n =
          SpawnWithHandoff({KVNODE_HANDOFF_PEER, {"handoff_peer", "--upgrade_fault=" + fault}},
                           std::move(pair->child_end));
      ASSERT_TRUE(n.ok()) << n.status();
      HandoffChannel& ch = pair->parent;
      ch.SetPeerPid(n->pid());
      Listener l = Listen();
      // Run O's side until something other than the happy path happens.
      absl::Status outcome;
      std::optional<Abort> abort;
      // Short only where the peer is known to hang, so a slow machine cannot
      // turn a crash or fail case into a false deadline.
      const absl::Duration phase_deadline =
          std::string(action) == "hang" ? absl::Milliseconds(200) : absl::Seconds(10);
      for (;;) {
        absl::StatusOr<ReceivedMessage> r = ch.Receive(absl::Now() + phase_deadline);
        if (!r.ok()) {
          outcome = r.status();
          break;
        }
        if (const auto* a = std::get_if<Abort>(&r->message)) {
          abort = *a;
          break;
        }
        if (std::holds_alternative<Ready>(r->message)) {
          const int fds[] = {l.fd.get()};
          ASSERT_TRUE(ch.Send(HandOver{2, {FdRole::kListenTcp}, {}, {}}, fds, Soon()).ok());
        }
        ASSERT_FALSE(std::holds_alternative<Owned>(r->message)) << "fault did not fire";
      }
      if (std::string(action) == "crash") {
        EXPECT_TRUE(absl::IsUnavailable(outcome)) << outcome;
        absl::StatusOr<ExitStatus> st = n->Reap(Soon());
        ASSERT_TRUE(st.ok());
        EXPECT_TRUE(st->exited && st->code == kInjectedCrashExitCode) << st->ToString();
      } else if (std::string(action) == "hang") {
        EXPECT_TRUE(absl::IsDeadlineExceeded(outcome)) << outcome;
        EXPECT_FALSE(n->HasExited());
        absl::StatusOr<ExitStatus> st = n->KillAndReap(Soon());
        ASSERT_TRUE(st.ok());
        EXPECT_TRUE(st->signaled && st->signal == SIGKILL) << st->ToString();
      } else {
        ASSERT_TRUE(abort.has_value()) << outcome;
        EXPECT_EQ(abort->code, static_cast<uint32_t>(AbortCode::kInjectedFault));
        EXPECT_NE(abort->message.find(PhaseName(phase)), std::string::npos) << abort->message;
        absl::StatusOr<ExitStatus> st = n->Reap(Soon());
        ASSERT_TRUE(st.ok());
        EXPECT_TRUE(st->exited && st->code == 1) << st->ToString();
      }
    }
  }
}

TEST(ProcessHandle, NonChildAndGone) {
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    pause();
    _exit(0);
  }
  absl::StatusOr<Process> watcher = Process::Open(pid, /*is_child=*/false);
  ASSERT_TRUE(watcher.ok());
  EXPECT_FALSE(watcher->HasExited());
  EXPECT_TRUE(absl::IsFailedPrecondition(watcher->Reap(Soon()).status()));
  ASSERT_TRUE(watcher->Signal(SIGTERM).ok());
  EXPECT_TRUE(watcher->WaitExit(Soon()).ok());
  EXPECT_TRUE(watcher->HasExited());
  absl::StatusOr<Process> child = Process::Open(pid, /*is_child=*/true);
  ASSERT_TRUE(child.ok());  // a zombie still has a pidfd
  absl::StatusOr<ExitStatus> st = child->Reap(Soon());
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_EQ(st->ToString(), "killed by signal 15 (Terminated)");
  EXPECT_FALSE(child->Reap(Soon()).ok());  // once
  EXPECT_TRUE(absl::IsNotFound(Process::Open(pid, true).status()));
}

}  // namespace
}  // namespace kvnode::upgrade
