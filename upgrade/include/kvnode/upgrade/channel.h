// The handoff channel: a Unix stream socket between the old process O and the
// new process N, carrying framed handoff messages (messages.h) and, with
// HandOver, file descriptors (SCM_RIGHTS).
//
// How it is made: O calls HandoffChannel::CreatePair() (socketpair, both ends
// CLOEXEC), spawns N so that N inherits exactly the child end (process.h
// clears CLOEXEC on that one fd in the child only and passes its number with
// --upgrade_handoff=FD:PID), closes its copy of the child end and calls
// SetPeerPid(N's pid). N calls HandoffChannel::Adopt(fd, O's pid).
//
// Who is on the other end (checked before anything received is trusted):
//   1. N, at Adopt: SO_PEERCRED. On a socketpair it names the process that
//      created the pair, which must be O (the pid given) with N's own uid.
//   2. O cannot learn anything from SO_PEERCRED on a socketpair (both ends
//      report O itself), so both ends have SO_PASSCRED set from creation and
//      EVERY chunk either side receives must carry kernel-filled
//      SCM_CREDENTIALS naming the expected peer pid and this process's uid.
//      A child that setuid()s to another user, or any other process the fd
//      leaked to, is refused (PermissionDenied) and the channel is closed.
//      (A privileged sender can forge SCM_CREDENTIALS; so can it do anything
//      else to a process of the same user. The check is against accidents and
//      unprivileged interlopers.)
//
// Every Send/Receive takes a deadline; nothing blocks past it. After any error
// the byte stream may be mid-frame, so the channel is closed (broken()) and
// all later calls fail: the caller aborts the upgrade.
//
// Thread safety: one thread uses a channel (the upgrade thread of its side).
#ifndef KVNODE_UPGRADE_CHANNEL_H_
#define KVNODE_UPGRADE_CHANNEL_H_

#include <sys/types.h>

#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kvnode/base/unique_fd.h"
#include "kvnode/upgrade/messages.h"

namespace kvnode::upgrade {

struct PeerCredentials {
  pid_t pid = 0;
  uid_t uid = 0;
  gid_t gid = 0;
};

// SO_PEERCRED of a connected Unix socket.
[[nodiscard]] absl::StatusOr<PeerCredentials> GetPeerCredentials(int fd);

// PermissionDenied unless `c` names this process's effective uid and, when
// expected_pid != 0, that pid. `what` prefixes the message ("SO_PEERCRED").
[[nodiscard]] absl::Status CheckCredentials(const PeerCredentials& c, pid_t expected_pid,
                                            std::string_view what);

struct ReceivedMessage {
  HandoffMessage message;
  // Descriptors that came with the frame, CLOEXEC, in SCM_RIGHTS order. For a
  // HandOver their number equals fd_roles.size(); other messages carry none.
  std::vector<base::UniqueFd> fds;
  PeerCredentials sender;  // from SCM_CREDENTIALS
};

class HandoffChannel {
 public:
  struct Pair;

  // O side: a connected socketpair with SO_PASSCRED on both ends. Returns the
  // channel (O's end) and N's end; both CLOEXEC.
  [[nodiscard]] static absl::StatusOr<Pair> CreatePair();

  // N side: takes ownership of the inherited `fd` (closed on failure too).
  // Checks that it is a connected AF_UNIX stream socket whose SO_PEERCRED is
  // `expected_peer_pid` with our uid, then sets CLOEXEC (N's own children
  // must not inherit it) and SO_PASSCRED.
  [[nodiscard]] static absl::StatusOr<HandoffChannel> Adopt(int fd, pid_t expected_peer_pid);

  HandoffChannel(HandoffChannel&&) = default;
  HandoffChannel& operator=(HandoffChannel&&) = default;

  // O side, once N's pid is known: only that pid may send to us. Receive
  // refuses everything before this is set.
  void SetPeerPid(pid_t pid) { peer_pid_ = pid; }
  pid_t peer_pid() const { return peer_pid_; }

  // Sends one frame; `fds` (<= kMaxHandoffFds) travel with its first byte.
  // The descriptors stay owned by the caller (the peer receives duplicates).
  [[nodiscard]] absl::Status Send(const HandoffMessage& m, std::span<const int> fds,
                                  absl::Time deadline);
  [[nodiscard]] absl::Status Send(const HandoffMessage& m, absl::Time deadline) {
    return Send(m, {}, deadline);
  }

  // Receives one whole frame and decodes it. Errors:
  //   DeadlineExceeded  deadline passed (the peer may be hung)
  //   Unavailable       peer closed the socket (e.g. it died), mid-frame or not
  //   PermissionDenied  data from a process other than the expected peer
  //   decode errors of messages.h; InvalidArgument for fds where none belong
  [[nodiscard]] absl::StatusOr<ReceivedMessage> Receive(absl::Time deadline);

  // For poll() loops (readable = a frame is starting, or EOF).
  int fd() const { return fd_.get(); }
  bool broken() const { return !fd_.valid(); }
  // Closes the socket; the peer sees EOF.
  void Close() { fd_.Reset(); }

 private:
  explicit HandoffChannel(base::UniqueFd fd) : fd_(std::move(fd)) {}
  absl::Status Fail(absl::Status s);
  // recvmsg() into `buf`, collecting fds and checking credentials.
  absl::Status ReadChunked(std::span<uint8_t> buf, std::vector<base::UniqueFd>* fds,
                           PeerCredentials* sender, absl::Time deadline, bool* got_any);

  base::UniqueFd fd_;
  pid_t peer_pid_ = 0;
};

struct HandoffChannel::Pair {
  HandoffChannel parent;     // O's end
  base::UniqueFd child_end;  // N's end: give it to SpawnWithHandoff (process.h)
};

}  // namespace kvnode::upgrade

#endif  // KVNODE_UPGRADE_CHANNEL_H_
