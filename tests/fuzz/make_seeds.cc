// Writes the seed corpora under tests/fuzz/corpus/<target>/ from valid
// encodings made by the libraries' own encoders (and a few edge cases next to
// them). Deterministic: running it again rewrites the same files.
//
//   build-fuzz/tests/fuzz/fuzz_make_seeds tests/fuzz/corpus
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <string>
#include <vector>

#include "kvnode/load/ack_log.h"
#include "kvnode/proto/control.h"
#include "kvnode/proto/rpc.h"
#include "kvnode/server/dedupe.h"
#include "kvnode/storage/read_path.h"
#include "kvnode/upgrade/header.h"
#include "kvnode/upgrade/messages.h"
#include "read_path_input.h"

namespace kvnode::fuzz {
namespace {

std::filesystem::path g_root;
int g_files = 0;

void Die(const std::string& what, const absl::Status& s) {
  std::fprintf(stderr, "make_seeds: %s: %s\n", what.c_str(), s.ToString().c_str());
  std::exit(1);
}
template <typename T>
T Ok(absl::StatusOr<T> v, const std::string& what) {
  if (!v.ok()) Die(what, v.status());
  return *std::move(v);
}
void Ok(const absl::Status& s, const std::string& what) {
  if (!s.ok()) Die(what, s);
}

void StoreLe(std::string& s, uint64_t v) { storage::StoreU64(s.data(), v); }

void Write(const std::string& target, const std::string& name, std::string_view bytes) {
  const std::filesystem::path dir = g_root / target;
  std::filesystem::create_directories(dir);
  std::ofstream out(dir / name, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) {
    std::fprintf(stderr, "make_seeds: cannot write %s\n", (dir / name).c_str());
    std::exit(1);
  }
  ++g_files;
}

std::string Flag(uint8_t flags, std::string_view rest) {
  return std::string(1, static_cast<char>(flags)) + std::string(rest);
}

// ---- control ----
void Control() {
  using namespace proto;
  QpInfo qp{.qpn = 0x11, .psn = 0x123456, .gid = {}, .lid = 0, .mtu = 3, .port = 1};
  qp.gid[10] = 0xff;
  qp.gid[11] = 0xff;
  qp.gid[12] = 127;
  qp.gid[15] = 1;
  storage::Geometry g = ReadPathGeometry(3, 4, 42);
  const std::vector<std::pair<std::string, ControlMessage>> msgs = {
      {"hello",
       Hello{.client_id = 0, .features = 0, .auth_token = "secret", .client_name = "kvload/0.1"}},
      {"hello_resume",
       Hello{.client_id = 7,
             .resume_secret = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16},
             .features = 1,
             .auth_token = "",
             .client_name = ""}},
      {"welcome", Welcome{.client_id = 7,
                          .resume_secret = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16},
                          .server_generation = 3,
                          .features = 0,
                          .server_qp = qp,
                          .rkey = 0x1234,
                          .arena_remote_addr = 0,
                          .arena_size = g.arena_size,
                          .max_rpc_credits = 16,
                          .max_rpc_message_size = kMaxRpcMessageSize,
                          .max_key_size = 1024,
                          .max_value_size = 16384,
                          .index_geometry = g.Encode()}},
      {"client_qp", ClientQp{qp}},
      {"ready", Ready{}},
      {"keepalive", Keepalive{42}},
      {"keepalive_ack", KeepaliveAck{42}},
      {"move", Move{MoveReason::kUpgrade, "127.0.0.1:7000", 4, 5000}},
      {"move_v6", Move{MoveReason::kDrain, "[::1]:7001", 5, 0}},
      {"move_ack", MoveAck{4}},
      {"goodbye", Goodbye{GoodbyeReason::kMoveTimeout, "move not acknowledged"}},
      {"error", Error{ErrorCode::kAuthFailed, "bad token"}},
  };
  // control_fuzz.cc's input: eight u16 cut values, then the stream.
  auto cuts = [](std::initializer_list<uint16_t> values) {
    std::string p(16, '\0');
    size_t i = 0;
    for (uint16_t v : values) {
      p[2 * i] = static_cast<char>(v & 0xff);
      p[2 * i + 1] = static_cast<char>(v >> 8);
      ++i;
    }
    return p;
  };
  // Inside the header and right after it (the payload arrives on its own).
  const std::string in_header = cuts({5, 12, 5, 12, 5, 12, 5, 12});
  std::string stream;
  for (const auto& [name, m] : msgs) {
    std::string frame;
    Ok(EncodeControl(m, &frame), name);
    Write("control", name, in_header + frame);
    stream += frame;
  }
  // Whole frames per read; then cuts at every kind of place across frames.
  Write("control", "stream_all", cuts({}) + stream);
  Write("control", "stream_all_cut", cuts({1, 11, 12, 13, 0xffff, 7, 100, 0x7fff}) + stream);
  std::string e;
  Ok(EncodeControl(Error{ErrorCode::kUnsupportedVersion, "v9"}, &e, 9), "error_v9");
  Write("control", "error_v9", in_header + e);
  std::string h;
  Ok(EncodeControl(Hello{}, &h), "hello_empty");
  Write("control", "truncated_hello", in_header + h.substr(0, h.size() - 1));
  Write("control", "header_only", in_header + h.substr(0, kFrameHeaderSize));
}

