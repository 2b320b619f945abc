#include "kvnode/server/control_session.h"

#include "absl/strings/str_cat.h"

namespace kvnode::server {

const char* SessionStateName(SessionState s) {
  switch (s) {
    case SessionState::kAwaitHello:
      return "await_hello";
    case SessionState::kAwaitWelcome:
      return "await_welcome";
    case SessionState::kAwaitClientQp:
      return "await_client_qp";
    case SessionState::kConnecting:
      return "connecting";
    case SessionState::kReady:
      return "ready";
    case SessionState::kClosed:
      return "closed";
  }
  return "?";
}

bool TokensEqual(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  }
  return diff == 0;
}

void ControlSession::Queue(const proto::ControlMessage& m) {
  // Our own messages are built from validated values; an encoding failure is
  // a bug, but never a crash: the frame is simply not sent.
  (void)proto::EncodeControl(m, &out_);
}

void ControlSession::CloseWithError(proto::ErrorCode code, ErrorKind kind, std::string why,
                                    std::vector<Event>* events) {
  if (state_ == SessionState::kClosed) return;
  std::string msg = why.substr(0, proto::kMaxMessageTextSize);
  Queue(proto::Error{code, msg});
  state_ = SessionState::kClosed;
  events->push_back(ClosedEvent{kind, std::move(why)});
}

void ControlSession::OnBytes(std::span<const uint8_t> bytes, std::vector<Event>* events) {
  if (state_ == SessionState::kClosed) return;
  assembler_.Append(bytes);
  while (state_ != SessionState::kClosed) {
    absl::StatusOr<std::optional<proto::ControlMessage>> next = assembler_.Next();
    if (!next.ok()) {
      const absl::Status& s = next.status();
      if (s.code() == absl::StatusCode::kFailedPrecondition) {
        CloseWithError(proto::ErrorCode::kUnsupportedVersion, ErrorKind::kUnsupportedVersion,
                       std::string(s.message()), events);
      } else {
        CloseWithError(proto::ErrorCode::kMalformed, ErrorKind::kMalformedFrame,
                       std::string(s.message()), events);
      }
      return;
    }
    if (!next->has_value()) return;
    Handle(std::move(**next), events);
  }
}

void ControlSession::Handle(proto::ControlMessage m, std::vector<Event>* events) {
  const proto::MessageType type = proto::TypeOf(m);
  auto unexpected = [&] {
    CloseWithError(proto::ErrorCode::kUnexpectedMessage, ErrorKind::kUnexpectedMessage,
                   absl::StrCat("unexpected ", proto::MessageTypeName(static_cast<uint16_t>(type)),
                                " in state ", SessionStateName(state_)),
                   events);
  };
  // Messages valid in any state after Hello.
  if (state_ != SessionState::kAwaitHello) {
    if (auto* k = std::get_if<proto::Keepalive>(&m)) {
      Queue(proto::KeepaliveAck{k->nonce});
      return;
    }
    if (std::holds_alternative<proto::KeepaliveAck>(m)) return;
  }
  if (auto* g = std::get_if<proto::Goodbye>(&m)) {
    state_ = SessionState::kClosed;
    events->push_back(ClosedEvent{std::nullopt,
                                  absl::StrCat("client said goodbye (reason ",
                                               static_cast<uint32_t>(g->reason), "): ", g->message),
                                  g->reason == proto::GoodbyeReason::kClientDone});
    return;
  }
  if (auto* e = std::get_if<proto::Error>(&m)) {
    state_ = SessionState::kClosed;
    events->push_back(ClosedEvent{
        ErrorKind::kPeerVanished,
        absl::StrCat("client sent Error ", static_cast<uint32_t>(e->code), ": ", e->message)});
    return;
  }
  switch (state_) {
    case SessionState::kAwaitHello: {
      auto* h = std::get_if<proto::Hello>(&m);
      if (h == nullptr) return unexpected();
      if (h->protocol_version != proto::kProtocolVersion) {
        return CloseWithError(
            proto::ErrorCode::kUnsupportedVersion, ErrorKind::kUnsupportedVersion,
            absl::StrCat("protocol version ", h->protocol_version, " not supported (server speaks ",
                         proto::kProtocolVersion, ")"),
            events);
      }
      if (!config_.auth_token.empty() && !TokensEqual(h->auth_token, config_.auth_token)) {
        return CloseWithError(proto::ErrorCode::kAuthFailed, ErrorKind::kAuthFailed,
                              "authentication failed", events);
      }
      requested_client_id_ = h->client_id;
      client_name_ = h->client_name;
      hello_features_ = h->features;
      state_ = SessionState::kAwaitWelcome;
      events->push_back(HelloEvent{std::move(*h)});
      return;
    }
    case SessionState::kAwaitClientQp: {
      auto* q = std::get_if<proto::ClientQp>(&m);
      if (q == nullptr) return unexpected();
      state_ = SessionState::kConnecting;
      events->push_back(ClientQpEvent{q->qp});
      return;
    }
    case SessionState::kReady: {
      if (auto* a = std::get_if<proto::MoveAck>(&m)) {
        events->push_back(MoveAckEvent{a->new_generation});
        return;
      }
      if (auto* r = std::get_if<proto::MapRequest>(&m); r != nullptr && shard_map_feature()) {
        events->push_back(MapRequestEvent{r->known_epoch});
        return;
      }
      if (auto* g = std::get_if<proto::GuardAck>(&m); g != nullptr && slot_words_feature()) {
        events->push_back(GuardAckEvent{g->nonce});
        return;
      }
      return unexpected();
    }
    case SessionState::kAwaitWelcome:
    case SessionState::kConnecting:
      // The client must wait for our answer.
      return unexpected();
    case SessionState::kClosed:
      return;
  }
}

