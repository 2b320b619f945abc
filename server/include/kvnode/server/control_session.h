// The server side of one control connection, as a pure state machine: bytes
// in, frames out, events for the owner. No sockets, no verbs, no clocks, so
// that every bad input can be unit-tested by feeding bytes.
//
//   kAwaitHello --Hello ok--> kAwaitWelcome --SendWelcome--> kAwaitClientQp
//     --ClientQp--> kConnecting --SendReady--> kReady --(Goodbye/Error/
//     protocol error/owner Close)--> kClosed
//
// Rules (docs/protocol.md 1.3):
//  1. Anything undecodable ends the session with Error{kMalformed} (or
//     kUnsupportedVersion for another protocol version); a valid message at
//     the wrong moment with Error{kUnexpectedMessage}; a wrong auth token with
//     Error{kAuthFailed}. The frame is queued in out() and the state becomes
//     kClosed: the owner flushes out() (best effort) and closes the socket.
//  2. Keepalive is answered with KeepaliveAck (in any state after Hello);
//     KeepaliveAck is accepted silently; both count as liveness to the owner
//     (every OnBytes does).
//  3. Once kClosed, further input is ignored.
//  4. MapRequest is valid only in kReady of a session whose Welcome carried
//     kFeatureShardMap (anywhere else it is an unexpected message); the node
//     sends ShardMap frames only to such a session.
//
// Thread safety: none; owned by the control thread.
#ifndef KVNODE_SERVER_CONTROL_SESSION_H_
#define KVNODE_SERVER_CONTROL_SESSION_H_

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "kvnode/proto/control.h"
#include "kvnode/server/metrics.h"

namespace kvnode::server {

enum class SessionState {
  kAwaitHello,
  kAwaitWelcome,   // Hello accepted; the owner is creating the QP
  kAwaitClientQp,  // Welcome sent
  kConnecting,     // ClientQp received; the owner is connecting the QP
  kReady,          // RPCs flow
  kClosed,
};
const char* SessionStateName(SessionState s);

struct ControlConfig {
  // Token the client must present; empty = no authentication.
  std::string auth_token;
};

class ControlSession {
 public:
  // Events for the owner, in the order they happened.
  struct HelloEvent {
    proto::Hello hello;  // version and token already checked
  };
  struct ClientQpEvent {
    proto::QpInfo qp;
  };
  struct MoveAckEvent {
    uint64_t new_generation = 0;
  };
  struct MapRequestEvent {
    uint64_t known_epoch = 0;
  };
  struct GuardAckEvent {
    uint64_t nonce = 0;
  };
  struct ClosedEvent {
    // Why the session ended; error is set when it was an error (counted by
    // the owner), nullopt for an orderly Goodbye from the client.
    std::optional<ErrorKind> error;
    std::string why;  // for the log
    // Goodbye{client done}: the client never resumes its id, so its dedupe
    // record may go with the session.
    bool client_done = false;
  };
  using Event = std::variant<HelloEvent, ClientQpEvent, MoveAckEvent, MapRequestEvent,
                             GuardAckEvent, ClosedEvent>;

  explicit ControlSession(ControlConfig config) : config_(std::move(config)) {}

  // Feeds received bytes; appends events to `events`.
  void OnBytes(std::span<const uint8_t> bytes, std::vector<Event>* events);
  void OnBytes(std::string_view bytes, std::vector<Event>* events) {
    OnBytes(proto::AsBytes(bytes), events);
  }

  // --- the owner's answers --------------------------------------------------
  // kAwaitWelcome -> kAwaitClientQp. Encoding errors close the session
  // (Error{kInternal}) and are returned.
  absl::Status SendWelcome(const proto::Welcome& w);
  // kConnecting -> kReady.
  absl::Status SendReady();
  // Any state: queue Error{code, message}, -> kClosed.
  void Fail(proto::ErrorCode code, std::string_view message);
  // Any state: queue Goodbye{reason, message}, -> kClosed.
  void Goodbye(proto::GoodbyeReason reason, std::string_view message);
  // kReady: queue frames (no state change).
  absl::Status SendKeepalive(uint64_t nonce);
  absl::Status SendMove(const proto::Move& m);
  // kReady and shard_map_feature(): queue a ShardMap frame.
  absl::Status SendShardMap(const proto::ShardMap& map);
  // kReady and slot_words_feature(): queue a Guard frame.
  absl::Status SendGuard(const proto::Guard& g);

  SessionState state() const { return state_; }
  bool closed() const { return state_ == SessionState::kClosed; }
  // Frames waiting to be sent; the owner writes and erases from the front.
  std::string& out() { return out_; }
  // The id the client asked for in Hello (0 = new), once Hello was accepted.
  uint64_t requested_client_id() const { return requested_client_id_; }
  const std::string& client_name() const { return client_name_; }
  // Hello.features, once Hello was accepted.
  uint64_t hello_features() const { return hello_features_; }
  // The Welcome sent carried kFeatureShardMap (it is the AND of both sides).
  bool shard_map_feature() const { return (features_ & proto::kFeatureShardMap) != 0; }
  // The Welcome sent carried kFeatureSlotWords: the client checks the words.
  bool slot_words_feature() const { return (features_ & proto::kFeatureSlotWords) != 0; }

 private:
  void Handle(proto::ControlMessage m, std::vector<Event>* events);
  void CloseWithError(proto::ErrorCode code, ErrorKind kind, std::string why,
                      std::vector<Event>* events);
  void Queue(const proto::ControlMessage& m);

  ControlConfig config_;
  SessionState state_ = SessionState::kAwaitHello;
  proto::FrameAssembler assembler_;
  std::string out_;
  uint64_t requested_client_id_ = 0;
  std::string client_name_;
  uint64_t hello_features_ = 0;
  uint64_t features_ = 0;  // Welcome.features as sent
};

// Constant-time comparison of two tokens (length leaks, content does not).
bool TokensEqual(std::string_view a, std::string_view b);

}  // namespace kvnode::server

#endif  // KVNODE_SERVER_CONTROL_SESSION_H_