// ---- rpc ----
void Rpc() {
  using namespace proto;
  const std::string big(300, 'v');
  const std::vector<std::pair<std::string, RequestView>> reqs = {
      {"req_get", {Opcode::kGet, 7, 1, "user:1", ""}},
      {"req_put", {Opcode::kPut, 7, 2, "user:1", "value-1"}},
      {"req_put_big", {Opcode::kPut, 7, 3, "k", big}},
      {"req_delete", {Opcode::kDelete, 7, 4, "user:1", ""}},
      {"req_ping", {Opcode::kPing, 7, 5, "", "echo"}},
  };
  for (const auto& [name, r] : reqs) {
    std::string out;
    Ok(EncodeRequest(r, &out), name);
    Write("rpc", name, out);
  }
  const std::vector<std::pair<std::string, ResponseView>> resps = {
      {"resp_get", {Opcode::kGet, RpcStatus::kOk, 1, 9, "value-1"}},
      {"resp_notfound", {Opcode::kGet, RpcStatus::kNotFound, 1, 0, ""}},
      {"resp_put", {Opcode::kPut, RpcStatus::kOk, 2, 10, ""}},
      {"resp_busy", {Opcode::kPut, RpcStatus::kBusy, 3, 0, "writes paused"}},
      {"resp_rejected", {Opcode::kDelete, RpcStatus::kRejected, 4, 0, "key too long"}},
      {"resp_ping", {Opcode::kPing, RpcStatus::kOk, 5, 0, "echo"}},
  };
  for (const auto& [name, r] : resps) {
    std::string out;
    Ok(EncodeResponse(r, &out), name);
    Write("rpc", name, out);
  }
  Write("rpc", "header_only", std::string(kRpcHeaderSize, '\0'));
}

