// A miniature new process N for the upgrade tests, started by the tests
// through SpawnWithHandoff (posix_spawn). It plays N's side of the handoff
// conversation over the inherited channel and honours --upgrade_fault for the
// n_* phases:
//
//   Adopt(--upgrade_handoff=FD:PID) -> Hello -> [n_attach] [n_register]
//   [n_ready] -> Ready -> receive HandOver (one listen fd) -> [n_open_db]
//   [n_accepting] -> Owned -> accept one connection on the passed listener,
//   write "N" -> receive Gone -> exit 0.
//
// Hello.build_id reports what the process inherited: "fds=0,1,2,5 sigblk=0"
// (open descriptors and the blocked-signal mask from /proc/self/status).
// A failure is printed on stderr and exits 1 (after sending Abort if it can).
#include <dirent.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kvnode/upgrade/channel.h"
#include "kvnode/upgrade/fault.h"
#include "kvnode/upgrade/process.h"

using namespace kvnode::upgrade;  // NOLINT: test helper

namespace {

std::string Inherited() {
  std::vector<int> fds;
  DIR* d = opendir("/proc/self/fd");
  if (d == nullptr) return "fds=?";
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    const int fd = atoi(e->d_name);
    if (fd != dirfd(d)) fds.push_back(fd);
  }
  closedir(d);
  std::string sigblk = "?";
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("SigBlk:", 0) == 0) {
      const size_t p = line.find_first_not_of(" \t", 7);
      sigblk = line.substr(p);
      while (sigblk.size() > 1 && sigblk[0] == '0') sigblk.erase(0, 1);
    }
  }
  return absl::StrCat("fds=", absl::StrJoin(fds, ","), " sigblk=", sigblk);
}

int Die(HandoffChannel* ch, const absl::Status& s, uint32_t code) {
  fprintf(stderr, "handoff_peer: %s\n", std::string(s.ToString()).c_str());
  if (ch != nullptr && !ch->broken()) {
    (void)ch->Send(Abort{code, std::string(s.message())}, absl::Now() + absl::Seconds(5));
  }
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::string handoff, fault;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--upgrade_handoff=", 0) == 0) handoff = a.substr(18);
    if (a.rfind("--upgrade_fault=", 0) == 0) fault = a.substr(16);
  }
  const std::string inherited = Inherited();
  absl::StatusOr<FaultPlan> plan = FaultPlan::Parse(fault);
  if (!plan.ok()) return Die(nullptr, plan.status(), 3);
  SetFaultPlan(*plan);
  absl::StatusOr<HandoffArg> arg = ParseHandoffArg(handoff);
  if (!arg.ok()) return Die(nullptr, arg.status(), 3);
  absl::StatusOr<HandoffChannel> adopted = HandoffChannel::Adopt(arg->fd, arg->o_pid);
  if (!adopted.ok()) return Die(nullptr, adopted.status(), 4);
  HandoffChannel& ch = *adopted;
  auto deadline = [] { return absl::Now() + absl::Seconds(10); };

  if (absl::Status s =
          ch.Send(Hello{kHandoffProtocolVersion, static_cast<uint32_t>(getpid()), 2, 0, inherited},
                  deadline());
      !s.ok()) {
    return Die(&ch, s, 3);
  }
  for (Phase p : {Phase::kNAttach, Phase::kNRegister, Phase::kNReady}) {
    if (absl::Status s = MaybeInjectFault(p); !s.ok()) return Die(&ch, s, 5);
  }
  if (absl::Status s = ch.Send(Ready{0x1234, 0, 42, 4096, 0}, deadline()); !s.ok()) {
    return Die(&ch, s, 3);
  }
  absl::StatusOr<ReceivedMessage> r = ch.Receive(deadline());
  if (!r.ok()) return Die(&ch, r.status(), 3);
  const HandOver* h = std::get_if<HandOver>(&r->message);
  if (h == nullptr || r->fds.size() != 1 || h->fd_roles[0] != FdRole::kListenTcp) {
    return Die(&ch, absl::InvalidArgumentError("expected HandOver with one listen fd"), 3);
  }
  for (Phase p : {Phase::kNOpenDb, Phase::kNAccepting}) {
    if (absl::Status s = MaybeInjectFault(p); !s.ok()) return Die(&ch, s, 5);
  }
  if (absl::Status s = ch.Send(Owned{h->generation, static_cast<uint32_t>(getpid())}, deadline());
      !s.ok()) {
    return Die(&ch, s, 3);
  }
  const int conn = accept4(r->fds[0].get(), nullptr, nullptr, SOCK_CLOEXEC);
  if (conn < 0 || write(conn, "N", 1) != 1) {
    return Die(&ch, absl::InternalError("accept/write on the passed listener"), 3);
  }
  close(conn);
  absl::StatusOr<ReceivedMessage> gone = ch.Receive(deadline());
  if (!gone.ok() || !std::holds_alternative<Gone>(gone->message)) {
    return Die(&ch, gone.ok() ? absl::InvalidArgumentError("expected Gone") : gone.status(), 3);
  }
  return 0;
}
