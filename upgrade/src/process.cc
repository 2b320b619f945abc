#include "kvnode/upgrade/process.h"

#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "kvnode/base/errno.h"
#include "kvnode/base/poll.h"
#include "kvnode/proto/wire.h"

extern char** environ;

#ifndef P_PIDFD
#define P_PIDFD 3
#endif

namespace kvnode::upgrade {
namespace {

using proto::wire::Av;

using base::ErrnoStatus;

// Where N finds the handoff channel (the first descriptor after stdio).
constexpr int kChildChannelFd = 3;

// The child's set-up for posix_spawn: the channel on kChildChannelFd (dup2
// clears CLOEXEC, onto itself too since glibc 2.29), every descriptor above
// it closed, and an empty signal mask (a server that blocks signals for a
// signal thread must not hand that mask to N).
struct SpawnAttributes {
  posix_spawn_file_actions_t actions;
  posix_spawnattr_t attr;
  bool actions_ok = false;
  bool attr_ok = false;

  SpawnAttributes() = default;
  SpawnAttributes(const SpawnAttributes&) = delete;
  SpawnAttributes& operator=(const SpawnAttributes&) = delete;
  ~SpawnAttributes() {
    if (attr_ok) posix_spawnattr_destroy(&attr);
    if (actions_ok) posix_spawn_file_actions_destroy(&actions);
  }

  // 0 or an errno.
  int Prepare(int channel_fd) {
    if (int e = posix_spawn_file_actions_init(&actions); e != 0) return e;
    actions_ok = true;
    if (int e = posix_spawnattr_init(&attr); e != 0) return e;
    attr_ok = true;
    sigset_t none;
    sigemptyset(&none);
    int e = posix_spawn_file_actions_adddup2(&actions, channel_fd, kChildChannelFd);
    if (e == 0) e = posix_spawn_file_actions_addclosefrom_np(&actions, kChildChannelFd + 1);
    if (e == 0) e = posix_spawnattr_setsigmask(&attr, &none);
    if (e == 0) e = posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK);
    return e;
  }
};

int PidfdOpen(pid_t pid) { return static_cast<int>(syscall(SYS_pidfd_open, pid, 0)); }

// Waits for POLLIN on fd; false if the deadline passed first.
absl::StatusOr<bool> WaitReadable(int fd, absl::Time deadline) {
  absl::StatusOr<short> r = base::PollUntil(fd, POLLIN, deadline);
  if (!r.ok()) return r.status();
  return *r != 0;
}

std::string CurrentDir() {
  char buf[PATH_MAX];
  if (getcwd(buf, sizeof(buf)) == nullptr) return "";
  return buf;
}

std::string MakeAbsolute(std::string_view p) {
  if (!p.empty() && p.front() == '/') return std::string(p);
  std::string cwd = CurrentDir();
  if (cwd.empty()) return std::string(p);
  if (p.substr(0, 2) == "./") p.remove_prefix(2);
  return absl::StrCat(cwd, cwd.back() == '/' ? "" : "/", Av(p));
}

absl::Status CheckExecutable(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0)
    return ErrnoStatus(errno, absl::StrCat("upgrade binary ", path));
  if (!S_ISREG(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat("upgrade binary ", path, ": not a regular file"));
  }
  if (access(path.c_str(), X_OK) != 0) {
    return ErrnoStatus(errno, absl::StrCat("upgrade binary ", path, " not executable"));
  }
  return absl::OkStatus();
}

bool IsHandoffArg(std::string_view a, bool* takes_next) {
  *takes_next = false;
  if (a.substr(0, 2) == "--") {
    a.remove_prefix(2);
  } else if (a.substr(0, 1) == "-") {
    a.remove_prefix(1);
  } else {
    return false;
  }
  const std::string_view name(kHandoffFlagName);
  if (a.substr(0, name.size()) != name) return false;
  a.remove_prefix(name.size());
  if (a.empty()) {
    *takes_next = true;
    return true;
  }
  return a.front() == '=';
}

}  // namespace