// ---- handoff messages ----
void Handoff() {
  using namespace upgrade;
  SessionTable t;
  t.next_client_id = 9;
  // Entries as a server records them: (sequence, PUT 2 | DELETE 3, status
  // OK 0 | NOT_FOUND 1 | REJECTED 2, version).
  t.sessions.push_back({3, 17, {{15, 2, 0, 100}, {16, 3, 0, 101}, {17, 3, 1, 0}}});
  t.sessions.push_back({5, 2, {{2, 2, 0, 7}}});
  t.sessions.push_back({8, 0, {}});
  CounterSnapshot c;
  c.counters = {{"gets", 1000}, {"puts", 20}, {"rpc_rejected", 1}};
  const std::vector<std::pair<std::string, HandoffMessage>> msgs = {
      {"hello",
       Hello{kHandoffProtocolVersion, 4242, 5, kCapSessionTable | kCapCounters, "build-1"}},
      {"ready", Ready{0x55, 0, 77, 1 << 20, 0}},
      {"ready_imported", Ready{0x55, 0, 77, 1 << 20, 1}},
      {"handover", HandOver{5, {FdRole::kListenTcp, FdRole::kAdminSocket}, t, c}},
      {"handover_empty", HandOver{5, {}, SessionTable{}, CounterSnapshot{}}},
      {"handover_chunked", HandOver{5, {FdRole::kListenTcp}, SessionTable{}, c, 2}},
      {"handover_ids", HandOver{5, {FdRole::kListenTcp}, SessionTable{}, c, 1, 9, {3, 5, 8}}},
      {"sessions_chunk", Sessions{t.sessions}},
      {"adopted", Adopted{3}},
      {"owned", Owned{5, 4242}},
      {"gone", Gone{3, 1, c}},
      {"abort", Abort{static_cast<uint32_t>(AbortCode::kIncompatible), "arena_layout_version"}},
      {"abort_unknown_code", Abort{99, ""}},
  };
  for (const auto& [name, m] : msgs) {
    std::string frame;
    Ok(EncodeHandoff(m, &frame), name);
    Write("handoff", name, frame);
  }
  // Payloads that end inside a field while the frame header's size agrees:
  // a cut in two places at once, which 10 M executions did not make.
  auto cut = [](const HandoffMessage& m, size_t payload) {
    std::string frame;
    Ok(EncodeHandoff(m, &frame), "cut");
    frame.resize(kHandoffFrameHeaderSize + payload);
    storage::StoreU32(frame.data() + 8, static_cast<uint32_t>(payload));
    return frame;
  };
  // Ready without its last byte (mr_imported).
  Write("handoff", "ready_cut", cut(Ready{0x55, 0, 77, 1 << 20, 0}, 4 + 8 + 8 + 8));
  // HandOver announcing two fd roles, cut after the first.
  Write("handoff", "handover_cut_roles",
        cut(HandOver{5, {FdRole::kListenTcp, FdRole::kAdminSocket}, t, c}, 8 + 1 + 1));
  std::string s;
  Ok(EncodeSessionTable(t, &s), "sessions");
  Write("handoff", "sessions", s);
  s.clear();
  Ok(EncodeCounters(c, &s), "counters");
  Write("handoff", "counters", s);
}

// ---- handoff header ----
void HandoffHeaderSeeds() {
  using namespace upgrade;
  Compat c;
  c.arena_layout_version = 1;
  c.sizeof_arena_header = 256;
  c.sizeof_limbo_entry = 16;
  HandoffHeader h = HandoffHeader::For(c);
  h.o_pid = 4242;
  h.created_unix_ns = 1700000000000000000ULL;
  h.arena_size = 1 << 20;
  h.arena_id = 77;
  h.generation = 4;
  h.arena_shm_name = "kvnode";
  h.build_id = "build-1";
  std::string bytes = Ok(EncodeHandoffHeader(h), "header");
  Write("handoff_header", "valid", Flag(0, bytes));
  Write("handoff_header", "valid_fix", Flag(1, bytes));
  Write("handoff_header", "valid_expected", Flag(1 | 4 | 8, bytes));
  Compat other = c;
  Ok(ApplyTestIncompatibility("layout", &other), "layout");
  HandoffHeader h2 = HandoffHeader::For(other);
  h2.o_pid = 1;
  h2.created_unix_ns = 1;
  h2.arena_shm_name = std::string(kMaxShmNameSize, 'n');
  h2.build_id = std::string(kMaxBuildIdSize, 'b');
  bytes = Ok(EncodeHandoffHeader(h2), "header2");
  Write("handoff_header", "incompatible_long_names", Flag(0, bytes));
  Write("handoff_header", "short", Flag(1, std::string_view(bytes).substr(0, 100)));
}

