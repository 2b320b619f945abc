#include "kvnode/upgrade/channel.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <thread>

#include "kvnode/upgrade/process.h"
#include "test_util.h"

namespace kvnode::upgrade {
namespace {

absl::Time Soon() { return absl::Now() + absl::Seconds(10); }

// The exit code of a forked child: everything it checks is folded into it,
// since gtest assertions in a forked child report nowhere.
int WaitChild(pid_t pid) {
  int st = 0;
  if (waitpid(pid, &st, 0) != pid) return -1;
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

// A TCP listener on 127.0.0.1, ephemeral port.
int Listener(uint16_t* port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || listen(fd, 4) != 0) return -1;
  socklen_t len = sizeof(a);
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  *port = ntohs(a.sin_port);
  return fd;
}

// The whole O <-> N conversation across fork, with the listener passed by
// SCM_RIGHTS and used by the child: a connection the parent opens to the
// port is accepted by the child through the passed descriptor.
TEST(HandoffChannel, ConversationAcrossForkPassesTheListener) {
  absl::StatusOr<HandoffChannel::Pair> pair = HandoffChannel::CreatePair();
  ASSERT_TRUE(pair.ok()) << pair.status();
  uint16_t port = 0;
  base::UniqueFd listener(Listener(&port));
  ASSERT_TRUE(listener.valid());
  int pipefd[2];
  ASSERT_EQ(pipe2(pipefd, O_CLOEXEC), 0);
  base::UniqueFd pipe_r(pipefd[0]), pipe_w(pipefd[1]);
  const pid_t parent = getpid();

  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    pair->parent.Close();
    absl::StatusOr<HandoffChannel> ch = HandoffChannel::Adopt(pair->child_end.Release(), parent);
    if (!ch.ok()) _exit(10);
    if (!ch->Send(Hello{kHandoffProtocolVersion, static_cast<uint32_t>(getpid()), 2, 3, "n"},
                  Soon())
             .ok()) {
      _exit(11);
    }
    absl::StatusOr<ReceivedMessage> r = ch->Receive(Soon());
    if (!r.ok()) _exit(12);
    const auto* h = std::get_if<HandOver>(&r->message);
    if (h == nullptr || r->fds.size() != 2) _exit(13);
    if (!(h->sessions == testing::SampleSessions(3, 16))) _exit(14);
    if (r->sender.pid != parent) _exit(15);
    int acc = 0;
    socklen_t len = sizeof(acc);
    if (getsockopt(r->fds[0].get(), SOL_SOCKET, SO_ACCEPTCONN, &acc, &len) != 0 || acc != 1) {
      _exit(16);
    }
    if ((fcntl(r->fds[0].get(), F_GETFD) & FD_CLOEXEC) == 0) _exit(17);  // MSG_CMSG_CLOEXEC
    if (write(r->fds[1].get(), "p", 1) != 1) _exit(18);
    if (!ch->Send(Owned{h->generation, static_cast<uint32_t>(getpid())}, Soon()).ok()) _exit(19);
    const int conn = accept(r->fds[0].get(), nullptr, nullptr);
    if (conn < 0 || write(conn, "N", 1) != 1) _exit(20);
    absl::StatusOr<ReceivedMessage> g = ch->Receive(Soon());
    if (!g.ok() || !std::holds_alternative<Gone>(g->message)) _exit(21);
    _exit(0);
  }

  pair->child_end.Reset();
  HandoffChannel& ch = pair->parent;
  ch.SetPeerPid(child);
  absl::StatusOr<ReceivedMessage> hello = ch.Receive(Soon());
  ASSERT_TRUE(hello.ok()) << hello.status();
  ASSERT_TRUE(std::holds_alternative<Hello>(hello->message));
  EXPECT_EQ(std::get<Hello>(hello->message).pid, static_cast<uint32_t>(child));
  EXPECT_EQ(hello->sender.pid, child);
  EXPECT_EQ(hello->sender.uid, geteuid());

  const int fds[] = {listener.get(), pipe_w.get()};
  ASSERT_TRUE(ch.Send(HandOver{2,
                               {FdRole::kListenTcp, FdRole::kAdminSocket},
                               testing::SampleSessions(3, 16),
                               testing::SampleCounters()},
                      fds, Soon())
                  .ok());
  absl::StatusOr<ReceivedMessage> owned = ch.Receive(Soon());
  ASSERT_TRUE(owned.ok()) << owned.status();
  EXPECT_TRUE(std::holds_alternative<Owned>(owned->message));
  char c = 0;
  ASSERT_EQ(read(pipe_r.get(), &c, 1), 1);
  EXPECT_EQ(c, 'p');