absl::StatusOr<std::string> ResolveStartBinary(std::string_view argv0) {
  if (argv0.empty()) return absl::InvalidArgumentError("upgrade: argv[0] is empty");
  std::string path;
  if (argv0.find('/') != std::string_view::npos) {
    path = MakeAbsolute(argv0);
  } else {
    const char* env = getenv("PATH");
    const std::string_view search = env != nullptr ? env : "/usr/local/bin:/usr/bin:/bin";
    for (absl::string_view dir :
         absl::StrSplit(absl::string_view(search.data(), search.size()), ':')) {
      const std::string candidate = absl::StrCat(dir.empty() ? "." : dir, "/", Av(argv0));
      if (CheckExecutable(candidate).ok()) {
        path = MakeAbsolute(candidate);
        break;
      }
    }
    if (path.empty()) {
      return absl::NotFoundError(absl::StrCat(
          "upgrade: '", Av(argv0), "' not found in PATH=", Av(search), "; pass --upgrade_binary"));
    }
  }
  if (absl::Status s = CheckExecutable(path); !s.ok()) return s;
  return path;
}

absl::StatusOr<std::string> CheckUpgradeBinary(std::string_view path) {
  if (path.empty()) return absl::InvalidArgumentError("upgrade: empty binary path");
  std::string abs = MakeAbsolute(path);
  if (absl::Status s = CheckExecutable(abs); !s.ok()) return s;
  return abs;
}

std::string FormatHandoffArg(const HandoffArg& a) {
  return absl::StrCat("--", kHandoffFlagName, "=", a.fd, ":", a.o_pid);
}

absl::StatusOr<HandoffArg> ParseHandoffArg(std::string_view value) {
  const size_t colon = value.find(':');
  HandoffArg a;
  int64_t pid = 0;
  if (colon == std::string_view::npos ||
      !absl::SimpleAtoi(absl::string_view(value.data(), colon), &a.fd) ||
      !absl::SimpleAtoi(absl::string_view(value.data() + colon + 1, value.size() - colon - 1),
                        &pid) ||
      a.fd < 0 || pid <= 0 || pid > INT32_MAX) {
    return absl::InvalidArgumentError(absl::StrCat("--", kHandoffFlagName, "='", Av(value),
                                                   "': expected FD:PID (fd >= 0, pid > 0)"));
  }
  a.o_pid = static_cast<pid_t>(pid);
  return a;
}

std::vector<std::string> WithoutHandoffArg(std::span<const std::string> argv) {
  std::vector<std::string> out;
  for (size_t i = 0; i < argv.size(); ++i) {
    bool takes_next = false;
    if (i > 0 && IsHandoffArg(argv[i], &takes_next)) {
      if (takes_next) ++i;
      continue;
    }
    out.push_back(argv[i]);
  }
  return out;
}

std::vector<std::string> BuildChildArgv(std::span<const std::string> argv, const HandoffArg& a) {
  std::vector<std::string> out = WithoutHandoffArg(argv);
  out.push_back(FormatHandoffArg(a));
  return out;
}

std::vector<char*> ExecArgv(std::vector<std::string>& args) {
  std::vector<char*> out;
  out.reserve(args.size() + 1);
  for (std::string& a : args) out.push_back(a.data());
  out.push_back(nullptr);
  return out;
}

std::string ExitStatus::ToString() const {
  if (exited) return absl::StrCat("exited ", code);
  if (signaled) return absl::StrCat("killed by signal ", signal, " (", strsignal(signal), ")");
  return "still running";
}

absl::StatusOr<Process> Process::Open(pid_t pid, bool is_child) {
  if (pid <= 0) return absl::InvalidArgumentError(absl::StrCat("upgrade: bad pid ", pid));
  base::UniqueFd fd(PidfdOpen(pid));
  if (!fd.valid()) return ErrnoStatus(errno, absl::StrCat("pidfd_open(", pid, ")"));
  return Process(pid, std::move(fd), is_child);
}