// ---- geometry ----
void GeometrySeeds() {
  for (uint8_t size_sel : {0, 3, 7}) {
    for (uint8_t count : {0, 4, 10}) {
      const storage::Geometry g = ReadPathGeometry(size_sel, count, 0x1234 + count);
      const std::string name =
          "b" + std::to_string(g.bucket_size) + "_n" + std::to_string(g.bucket_count);
      Write("geometry", name, Flag(0, g.Encode()));
      Write("geometry", name + "_fix", Flag(1, g.Encode()));
    }
  }
  storage::Geometry big;
  big.arena_size = storage::kMaxArenaSize;
  big.index_offset = 4096;
  big.bucket_count = uint64_t{1} << 30;
  big.bucket_size = 512;
  Write("geometry", "max_arena", Flag(0, big.Encode()));
}

// ---- objects ----
std::string Object(const storage::Geometry& g, uint64_t owner, uint64_t version,
                   std::string_view key, std::string_view value, size_t align) {
  std::string out(storage::ObjectFootprint(key.size(), value.size(), align), '\0');
  storage::EncodeObject(g, owner, version, key, value, out.data(), out.size());
  return out;
}

void ObjectSeeds() {
  storage::Geometry g;
  g.hash_seed = 0x5eed;
  std::string seed(8, '\0');
  StoreLe(seed, g.hash_seed);
  const std::string big(4000, 'x');
  const std::string max_key(1024, 'K');
  int i = 0;
  for (auto [key, value] : std::vector<std::pair<std::string_view, std::string_view>>{
           {"k", ""}, {"user:1", "value-1"}, {"key", big}, {max_key, "v"}}) {
    const std::string obj = Object(g, 4096 + 16, 9 + i, key, value, 8);
    Write("object", "obj" + std::to_string(i), Flag(0, seed + obj));
    Write("object", "obj" + std::to_string(i) + "_fix", Flag(1, seed + obj));
    ++i;
  }
  const std::string obj = Object(g, 64, 1, "torn", "value", 8);
  Write("object", "truncated", Flag(0, seed + obj.substr(0, obj.size() - 9)));
}

// ---- read path ----
// Builds inputs for read_path_fuzz: the prefix, then the bytes of each READ.
struct ReadPathSeed {
  storage::Geometry g;
  std::string key;
  std::string prefix;
};

ReadPathSeed Prefix(uint8_t flags, uint8_t size_sel, uint8_t count, uint64_t seed,
                    std::string_view key) {
  ReadPathSeed s;
  s.g = ReadPathGeometry(size_sel, count, seed);
  s.key = std::string(key);
  s.prefix = std::string(1, static_cast<char>(flags)) + static_cast<char>(size_sel) +
             static_cast<char>(count);
  std::string sb(8, '\0');
  StoreLe(sb, seed);
  s.prefix += sb;
  s.prefix += static_cast<char>(key.size() - 1);
  s.prefix += key;
  return s;
}

std::string EmptyBucket(const storage::Geometry& g) { return std::string(g.bucket_size, '\0'); }
void PutWord(std::string& b, size_t at, uint64_t w) { storage::StoreU64(b.data() + at, w); }
size_t SlotAt(int i) { return (storage::kBucketHeaderWords + i) * 8; }

