#include "kvnode/upgrade/channel.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "kvnode/base/errno.h"
#include "kvnode/base/poll.h"
#include "kvnode/proto/wire.h"

namespace kvnode::upgrade {
namespace {

using proto::wire::Av;

absl::Status ErrnoStatus(int err, std::string_view what) {
  return base::ErrnoStatus(err, absl::StrCat("handoff channel: ", Av(what)));
}

// Waits until `fd` is ready for `events` or the deadline passes.
absl::Status WaitFor(int fd, short events, absl::Time deadline, std::string_view what) {
  absl::StatusOr<short> r = base::PollUntil(fd, events, deadline);
  if (!r.ok()) {
    return absl::Status(r.status().code(), absl::StrCat("handoff channel: while ", Av(what), ": ",
                                                        r.status().message()));
  }
  if (*r == 0) {
    return absl::DeadlineExceededError(
        absl::StrCat("handoff channel: deadline passed while ", Av(what)));
  }
  return absl::OkStatus();  // ready, or HUP/ERR: the I/O call tells
}

absl::Status SetPassCred(int fd) {
  const int one = 1;
  if (setsockopt(fd, SOL_SOCKET, SO_PASSCRED, &one, sizeof(one)) != 0) {
    return ErrnoStatus(errno, "setsockopt(SO_PASSCRED)");
  }
  return absl::OkStatus();
}

// Room for our credentials plus the most descriptors a frame may carry. A
// peer that sends more gets MSG_CTRUNC and is refused.
constexpr size_t kCmsgSpace = CMSG_SPACE(sizeof(ucred)) + CMSG_SPACE(sizeof(int) * kMaxHandoffFds);

}  // namespace

absl::StatusOr<PeerCredentials> GetPeerCredentials(int fd) {
  ucred c{};
  socklen_t len = sizeof(c);
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &c, &len) != 0) {
    return ErrnoStatus(errno, absl::StrCat("getsockopt(fd ", fd, ", SO_PEERCRED)"));
  }
  if (len != sizeof(c)) return absl::InternalError("handoff channel: short SO_PEERCRED");
  return PeerCredentials{c.pid, c.uid, c.gid};
}

absl::Status CheckCredentials(const PeerCredentials& c, pid_t expected_pid, std::string_view what) {
  const uid_t me = geteuid();
  if (c.uid != me || (expected_pid != 0 && c.pid != expected_pid)) {
    return absl::PermissionDeniedError(absl::StrCat(
        "handoff channel: ", Av(what), " says pid ", c.pid, " uid ", c.uid, ", expected pid ",
        expected_pid == 0 ? std::string("any") : std::to_string(expected_pid), " uid ", me,
        ": peer refused"));
  }
  return absl::OkStatus();
}

absl::StatusOr<HandoffChannel::Pair> HandoffChannel::CreatePair() {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
    return ErrnoStatus(errno, "socketpair");
  }
  base::UniqueFd a(sv[0]), b(sv[1]);
  // Both ends before anything is written: the kernel attaches credentials
  // only to data sent while the receiving socket has SO_PASSCRED.
  if (absl::Status s = SetPassCred(a.get()); !s.ok()) return s;
  if (absl::Status s = SetPassCred(b.get()); !s.ok()) return s;
  return Pair{HandoffChannel(std::move(a)), std::move(b)};
}

