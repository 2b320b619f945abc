#include "kvnode/server/control_session.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace kvnode::server {
namespace {

using Events = std::vector<ControlSession::Event>;

std::string Frame(const proto::ControlMessage& m, uint16_t version = proto::kProtocolVersion) {
  std::string out;
  EXPECT_TRUE(proto::EncodeControl(m, &out, version).ok());
  return out;
}

// All frames the session queued, decoded; out() is consumed.
std::vector<proto::ControlMessage> Sent(ControlSession& s) {
  std::vector<proto::ControlMessage> out;
  proto::FrameAssembler a;
  a.Append(s.out());
  s.out().clear();
  for (;;) {
    auto m = a.Next();
    EXPECT_TRUE(m.ok()) << m.status();
    if (!m.ok() || !m->has_value()) break;
    out.push_back(std::move(**m));
  }
  return out;
}

proto::Hello GoodHello(uint64_t id = 0) {
  proto::Hello h;
  h.client_id = id;
  h.auth_token = "token";
  h.client_name = "test";
  return h;
}

proto::Welcome SomeWelcome() {
  proto::Welcome w;
  w.client_id = 7;
  w.server_qp.qpn = 1;
  w.server_qp.mtu = 3;
  w.max_rpc_credits = 8;
  return w;
}

proto::ErrorCode ErrorSent(ControlSession& s) {
  auto sent = Sent(s);
  EXPECT_EQ(sent.size(), 1u);
  if (sent.empty()) return proto::ErrorCode::kInternal;
  auto* e = std::get_if<proto::Error>(&sent.back());
  EXPECT_NE(e, nullptr);
  return e == nullptr ? proto::ErrorCode::kInternal : e->code;
}

TEST(ControlSession, FullHandshakeFedOneByteAtATime) {
  ControlSession s(ControlConfig{"token"});
  Events ev;
  const std::string hello = Frame(GoodHello(99));
  for (char c : hello) s.OnBytes(std::string_view(&c, 1), &ev);
  ASSERT_EQ(ev.size(), 1u);
  auto* h = std::get_if<ControlSession::HelloEvent>(&ev[0]);
  ASSERT_NE(h, nullptr);
  EXPECT_EQ(h->hello.client_id, 99u);
  EXPECT_EQ(s.requested_client_id(), 99u);
  EXPECT_EQ(s.state(), SessionState::kAwaitWelcome);
  EXPECT_TRUE(s.out().empty());

  ASSERT_TRUE(s.SendWelcome(SomeWelcome()).ok());
  auto sent = Sent(s);
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_TRUE(std::holds_alternative<proto::Welcome>(sent[0]));
  EXPECT_EQ(s.state(), SessionState::kAwaitClientQp);

  ev.clear();
  proto::ClientQp cq;
  cq.qp.qpn = 55;
  cq.qp.mtu = 3;
  s.OnBytes(Frame(cq), &ev);
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(std::get<ControlSession::ClientQpEvent>(ev[0]).qp.qpn, 55u);
  EXPECT_EQ(s.state(), SessionState::kConnecting);
  ASSERT_TRUE(s.SendReady().ok());
  EXPECT_TRUE(std::holds_alternative<proto::Ready>(Sent(s).at(0)));
  EXPECT_EQ(s.state(), SessionState::kReady);

  // Keepalive answered, KeepaliveAck absorbed, MoveAck reported.
  ev.clear();
  s.OnBytes(Frame(proto::Keepalive{5}) + Frame(proto::KeepaliveAck{1}) + Frame(proto::MoveAck{2}),
            &ev);
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(std::get<ControlSession::MoveAckEvent>(ev[0]).new_generation, 2u);
  sent = Sent(s);
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(std::get<proto::KeepaliveAck>(sent[0]).nonce, 5u);

  // Goodbye from the client: closed, no error; a client close may resume its
  // id later, so its record stays.
  ev.clear();
  s.OnBytes(Frame(proto::Goodbye{proto::GoodbyeReason::kClientClose, "bye"}), &ev);
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_FALSE(std::get<ControlSession::ClosedEvent>(ev[0]).error.has_value());
  EXPECT_FALSE(std::get<ControlSession::ClosedEvent>(ev[0]).client_done);
  EXPECT_TRUE(s.closed());
  // Input after close is ignored.
  ev.clear();
  s.OnBytes(Frame(proto::Keepalive{6}), &ev);
  EXPECT_TRUE(ev.empty());
  EXPECT_TRUE(s.out().empty());
}

// Goodbye{client done} (a kvclient Close): the client never resumes its id,
// so the event says its dedupe record may go; in any state after Hello.
TEST(ControlSession, ClientDoneGoodbyeLetsTheRecordGo) {
  ControlSession s(ControlConfig{"token"});
  Events ev;
  s.OnBytes(Frame(GoodHello()), &ev);
  ASSERT_TRUE(s.SendWelcome(SomeWelcome()).ok());
  ev.clear();
  s.OnBytes(Frame(proto::Goodbye{proto::GoodbyeReason::kClientDone, "client closes"}), &ev);
  ASSERT_EQ(ev.size(), 1u);
  const auto& closed = std::get<ControlSession::ClosedEvent>(ev[0]);
  EXPECT_FALSE(closed.error.has_value());
  EXPECT_TRUE(closed.client_done);
  EXPECT_TRUE(s.closed());
}

TEST(ControlSession, WrongTokenIsAuthFailed) {
  ControlSession s(ControlConfig{"token"});
  Events ev;
  proto::Hello h = GoodHello();
  h.auth_token = "tokem";
  s.OnBytes(Frame(h), &ev);
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(std::get<ControlSession::ClosedEvent>(ev[0]).error, ErrorKind::kAuthFailed);
  EXPECT_EQ(ErrorSent(s), proto::ErrorCode::kAuthFailed);
  EXPECT_TRUE(s.closed());
}

TEST(ControlSession, NoTokenConfiguredAcceptsAny) {
  ControlSession s(ControlConfig{""});
  Events ev;
  s.OnBytes(Frame(GoodHello()), &ev);
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_TRUE(std::holds_alternative<ControlSession::HelloEvent>(ev[0]));
}

TEST(ControlSession, OtherVersionIsUnsupportedVersion) {
  ControlSession s(ControlConfig{"token"});
  Events ev;
  proto::Hello h = GoodHello();
  h.protocol_version = 9;
  s.OnBytes(Frame(h, 9), &ev);
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(std::get<ControlSession::ClosedEvent>(ev[0]).error, ErrorKind::kUnsupportedVersion);
  EXPECT_EQ(ErrorSent(s), proto::ErrorCode::kUnsupportedVersion);
}

TEST(ControlSession, GarbageIsMalformed) {
  ControlSession s(ControlConfig{"token"});
  Events ev;
  s.OnBytes(std::string_view("GET / HTTP/1.0\r\n\r\n"), &ev);
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(std::get<ControlSession::ClosedEvent>(ev[0]).error, ErrorKind::kMalformedFrame);
  EXPECT_EQ(ErrorSent(s), proto::ErrorCode::kMalformed);
}

TEST(ControlSession, OversizeLengthIsRejectedFromTheHeaderAlone) {
  ControlSession s(ControlConfig{"token"});
  Events ev;
  std::string f = Frame(proto::Keepalive{1});
  f[10] = 0x10;  // payload_size 1 MiB
  s.OnBytes(std::string_view(f).substr(0, proto::kFrameHeaderSize), &ev);
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(std::get<ControlSession::ClosedEvent>(ev[0]).error, ErrorKind::kMalformedFrame);
}

TEST(ControlSession, TruncatedPayloadIsMalformed) {
  ControlSession s(ControlConfig{"token"});
  Events ev;
  std::string f = Frame(GoodHello());
  f[8] = 3;  // payload_size 3: shorter than any Hello
  f[9] = 0;
  f.resize(proto::kFrameHeaderSize + 3);
  s.OnBytes(f, &ev);
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(std::get<ControlSession::ClosedEvent>(ev[0]).error, ErrorKind::kMalformedFrame);
}

TEST(ControlSession, PartialFrameWaitsForMore) {
  ControlSession s(ControlConfig{"token"});
  Events ev;
  const std::string f = Frame(GoodHello());
  s.OnBytes(std::string_view(f).substr(0, f.size() - 1), &ev);
  EXPECT_TRUE(ev.empty());
  EXPECT_EQ(s.state(), SessionState::kAwaitHello);
}

TEST(ControlSession, MessagesAtTheWrongMoment) {
  {
    ControlSession s(ControlConfig{"token"});
    Events ev;
    s.OnBytes(Frame(proto::ClientQp{proto::QpInfo{1, 1, {}, 0, 3, 1}}), &ev);  // before Hello
    ASSERT_EQ(ev.size(), 1u);
    EXPECT_EQ(std::get<ControlSession::ClosedEvent>(ev[0]).error, ErrorKind::kUnexpectedMessage);
    EXPECT_EQ(ErrorSent(s), proto::ErrorCode::kUnexpectedMessage);
  }
  {
    ControlSession s(ControlConfig{"token"});
    Events ev;
    // A client that does not wait for Welcome.
    s.OnBytes(Frame(GoodHello()) + Frame(proto::ClientQp{proto::QpInfo{1, 1, {}, 0, 3, 1}}), &ev);
    ASSERT_EQ(ev.size(), 2u);
    EXPECT_EQ(std::get<ControlSession::ClosedEvent>(ev[1]).error, ErrorKind::kUnexpectedMessage);
  }
  {
    ControlSession s(ControlConfig{"token"});
    Events ev;
    s.OnBytes(Frame(proto::Keepalive{1}), &ev);  // keepalive before Hello
    ASSERT_EQ(ev.size(), 1u);
    EXPECT_EQ(std::get<ControlSession::ClosedEvent>(ev[0]).error, ErrorKind::kUnexpectedMessage);
  }
  {
    // A server-only message from the client.
    ControlSession s(ControlConfig{"token"});
    Events ev;
    s.OnBytes(Frame(SomeWelcome()), &ev);
    ASSERT_EQ(ev.size(), 1u);
    EXPECT_EQ(std::get<ControlSession::ClosedEvent>(ev[0]).error, ErrorKind::kUnexpectedMessage);
  }
}

TEST(ControlSession, OwnerCannotSkipStates) {
  ControlSession s(ControlConfig{"token"});
  EXPECT_FALSE(s.SendReady().ok());
  EXPECT_FALSE(s.SendWelcome(SomeWelcome()).ok());
  EXPECT_FALSE(s.SendKeepalive(1).ok());
  EXPECT_FALSE(s.SendMove(proto::Move{}).ok());
  EXPECT_TRUE(s.out().empty());
}

TEST(ControlSession, FailAndGoodbyeCloseOnce) {
  ControlSession s(ControlConfig{"token"});
  Events ev;
  s.OnBytes(Frame(GoodHello()), &ev);
  s.Fail(proto::ErrorCode::kTooManyClients, "full");
  s.Goodbye(proto::GoodbyeReason::kShutdown, "late");  // ignored: closed already
  EXPECT_EQ(ErrorSent(s), proto::ErrorCode::kTooManyClients);
  EXPECT_TRUE(s.closed());
}

TEST(TokensEqual, ComparesContentAndLength) {
  EXPECT_TRUE(TokensEqual("abc", "abc"));
  EXPECT_FALSE(TokensEqual("abc", "abd"));
  EXPECT_FALSE(TokensEqual("abc", "abcd"));
  EXPECT_TRUE(TokensEqual("", ""));
}

// Drives a session to kReady with `welcome_features` in its Welcome.
void ToReady(ControlSession& s, uint64_t hello_features, uint64_t welcome_features) {
  Events ev;
  proto::Hello h = GoodHello();
  h.features = hello_features;
  s.OnBytes(Frame(h), &ev);
  EXPECT_EQ(s.hello_features(), hello_features);
  proto::Welcome w = SomeWelcome();
  w.features = welcome_features;
  ASSERT_TRUE(s.SendWelcome(w).ok());
  proto::ClientQp cq;
  cq.qp.qpn = 5;
  cq.qp.mtu = 3;
  s.OnBytes(Frame(cq), &ev);
  ASSERT_TRUE(s.SendReady().ok());
  Sent(s);
}

TEST(ControlSession, ShardMapFeature) {
  ControlSession s(ControlConfig{"token"});
  ToReady(s, proto::kFeatureShardMap, proto::kFeatureShardMap);
  EXPECT_TRUE(s.shard_map_feature());
  Events ev;
  s.OnBytes(Frame(proto::MapRequest{4}), &ev);
  ASSERT_EQ(ev.size(), 1u);
  auto* r = std::get_if<ControlSession::MapRequestEvent>(&ev[0]);
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->known_epoch, 4u);
  absl::StatusOr<proto::ShardMap> map = proto::EvenSplit("c1", 16, {"a"});
  ASSERT_TRUE(map.ok());
  ASSERT_TRUE(s.SendShardMap(*map).ok());
  auto sent = Sent(s);
  ASSERT_EQ(sent.size(), 1u);
  auto* m = std::get_if<proto::ShardMapMsg>(&sent[0]);
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->map, *map);
}

// Without the feature in the Welcome (a node outside a cluster, or a Hello
// that did not ask) MapRequest is an unexpected message and no map is sent.
TEST(ControlSession, MapRequestWithoutTheFeatureIsUnexpected) {
  ControlSession s(ControlConfig{"token"});
  ToReady(s, proto::kFeatureShardMap, 0);
  EXPECT_FALSE(s.shard_map_feature());
  absl::StatusOr<proto::ShardMap> map = proto::EvenSplit("c1", 16, {"a"});
  ASSERT_TRUE(map.ok());
  EXPECT_FALSE(s.SendShardMap(*map).ok());
  Events ev;
  s.OnBytes(Frame(proto::MapRequest{0}), &ev);
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_TRUE(std::holds_alternative<ControlSession::ClosedEvent>(ev[0]));
  EXPECT_EQ(ErrorSent(s), proto::ErrorCode::kUnexpectedMessage);
}

}  // namespace
}  // namespace kvnode::server