void ReadPathSeeds() {
  using namespace storage;
  int n = 0;
  auto emit = [&](const std::string& name, const ReadPathSeed& s,
                  const std::vector<std::string>& reads) {
    std::string all = s.prefix;
    for (const std::string& r : reads) all += r;
    Write("read_path", name, all);
    ++n;
  };
  for (uint8_t size_sel : {1, 3, 7}) {
    const ReadPathSeed s = Prefix(0, size_sel, 4, 0xabc + size_sel, "user:1");
    const Geometry& g = s.g;
    const KeyHash kh = HashKey(g, s.key);
    const uint64_t home = FirstRead(g, s.key).offset;
    const std::string sfx = "_b" + std::to_string(g.bucket_size);
    const uint64_t heap = kReadPathIndex + g.bucket_count * g.bucket_size;

    emit("empty" + sfx, s, {EmptyBucket(g)});

    // Inline object in the home bucket, in slot 1.
    {
      std::string b = EmptyBucket(g);
      const std::string obj = Object(g, home + SlotAt(1), 7, s.key, "v1", kInlineGranule);
      if (kSlotLineSize + obj.size() <= g.bucket_size) {
        b.replace(kSlotLineSize, obj.size(), obj);
        PutWord(b, SlotAt(1), Slot::Resident(kh.fingerprint, home + kSlotLineSize, obj.size()));
        emit("inline" + sfx, s, {b});
      }
    }
    // Heap object (second READ), after a fingerprint collision with another key.
    {
      std::string b = EmptyBucket(g);
      const std::string other = Object(g, home + SlotAt(0), 3, "other", "x", 8);
      const std::string obj = Object(g, home + SlotAt(2), 8, s.key, std::string(500, 'h'), 8);
      PutWord(b, SlotAt(0), Slot::Resident(kh.fingerprint, heap + 4096, other.size()));
      PutWord(b, SlotAt(2), Slot::Resident(kh.fingerprint, heap + 8192, obj.size()));
      std::string only = EmptyBucket(g);
      PutWord(only, SlotAt(2), Slot::Resident(kh.fingerprint, heap + 8192, obj.size()));
      emit("heap" + sfx, s, {only, obj});
      emit("collision" + sfx, s, {b, other, obj});
      std::string torn = obj;
      torn[40] ^= 1;
      emit("torn" + sfx, s, {b, torn});
    }
    // Marker, LOSSY, invalid slot.
    {
      std::string b = EmptyBucket(g);
      PutWord(b, SlotAt(3), Slot::Marker(kh.fingerprint));
      emit("marker" + sfx, s, {b});
      b = EmptyBucket(g);
      PutWord(b, 0, MakeLink(0, true));
      emit("lossy" + sfx, s, {b});
      b = EmptyBucket(g);
      PutWord(b, SlotAt(5), 3);
      emit("invalid_slot" + sfx, s, {b});
    }
    // Overflow chain of three buckets, the key inline in the last.
    {
      std::string b0 = EmptyBucket(g), b1 = EmptyBucket(g), b2 = EmptyBucket(g);
      const uint64_t o1 = heap, o2 = heap + 64 * 64;
      PutWord(b0, 0, MakeLink(o1, false));
      PutWord(b1, 0, MakeLink(o2, false));
      const std::string obj = Object(g, o2 + SlotAt(0), 11, s.key, "chained", kInlineGranule);
      if (kSlotLineSize + obj.size() <= g.bucket_size) {
        b2.replace(kSlotLineSize, obj.size(), obj);
        PutWord(b2, SlotAt(0), Slot::Resident(kh.fingerprint, o2 + kSlotLineSize, obj.size()));
      }
      emit("chain" + sfx, s, {b0, b1, b2});
      emit("short_read" + sfx, s, {b0, b1.substr(0, 10)});
    }
  }
  // A chain that links back to itself: the GET must give up after
  // kMaxChainLength buckets (kSlowPath). 64-byte buckets, so that the whole
  // chain (4 KiB) fits the fuzzer's input size, which it cannot reach from the
  // short seeds within the default 4096-byte limit.
  {
    const ReadPathSeed s = Prefix(0, 0, 4, 0x77, "user:1");
    std::string b = EmptyBucket(s.g);
    PutWord(b, 0, MakeLink(FirstRead(s.g, s.key).offset, false));
    emit("chain_cycle_b64", s, std::vector<std::string>(kMaxChainLength, b));
  }
  // The same shapes with every assist flag, so the fuzzer mutates from there.
  const ReadPathSeed s = Prefix(7, 3, 0, 1, "k");
  std::string b = EmptyBucket(s.g);
  PutWord(b, SlotAt(0), Slot::Resident(0, s.g.index_offset + kSlotLineSize, 48));
  PutWord(b, SlotAt(1), Slot::Resident(0, s.g.arena_size - 4096, 64));
  std::string obj = Object(s.g, 0, 1, "k", "inline", kInlineGranule);
  b.replace(kSlotLineSize, obj.size(), obj);
  emit("assisted", s, {b, Object(s.g, 0, 2, "k", "heap", 8) + std::string(16, '\0')});
  std::fprintf(stderr, "make_seeds: %d read_path seeds\n", n);
}