absl::StatusOr<HandoffChannel> HandoffChannel::Adopt(int raw_fd, pid_t expected_peer_pid) {
  base::UniqueFd fd(raw_fd);
  if (raw_fd < 0) return absl::InvalidArgumentError("handoff channel: negative fd");
  if (expected_peer_pid <= 0) {
    return absl::InvalidArgumentError("handoff channel: Adopt needs the old process's pid");
  }
  int domain = 0, type = 0;
  socklen_t len = sizeof(domain);
  if (getsockopt(raw_fd, SOL_SOCKET, SO_DOMAIN, &domain, &len) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("handoff channel: fd ", raw_fd, " is not a socket: ", base::ErrnoText(errno)));
  }
  len = sizeof(type);
  if (getsockopt(raw_fd, SOL_SOCKET, SO_TYPE, &type, &len) != 0) {
    return ErrnoStatus(errno, "getsockopt(SO_TYPE)");
  }
  if (domain != AF_UNIX || type != SOCK_STREAM) {
    return absl::InvalidArgumentError(absl::StrCat("handoff channel: fd ", raw_fd,
                                                   " is not a Unix stream socket (domain ", domain,
                                                   ", type ", type, ")"));
  }
  absl::StatusOr<PeerCredentials> c = GetPeerCredentials(raw_fd);
  if (!c.ok()) return c.status();
  if (absl::Status s = CheckCredentials(*c, expected_peer_pid, "SO_PEERCRED"); !s.ok()) return s;
  if (fcntl(raw_fd, F_SETFD, FD_CLOEXEC) != 0) return ErrnoStatus(errno, "fcntl(FD_CLOEXEC)");
  if (absl::Status s = SetPassCred(raw_fd); !s.ok()) return s;
  HandoffChannel ch(std::move(fd));
  ch.SetPeerPid(expected_peer_pid);
  return ch;
}

absl::Status HandoffChannel::Fail(absl::Status s) {
  fd_.Reset();
  return s;
}

absl::Status HandoffChannel::Send(const HandoffMessage& m, std::span<const int> fds,
                                  absl::Time deadline) {
  if (broken()) return absl::FailedPreconditionError("handoff channel: closed");
  if (fds.size() > kMaxHandoffFds) {
    return absl::InvalidArgumentError(
        absl::StrCat("handoff channel: ", fds.size(), " fds, limit ", kMaxHandoffFds));
  }
  std::string frame;
  if (absl::Status s = EncodeHandoff(m, &frame); !s.ok()) return s;  // nothing sent: not broken
  const std::string what =
      absl::StrCat("sending ", HandoffTypeName(static_cast<uint16_t>(TypeOf(m))));

  size_t done = 0;
  bool fds_sent = fds.empty();
  alignas(cmsghdr) std::array<char, CMSG_SPACE(sizeof(int) * kMaxHandoffFds)> control{};
  while (done < frame.size()) {
    iovec iov{frame.data() + done, frame.size() - done};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    if (!fds_sent) {
      msg.msg_control = control.data();
      msg.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
      cmsghdr* c = CMSG_FIRSTHDR(&msg);
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
      std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
    }
    const ssize_t n = sendmsg(fd_.get(), &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      done += static_cast<size_t>(n);
      fds_sent = true;  // ancillary data goes with the first byte sent
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (absl::Status s = WaitFor(fd_.get(), POLLOUT, deadline, what); !s.ok()) return Fail(s);
      continue;
    }
    return Fail(ErrnoStatus(n < 0 ? errno : EPIPE, what));
  }
  return absl::OkStatus();
}

