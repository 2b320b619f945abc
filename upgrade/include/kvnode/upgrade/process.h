// Starting the new process and watching processes die.
//
//  * ResolveStartBinary(argv[0]) at start: the path the next upgrade execs by
//    default (not /proc/self/exe, which names the old, possibly deleted file).
//  * BuildChildArgv: the same argv, minus any handoff argument inherited from
//    an earlier upgrade, plus --upgrade_handoff=FD:PID. WithoutHandoffArg:
//    the argv a new process that cannot take over restarts itself with.
//  * SpawnWithHandoff: posix_spawn with exactly one extra descriptor inherited.
//  * Process: a pidfd (pidfd_open) for any pid; poll it to learn of a death
//    without races against pid reuse, reap children with waitid(P_PIDFD).
//
// The process must not ignore SIGCHLD (SIG_IGN would auto-reap N and
// Process::Reap would then fail with ECHILD).
//
// Thread safety: functions are reentrant; a Process is used by one thread.
#ifndef KVNODE_UPGRADE_PROCESS_H_
#define KVNODE_UPGRADE_PROCESS_H_

#include <sys/types.h>

#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kvnode/base/unique_fd.h"

namespace kvnode::upgrade {

// --- the binary --------------------------------------------------------------

// The absolute path of the binary this process was started from, computed
// from argv[0] at start (call it before any chdir):
//   * argv[0] with a '/': made absolute against the current directory;
//   * a bare name: looked up in $PATH like execvp (first executable regular
//     file), made absolute.
// Symbolic links are NOT resolved: a deployment that flips a symlink to a
// new release must have the upgrade exec the link, i.e. the new release.
// The result must name an executable regular file (NotFound /
// PermissionDenied / FailedPrecondition otherwise).
[[nodiscard]] absl::StatusOr<std::string> ResolveStartBinary(std::string_view argv0);

// Checks an explicit --upgrade_binary / `kvctl upgrade PATH`: made absolute
// against the current directory, must be an executable regular file.
[[nodiscard]] absl::StatusOr<std::string> CheckUpgradeBinary(std::string_view path);

// --- the handoff argument ----------------------------------------------------

// gflags name of the argument N receives: --upgrade_handoff=FD:PID. The
// server defines the flag (string, default "") in its main().
inline constexpr char kHandoffFlagName[] = "upgrade_handoff";

struct HandoffArg {
  int fd = -1;      // N's end of the channel
  pid_t o_pid = 0;  // the old process (expected SO_PEERCRED / SCM_CREDENTIALS pid)
  friend bool operator==(const HandoffArg&, const HandoffArg&) = default;
};
std::string FormatHandoffArg(const HandoffArg& a);  // "--upgrade_handoff=5:1234"
// Parses the flag's value "FD:PID" (InvalidArgument otherwise).
[[nodiscard]] absl::StatusOr<HandoffArg> ParseHandoffArg(std::string_view value);

// argv (argv[0] included) without any handoff argument (all gflags
// spellings: --x=v, -x=v, --x v, -x v).
std::vector<std::string> WithoutHandoffArg(std::span<const std::string> argv);
// WithoutHandoffArg(argv) with FormatHandoffArg(a) appended.
std::vector<std::string> BuildChildArgv(std::span<const std::string> argv, const HandoffArg& a);
// The argv execv and posix_spawn take: pointers into args (which must
// outlive it), then a null.
std::vector<char*> ExecArgv(std::vector<std::string>& args);

// --- processes ---------------------------------------------------------------

struct ExitStatus {
  bool exited = false;  // normal exit; `code` valid
  int code = 0;
  bool signaled = false;  // killed; `signal` valid
  int signal = 0;
  bool success() const { return exited && code == 0; }
  std::string ToString() const;  // "exited 0", "killed by signal 9 (Killed)"
};

class Process {
 public:
  // A pidfd for `pid`. `is_child`: Reap may be used. NotFound if the process
  // is already gone (for a child: already reaped).
  [[nodiscard]] static absl::StatusOr<Process> Open(pid_t pid, bool is_child);

  Process(Process&&) = default;
  Process& operator=(Process&&) = default;
  // Closes the pidfd only: never kills, never waits (an unreaped child
  // becomes a zombie until this process exits, when init reaps it).
  ~Process() = default;

  pid_t pid() const { return pid_; }
  int pidfd() const { return pidfd_.get(); }  // POLLIN = the process has exited

  // Has it exited (non-blocking)?
  bool HasExited() const;
  // Waits until it exits; DeadlineExceeded if still alive at `deadline`.
  [[nodiscard]] absl::Status WaitExit(absl::Time deadline) const;
  // Children only: waits for the exit and collects the status (once).
  [[nodiscard]] absl::StatusOr<ExitStatus> Reap(absl::Time deadline);
  // pidfd_send_signal: no risk of signalling a recycled pid.
  [[nodiscard]] absl::Status Signal(int sig) const;
  // Children only: SIGKILL, then Reap. What O does before any rollback, so
  // that a hung N can never touch RocksDB afterwards.
  [[nodiscard]] absl::StatusOr<ExitStatus> KillAndReap(absl::Time deadline);

 private:
  Process(pid_t pid, base::UniqueFd pidfd, bool is_child)
      : pid_(pid), pidfd_(std::move(pidfd)), is_child_(is_child) {}
  pid_t pid_ = 0;
  base::UniqueFd pidfd_;
  bool is_child_ = false;
  bool reaped_ = false;
};

struct SpawnRequest {
  // Absolute path to exec (ResolveStartBinary / CheckUpgradeBinary). Required.
  std::string binary;
  // The argv to pass, argv[0] included (usually the node's own argv). The
  // handoff argument is added by SpawnWithHandoff. Required (non-empty).
  std::vector<std::string> argv;
};

// Starts req.binary with BuildChildArgv(req.argv, {3, getpid()}) and the
// current environment, by posix_spawn: the child shares the caller's address
// space until its exec (no page table copied, no copy-on-write faults after,
// so a serving process's other threads do not stall), and the calling thread
// waits for the exec alone, with no deadline of its own (the caller bounds
// it: the upgrade's watchdog). In N, child_end is descriptor 3, every
// descriptor above it is closed, and the signal mask is empty (a server that
// blocks signals for a signal thread must not hand that mask to N). An exec
// failure is the errno of execve (e.g. NotFound "exec /x: No such file or
// directory"). The caller's child_end is closed before returning, so that
// N's death reads as EOF.
[[nodiscard]] absl::StatusOr<Process> SpawnWithHandoff(const SpawnRequest& req,
                                                       base::UniqueFd child_end);

}  // namespace kvnode::upgrade

#endif  // KVNODE_UPGRADE_PROCESS_H_