bool Process::HasExited() const {
  pollfd p{pidfd_.get(), POLLIN, 0};
  return poll(&p, 1, 0) > 0;
}

absl::Status Process::WaitExit(absl::Time deadline) const {
  absl::StatusOr<bool> r = WaitReadable(pidfd_.get(), deadline);
  if (!r.ok()) return r.status();
  if (!*r) {
    return absl::DeadlineExceededError(absl::StrCat("upgrade: pid ", pid_, " still alive"));
  }
  return absl::OkStatus();
}

absl::StatusOr<ExitStatus> Process::Reap(absl::Time deadline) {
  if (!is_child_) {
    return absl::FailedPreconditionError(absl::StrCat("upgrade: pid ", pid_, " is not our child"));
  }
  if (reaped_) return absl::FailedPreconditionError(absl::StrCat("upgrade: pid ", pid_, " reaped"));
  if (absl::Status s = WaitExit(deadline); !s.ok()) return s;
  siginfo_t info{};
  for (;;) {
    if (waitid(static_cast<idtype_t>(P_PIDFD), static_cast<id_t>(pidfd_.get()), &info,
               WEXITED | WNOHANG) == 0) {
      break;
    }
    if (errno != EINTR) return ErrnoStatus(errno, absl::StrCat("waitid(pid ", pid_, ")"));
  }
  if (info.si_pid == 0) {
    // pidfd was readable but no status: cannot happen for a child we own.
    return absl::InternalError(absl::StrCat("upgrade: pid ", pid_, " exited but left no status"));
  }
  reaped_ = true;
  ExitStatus st;
  if (info.si_code == CLD_EXITED) {
    st.exited = true;
    st.code = info.si_status;
  } else {
    st.signaled = true;
    st.signal = info.si_status;
  }
  return st;
}

absl::Status Process::Signal(int sig) const {
  if (syscall(SYS_pidfd_send_signal, pidfd_.get(), sig, nullptr, 0) != 0) {
    return ErrnoStatus(errno, absl::StrCat("pidfd_send_signal(pid ", pid_, ", ", sig, ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<ExitStatus> Process::KillAndReap(absl::Time deadline) {
  if (absl::Status s = Signal(SIGKILL); !s.ok() && !absl::IsNotFound(s)) return s;  // ESRCH: gone
  return Reap(deadline);
}

absl::StatusOr<Process> SpawnWithHandoff(const SpawnRequest& req, base::UniqueFd child_end) {
  if (req.binary.empty() || req.binary.front() != '/') {
    return absl::InvalidArgumentError(
        absl::StrCat("upgrade: spawn needs an absolute binary path, got '", req.binary, "'"));
  }
  if (req.argv.empty()) return absl::InvalidArgumentError("upgrade: spawn with an empty argv");
  if (!child_end.valid()) return absl::InvalidArgumentError("upgrade: spawn without a channel fd");

  std::vector<std::string> args = BuildChildArgv(req.argv, HandoffArg{kChildChannelFd, getpid()});
  std::vector<char*> argvp = ExecArgv(args);

  SpawnAttributes sa;
  if (int e = sa.Prepare(child_end.get()); e != 0) {
    return ErrnoStatus(e, "upgrade: posix_spawn set-up");
  }
  pid_t pid = 0;
  // Blocks this thread until the exec is done (vfork semantics: the child
  // borrows our address space until then, no page table is copied, so the
  // other threads go on serving); the upgrade's watchdog bounds it.
  if (int e = posix_spawn(&pid, req.binary.c_str(), &sa.actions, &sa.attr, argvp.data(), environ);
      e != 0) {
    return ErrnoStatus(e, absl::StrCat("upgrade: exec ", req.binary));
  }
  child_end.Reset();  // only N holds it now: N's death reads as EOF on ours
  // Cannot race with pid reuse: the child is ours and unreaped.
  absl::StatusOr<Process> opened = Process::Open(pid, /*is_child=*/true);
  if (!opened.ok()) {
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
    return opened.status();
  }
  return std::move(*opened);
}

}  // namespace kvnode::upgrade