  // Close our listener copy: only the child's copy can accept now.
  listener.Reset();
  base::UniqueFd conn(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(port);
  ASSERT_EQ(connect(conn.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  ASSERT_EQ(read(conn.get(), &c, 1), 1);
  EXPECT_EQ(c, 'N');
  ASSERT_TRUE(ch.Send(Gone{3, 0, {}}, Soon()).ok());
  EXPECT_EQ(WaitChild(child), 0);
}

// Raw frame bytes, written without any checks (for the refusal tests).
std::string RawHello(pid_t pid) {
  std::string f;
  EXPECT_TRUE(
      EncodeHandoff(Hello{kHandoffProtocolVersion, static_cast<uint32_t>(pid), 2, 0, "x"}, &f)
          .ok());
  return f;
}

// A child that drops to nobody before it speaks is refused by O, although
// SO_PEERCRED on the socketpair would have said "root" (it names the pair's
// creator): the per-message SCM_CREDENTIALS check catches it.
TEST(HandoffChannel, OldSideRefusesAChildThatChangedUser) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to setuid(65534)";
  absl::StatusOr<HandoffChannel::Pair> pair = HandoffChannel::CreatePair();
  ASSERT_TRUE(pair.ok()) << pair.status();
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    pair->parent.Close();
    if (setgid(65534) != 0 || setuid(65534) != 0) _exit(10);
    const std::string f = RawHello(getpid());
    _exit(write(pair->child_end.get(), f.data(), f.size()) == static_cast<ssize_t>(f.size()) ? 0
                                                                                             : 11);
  }
  pair->child_end.Reset();
  // SO_PEERCRED is useless on a socketpair: it reports ourselves.
  absl::StatusOr<PeerCredentials> pc = GetPeerCredentials(pair->parent.fd());
  ASSERT_TRUE(pc.ok());
  EXPECT_EQ(pc->pid, getpid());

  pair->parent.SetPeerPid(child);
  absl::StatusOr<ReceivedMessage> r = pair->parent.Receive(Soon());
  EXPECT_TRUE(absl::IsPermissionDenied(r.status())) << r.status();
  EXPECT_NE(r.status().message().find("uid 65534"), std::string_view::npos) << r.status();
  EXPECT_TRUE(pair->parent.broken()) << "a refused peer must not get a second chance";
  EXPECT_EQ(WaitChild(child), 0);
}

// Same user, wrong process: a grandchild the fd leaked to is refused.
TEST(HandoffChannel, OldSideRefusesAnotherProcess) {
  absl::StatusOr<HandoffChannel::Pair> pair = HandoffChannel::CreatePair();
  ASSERT_TRUE(pair.ok()) << pair.status();
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    pair->parent.Close();
    const pid_t grandchild = fork();
    if (grandchild == 0) {
      const std::string f = RawHello(getpid());
      _exit(write(pair->child_end.get(), f.data(), f.size()) > 0 ? 0 : 1);
    }
    _exit(WaitChild(grandchild));
  }
  pair->child_end.Reset();
  pair->parent.SetPeerPid(child);
  absl::StatusOr<ReceivedMessage> r = pair->parent.Receive(Soon());
  EXPECT_TRUE(absl::IsPermissionDenied(r.status())) << r.status();
  EXPECT_EQ(WaitChild(child), 0);
}

// N's side: Adopt checks SO_PEERCRED (the creator of the pair must be the
// pid N was told, with N's uid) and that the fd is a Unix stream socket.
TEST(HandoffChannel, NewSideAdoptChecks) {
  // Wrong expected pid.
  absl::StatusOr<HandoffChannel::Pair> pair = HandoffChannel::CreatePair();
  ASSERT_TRUE(pair.ok());
  absl::StatusOr<HandoffChannel> ch =
      HandoffChannel::Adopt(pair->child_end.Release(), getpid() + 1);
  EXPECT_TRUE(absl::IsPermissionDenied(ch.status())) << ch.status();
  // Not a socket.
  int p[2];
  ASSERT_EQ(pipe2(p, O_CLOEXEC), 0);
  close(p[1]);
  ch = HandoffChannel::Adopt(p[0], getpid());
  EXPECT_TRUE(absl::IsInvalidArgument(ch.status())) << ch.status();
  // A datagram socket.
  int d[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0, d), 0);
  close(d[1]);
  ch = HandoffChannel::Adopt(d[0], getpid());
  EXPECT_TRUE(absl::IsInvalidArgument(ch.status())) << ch.status();
  // The right pid: accepted, CLOEXEC set.
  pair = HandoffChannel::CreatePair();
  ASSERT_TRUE(pair.ok());
  ASSERT_EQ(fcntl(pair->child_end.get(), F_SETFD, 0), 0);  // as inherited across exec
  ch = HandoffChannel::Adopt(pair->child_end.Release(), getpid());
  ASSERT_TRUE(ch.ok()) << ch.status();
  EXPECT_NE(fcntl(ch->fd(), F_GETFD) & FD_CLOEXEC, 0);
}