absl::Status ControlSession::SendWelcome(const proto::Welcome& w) {
  if (state_ != SessionState::kAwaitWelcome) {
    return absl::FailedPreconditionError(
        absl::StrCat("SendWelcome in state ", SessionStateName(state_)));
  }
  if (absl::Status s = proto::EncodeControl(w, &out_); !s.ok()) {
    Fail(proto::ErrorCode::kInternal, "server could not encode Welcome");
    return s;
  }
  features_ = w.features;
  state_ = SessionState::kAwaitClientQp;
  return absl::OkStatus();
}

absl::Status ControlSession::SendReady() {
  if (state_ != SessionState::kConnecting) {
    return absl::FailedPreconditionError(
        absl::StrCat("SendReady in state ", SessionStateName(state_)));
  }
  Queue(proto::Ready{});
  state_ = SessionState::kReady;
  return absl::OkStatus();
}

void ControlSession::Fail(proto::ErrorCode code, std::string_view message) {
  if (state_ == SessionState::kClosed) return;
  Queue(proto::Error{code, std::string(message.substr(0, proto::kMaxMessageTextSize))});
  state_ = SessionState::kClosed;
}

void ControlSession::Goodbye(proto::GoodbyeReason reason, std::string_view message) {
  if (state_ == SessionState::kClosed) return;
  Queue(proto::Goodbye{reason, std::string(message.substr(0, proto::kMaxMessageTextSize))});
  state_ = SessionState::kClosed;
}

absl::Status ControlSession::SendKeepalive(uint64_t nonce) {
  if (state_ != SessionState::kReady) {
    return absl::FailedPreconditionError("Keepalive outside kReady");
  }
  return proto::EncodeControl(proto::Keepalive{nonce}, &out_);
}

absl::Status ControlSession::SendMove(const proto::Move& m) {
  if (state_ != SessionState::kReady) {
    return absl::FailedPreconditionError("Move outside kReady");
  }
  return proto::EncodeControl(m, &out_);
}

absl::Status ControlSession::SendShardMap(const proto::ShardMap& map) {
  if (state_ != SessionState::kReady || !shard_map_feature()) {
    return absl::FailedPreconditionError(
        "ShardMap outside kReady or to a session without kFeatureShardMap");
  }
  return proto::EncodeControl(proto::ShardMapMsg{map}, &out_);
}

absl::Status ControlSession::SendGuard(const proto::Guard& g) {
  if (state_ != SessionState::kReady || !slot_words_feature()) {
    return absl::FailedPreconditionError(
        "Guard outside kReady or to a session without kFeatureSlotWords");
  }
  return proto::EncodeControl(g, &out_);
}

}  // namespace kvnode::server