// ---- ack log ----
void AckLogSeeds() {
  char tmpl[] = "/tmp/kvnode_fuzz_seeds_XXXXXX";
  if (mkdtemp(tmpl) == nullptr) Die("mkdtemp", absl::InternalError("failed"));
  const std::string path = std::string(tmpl) + "/acks.log";
  std::string full;
  {
    auto w = Ok(load::AckLogWriter::Open(path, {.buffer_bytes = 0, .sync = false}), "open");
    Ok(w->Append("user:1", 5, false), "append");
    Ok(w->Append("user:2", 6, false), "append");
    Ok(w->Append("user:1", 7, true), "append");
    Ok(w->Append(std::string(1024, 'K'), 8, false), "append");
    Ok(w->Flush(), "flush");
  }
  std::ifstream in(path, std::ios::binary);
  full.assign(std::istreambuf_iterator<char>(in), {});
  std::filesystem::remove_all(tmpl);
  Write("ack_log", "empty_log", Flag(0, full.substr(0, 8)));
  Write("ack_log", "log", Flag(0, full));
  Write("ack_log", "log_fix", Flag(1, full));
  Write("ack_log", "torn_tail", Flag(0, full.substr(0, 8 + 22 + 22 + 5)));
  Write("ack_log", "torn_header", Flag(0, full.substr(0, 5)));
  std::string corrupt = full;
  corrupt[8 + 2] ^= 1;
  Write("ack_log", "corrupt_first", Flag(0, corrupt));
}