// N that runs as another user refuses O (SO_PEERCRED uid mismatch).
TEST(HandoffChannel, NewSideRefusesOldOfAnotherUser) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to setuid(65534)";
  absl::StatusOr<HandoffChannel::Pair> pair = HandoffChannel::CreatePair();
  ASSERT_TRUE(pair.ok());
  const pid_t parent = getpid();
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    if (setgid(65534) != 0 || setuid(65534) != 0) _exit(10);
    absl::StatusOr<HandoffChannel> ch = HandoffChannel::Adopt(pair->child_end.Release(), parent);
    _exit(absl::IsPermissionDenied(ch.status()) ? 0 : 11);
  }
  EXPECT_EQ(WaitChild(child), 0);
}

// The SO_PEERCRED primitive on a connected socket (the "path in a 0700
// directory" variant): a client that setuid()s to nobody before connecting is
// refused.
TEST(HandoffChannel, PeerCredRefusesNobodyOnConnect) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to setuid(65534)";
  char dir[] = "/tmp/kvupgrade-peercred-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  ASSERT_EQ(chmod(dir, 0755), 0);  // so that nobody can reach the socket at all
  const std::string path = std::string(dir) + "/s";
  base::UniqueFd srv(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::snprintf(a.sun_path, sizeof(a.sun_path), "%s", path.c_str());
  ASSERT_EQ(bind(srv.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  ASSERT_EQ(chmod(path.c_str(), 0777), 0);
  ASSERT_EQ(listen(srv.get(), 2), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    if (setgid(65534) != 0 || setuid(65534) != 0) _exit(10);
    const int c = socket(AF_UNIX, SOCK_STREAM, 0);
    _exit(connect(c, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 ? 0 : 11);
  }
  base::UniqueFd conn(accept4(srv.get(), nullptr, nullptr, SOCK_CLOEXEC));
  ASSERT_TRUE(conn.valid());
  absl::StatusOr<PeerCredentials> pc = GetPeerCredentials(conn.get());
  ASSERT_TRUE(pc.ok()) << pc.status();
  EXPECT_EQ(pc->uid, 65534u);
  absl::Status s = CheckCredentials(*pc, child, "SO_PEERCRED");
  EXPECT_TRUE(absl::IsPermissionDenied(s)) << s;
  EXPECT_EQ(WaitChild(child), 0);
  unlink(path.c_str());
  rmdir(dir);
}

TEST(HandoffChannel, DeadlinesAndClosedPeers) {
  absl::StatusOr<HandoffChannel::Pair> pair = HandoffChannel::CreatePair();
  ASSERT_TRUE(pair.ok());
  HandoffChannel& ch = pair->parent;
  // Nobody set: refuse rather than trust.
  EXPECT_TRUE(absl::IsFailedPrecondition(ch.Receive(Soon()).status()));
  ch.SetPeerPid(getpid());
  // Silence: the deadline, not a hang.
  absl::StatusOr<ReceivedMessage> r = ch.Receive(absl::Now() + absl::Milliseconds(50));
  EXPECT_TRUE(absl::IsDeadlineExceeded(r.status())) << r.status();
  EXPECT_TRUE(ch.broken());

  // Peer dies mid-frame.
  pair = HandoffChannel::CreatePair();
  ASSERT_TRUE(pair.ok());
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    const std::string f = RawHello(getpid());
    _exit(write(pair->child_end.get(), f.data(), f.size() / 2) > 0 ? 0 : 1);
  }
  pair->child_end.Reset();
  pair->parent.SetPeerPid(child);
  r = pair->parent.Receive(Soon());
  EXPECT_TRUE(absl::IsUnavailable(r.status())) << r.status();
  EXPECT_NE(r.status().message().find("mid-frame"), std::string_view::npos) << r.status();
  EXPECT_EQ(WaitChild(child), 0);

  // Peer closes between frames.
  pair = HandoffChannel::CreatePair();
  ASSERT_TRUE(pair.ok());
  pair->child_end.Reset();
  pair->parent.SetPeerPid(getpid());
  r = pair->parent.Receive(Soon());
  EXPECT_TRUE(absl::IsUnavailable(r.status())) << r.status();

  // A send that cannot complete (nobody reads, buffer full) stops at its deadline.
  pair = HandoffChannel::CreatePair();
  ASSERT_TRUE(pair.ok());
  HandOver big{2, {}, testing::SampleSessions(100, 1024), {}};
  absl::Status s = pair->parent.Send(big, absl::Now() + absl::Milliseconds(50));
  EXPECT_TRUE(absl::IsDeadlineExceeded(s)) << s;
}

// Descriptors where none belong are refused; all received ones are closed.
TEST(HandoffChannel, FdsOnlyWithHandOver) {
  absl::StatusOr<HandoffChannel::Pair> pair = HandoffChannel::CreatePair();
  ASSERT_TRUE(pair.ok());
  absl::StatusOr<HandoffChannel> n = HandoffChannel::Adopt(pair->child_end.Release(), getpid());
  ASSERT_TRUE(n.ok());
  pair->parent.SetPeerPid(getpid());
  const int fds[] = {0};
  ASSERT_TRUE(n->Send(Owned{1, 1}, fds, Soon()).ok());
  absl::StatusOr<ReceivedMessage> r = pair->parent.Receive(Soon());
  EXPECT_TRUE(absl::IsInvalidArgument(r.status())) << r.status();
}

// A HandOver bigger than the socket buffer arrives whole (chunked reads, the
// fds on the first chunk), sent from another thread.
TEST(HandoffChannel, LargeHandOverWithFds) {
  absl::StatusOr<HandoffChannel::Pair> pair = HandoffChannel::CreatePair();
  ASSERT_TRUE(pair.ok());
  absl::StatusOr<HandoffChannel> n = HandoffChannel::Adopt(pair->child_end.Release(), getpid());
  ASSERT_TRUE(n.ok());
  pair->parent.SetPeerPid(getpid());
  const HandOver big{
      9, {FdRole::kAdminSocket}, testing::SampleSessions(60, 1024), testing::SampleCounters()};
  absl::Status sent;
  std::thread sender([&] {
    const int fds[] = {1};
    sent = pair->parent.Send(big, fds, Soon());
  });
  absl::StatusOr<ReceivedMessage> r = n->Receive(Soon());
  sender.join();
  ASSERT_TRUE(sent.ok()) << sent;
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(std::get<HandOver>(r->message) == big);
  ASSERT_EQ(r->fds.size(), 1u);
  EXPECT_GT(r->fds[0].get(), 2);
}

// A session table larger than one frame may carry (4096 ids with full
// 1024-entry windows, ~76 MB) crosses a real channel as O sends it -- Sessions
// messages of up to 64 MiB, then HandOver -- and N's loop puts it together.
TEST(HandoffChannel, SessionTableOverThePayloadLimitCrossesInSessionsMessages) {
  absl::StatusOr<HandoffChannel::Pair> pair = HandoffChannel::CreatePair();
  ASSERT_TRUE(pair.ok());
  absl::StatusOr<HandoffChannel> n = HandoffChannel::Adopt(pair->child_end.Release(), getpid());
  ASSERT_TRUE(n.ok());
  pair->parent.SetPeerPid(getpid());
  const SessionTable table = testing::SampleSessions(4096, 1024);
  absl::StatusOr<std::vector<Sessions>> chunks = SplitSessions(table.sessions);
  ASSERT_TRUE(chunks.ok()) << chunks.status();
  ASSERT_GE(chunks->size(), 2u);
  HandOver ho{9,
              {FdRole::kAdminSocket},
              SessionTable{table.next_client_id, {}},
              testing::SampleCounters(),
              static_cast<uint32_t>(chunks->size())};
  // ~76 MB through a socket pair: seconds, and many more in a sanitizer build
  // on a busy host. The deadline only bounds a hang.
  const absl::Time deadline = absl::Now() + absl::Minutes(2);
  absl::Status sent;
  std::thread sender([&] {
    for (const Sessions& c : *chunks) {
      sent = pair->parent.Send(c, deadline);
      if (!sent.ok()) return;
    }
    const int fds[] = {1};
    sent = pair->parent.Send(ho, fds, deadline);
  });
  // new_side.cc's loop.
  size_t messages = 0;
  std::vector<SessionRecord> received;
  absl::StatusOr<ReceivedMessage> r = n->Receive(deadline);
  while (r.ok() && std::holds_alternative<Sessions>(r->message)) {
    ++messages;
    for (SessionRecord& rec : std::get<Sessions>(r->message).sessions) {
      received.push_back(std::move(rec));
    }
    r = n->Receive(deadline);
  }
  sender.join();
  ASSERT_TRUE(sent.ok()) << sent;
  ASSERT_TRUE(r.ok()) << r.status();
  const HandOver* got = std::get_if<HandOver>(&r->message);
  ASSERT_NE(got, nullptr);
  EXPECT_EQ(messages, chunks->size());
  EXPECT_EQ(got->session_chunks, chunks->size());
  EXPECT_TRUE(received == table.sessions);
}

}  // namespace
}  // namespace kvnode::upgrade