absl::Status HandoffChannel::ReadChunked(std::span<uint8_t> buf, std::vector<base::UniqueFd>* fds,
                                         PeerCredentials* sender, absl::Time deadline,
                                         bool* got_any) {
  size_t done = 0;
  while (done < buf.size()) {
    alignas(cmsghdr) std::array<char, kCmsgSpace> control{};
    iovec iov{buf.data() + done, buf.size() - done};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.data();
    msg.msg_controllen = control.size();
    const ssize_t n = recvmsg(fd_.get(), &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        if (absl::Status s = WaitFor(fd_.get(), POLLIN, deadline, "receiving"); !s.ok()) return s;
        continue;
      }
      return ErrnoStatus(errno, "recvmsg");
    }
    // Take ownership of every descriptor first, so that each is closed on
    // any error path below.
    bool creds_seen = false;
    PeerCredentials creds;
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level != SOL_SOCKET) continue;
      if (c->cmsg_type == SCM_RIGHTS) {
        const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < count; ++i) {
          int received;
          std::memcpy(&received, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
          fds->emplace_back(received);
        }
      } else if (c->cmsg_type == SCM_CREDENTIALS && c->cmsg_len == CMSG_LEN(sizeof(ucred))) {
        ucred u;
        std::memcpy(&u, CMSG_DATA(c), sizeof(u));
        creds = {u.pid, u.uid, u.gid};
        creds_seen = true;
      }
    }
    if (n == 0) {
      return absl::UnavailableError(
          done == 0 && !*got_any
              ? absl::StrCat("handoff channel: peer pid ", peer_pid_, " closed the channel")
              : absl::StrCat("handoff channel: peer pid ", peer_pid_,
                             " closed the channel mid-frame"));
    }
    if (msg.msg_flags & MSG_CTRUNC) {
      return absl::PermissionDeniedError(
          absl::StrCat("handoff channel: control data truncated (more than ", kMaxHandoffFds,
                       " fds?): refused"));
    }
    if (!creds_seen) {
      return absl::PermissionDeniedError(
          "handoff channel: data without SCM_CREDENTIALS (SO_PASSCRED off?): refused");
    }
    if (absl::Status s = CheckCredentials(creds, peer_pid_, "SCM_CREDENTIALS"); !s.ok()) return s;
    *sender = creds;
    if (fds->size() > kMaxHandoffFds) {
      return absl::InvalidArgumentError(absl::StrCat("handoff channel: ", fds->size(),
                                                     " fds in one frame, limit ", kMaxHandoffFds));
    }
    done += static_cast<size_t>(n);
    *got_any = true;
  }
  return absl::OkStatus();
}

absl::StatusOr<ReceivedMessage> HandoffChannel::Receive(absl::Time deadline) {
  if (broken()) return absl::FailedPreconditionError("handoff channel: closed");
  if (peer_pid_ <= 0) {
    // Without an expected pid every sender would pass; refuse rather than trust.
    return absl::FailedPreconditionError("handoff channel: peer pid not set (SetPeerPid)");
  }
  std::vector<base::UniqueFd> fds;
  PeerCredentials sender;
  bool got_any = false;
  std::array<uint8_t, kHandoffFrameHeaderSize> head;
  if (absl::Status s = ReadChunked(head, &fds, &sender, deadline, &got_any); !s.ok()) {
    return Fail(s);
  }
  absl::StatusOr<HandoffFrameHeader> h = DecodeHandoffFrameHeader(head);
  if (!h.ok()) return Fail(h.status());
  // Grow the buffer as bytes arrive instead of trusting payload_size for one
  // big allocation up front.
  constexpr size_t kStep = size_t{1} << 20;
  std::string payload;
  while (payload.size() < h->payload_size) {
    const size_t old = payload.size();
    payload.resize(std::min<size_t>(h->payload_size, old + kStep));
    std::span<uint8_t> chunk(reinterpret_cast<uint8_t*>(payload.data()) + old,
                             payload.size() - old);
    if (absl::Status s = ReadChunked(chunk, &fds, &sender, deadline, &got_any); !s.ok()) {
      return Fail(absl::Status(s.code(),
                               absl::StrCat(s.message(), " (in ", HandoffTypeName(h->type), ")")));
    }
  }
  absl::StatusOr<HandoffMessage> m = DecodeHandoffPayload(*h, AsBytes(payload));
  if (!m.ok()) return Fail(m.status());
  const size_t want =
      std::holds_alternative<HandOver>(*m) ? std::get<HandOver>(*m).fd_roles.size() : 0;
  if (fds.size() != want) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("handoff channel: ", HandoffTypeName(h->type), " came with ", fds.size(),
                     " fds, expected ", want)));
  }
  return ReceivedMessage{std::move(*m), std::move(fds), sender};
}

}  // namespace kvnode::upgrade