// ---- dedupe_record ----
// dedupe_record_fuzz.cc's input: u8 flags, u8 key length, key, record.
void DedupeRecordSeeds() {
  using namespace server;
  using proto::Opcode;
  using proto::RpcStatus;
  const uint64_t id = 0x00c0ffee12345678;
  const std::string key = ClientRecordKey(id);
  auto input = [](uint8_t flags, std::string_view k, std::string_view rec) {
    return std::string(1, static_cast<char>(flags)) + std::string(1, static_cast<char>(k.size())) +
           std::string(k) + std::string(rec);
  };
  auto entry = [](uint64_t seq, Opcode op, RpcStatus st, uint64_t version) {
    return DedupeEntry{seq, static_cast<uint8_t>(op), static_cast<uint8_t>(st), version};
  };
  const uint64_t now = 1'796'000'000'000;  // 2026-11, ms

  // A first write: one entry, no floor.
  DedupeWindow w(1024);
  const DedupeEntry first = entry(1, Opcode::kPut, RpcStatus::kOk, 5);
  PersistedClient one_rec = PersistedSnapshot(id, w, first, 8, now);
  for (size_t i = 0; i < one_rec.secret.size(); ++i)
    one_rec.secret[i] = static_cast<uint8_t>(i + 1);
  const std::string one = EncodeClientRecord(one_rec);
  Write("dedupe_record", "one_put", input(0, key, one));
  Write("dedupe_record", "one_put_fix_cap1", input(1 | (0 << 1), key, one));
  // 20 writes of every definitive answer, the newest 8 kept (the default
  // --rpc_credits) and a floor over the 12 others.
  w.Record(first);
  for (uint64_t seq = 2; seq <= 20; ++seq) {
    const Opcode op = seq % 3 == 0 ? Opcode::kDelete : Opcode::kPut;
    const RpcStatus st = seq % 5 == 0   ? RpcStatus::kRejected
                         : seq % 3 == 0 ? RpcStatus::kNotFound
                                        : RpcStatus::kOk;
    w.Record(entry(seq, op, st, op == Opcode::kPut ? 100 + seq : 0));
  }
  const std::string eight = EncodeClientRecord(
      PersistedSnapshot(id, w, entry(21, Opcode::kPut, RpcStatus::kOk, 121), 8, now));
  Write("dedupe_record", "eight_floor", input(0, key, eight));
  Write("dedupe_record", "eight_floor_fix_cap4", input(1 | (3 << 1), key, eight));
  // A window past its capacity (floor from Record's own forgetting).
  DedupeWindow small(4);
  for (uint64_t seq = 100; seq < 110; ++seq) {
    small.Record(entry(seq, Opcode::kPut, RpcStatus::kOk, seq));
  }
  const std::string wrapped = EncodeClientRecord(
      PersistedSnapshot(id, small, entry(200, Opcode::kDelete, RpcStatus::kOk, 0), 8, now));
  Write("dedupe_record", "wrapped", input(0, key, wrapped));
  // No entries, only a floor; and nothing at all.
  PersistedClient bare;
  bare.client_id = id;
  bare.written_unix_ms = now;
  const std::string empty = EncodeClientRecord(bare);
  Write("dedupe_record", "empty", input(0, key, empty));
  bare.window.has_floor = true;
  bare.window.floor = 99;
  Write("dedupe_record", "floor_only", input(0, key, EncodeClientRecord(bare)));
  // 200 entries (3,620 bytes: inside libFuzzer's default 4,096-byte inputs).
  DedupeWindow big(1024);
  for (uint64_t seq = 1; seq <= 200; ++seq) {
    big.Record(entry(seq * 7, Opcode::kPut, RpcStatus::kOk, seq));
  }
  const std::string many = EncodeClientRecord(
      PersistedSnapshot(id, big, entry(2000, Opcode::kPut, RpcStatus::kOk, 1), 200, now));
  Write("dedupe_record", "many_200", input(1 | (15 << 1), key, many));
  // Truncated and torn: one byte short, one entry short (count not matching),
  // the header alone, less than a header.
  Write("dedupe_record", "cut_byte",
        input(0, key, std::string_view(eight).substr(0, eight.size() - 1)));
  Write("dedupe_record", "cut_entry",
        input(0, key, std::string_view(eight).substr(0, eight.size() - 18)));
  Write("dedupe_record", "cut_header_only", input(0, key, std::string_view(eight).substr(0, 36)));
  Write("dedupe_record", "cut_short", input(0, key, std::string_view(eight).substr(0, 35)));
  // Keys that are not a client record's.
  Write("dedupe_record", "key_upper_hex", input(0, "dedupe/00C0FFEE12345678", one));
  Write("dedupe_record", "key_zero", input(0, ClientRecordKey(0), one));
}

}  // namespace
}  // namespace kvnode::fuzz

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR (e.g. tests/fuzz/corpus)\n", argv[0]);
    return 2;
  }
  using namespace kvnode::fuzz;
  g_root = argv[1];
  Control();
  Rpc();
  Handoff();
  HandoffHeaderSeeds();
  GeometrySeeds();
  ObjectSeeds();
  ReadPathSeeds();
  AckLogSeeds();
  DedupeRecordSeeds();
  std::printf("make_seeds: wrote %d files under %s\n", g_files, argv[1]);
  return 0;
}
