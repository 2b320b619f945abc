// Little-endian byte cursors shared by the codecs of bytes from outside the
// process: the control protocol and RPCs (kvproto) and the upgrade handoff
// (kvupgrade).
//
// Writer appends to a std::string or fills a fixed span; Reader consumes a
// span and never reads past its end: every Read* returns false once the input
// is exhausted, and the caller turns that into a status. Nothing here trusts
// its input.
#ifndef KVNODE_PROTO_WIRE_H_
#define KVNODE_PROTO_WIRE_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>

#include "absl/strings/string_view.h"
#include "kvnode/base/errno.h"

namespace kvnode::proto::wire {

using base::Av;

inline void StoreLe(uint8_t* p, uint64_t v, size_t n) {
  for (size_t i = 0; i < n; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}

inline uint64_t LoadLe(const uint8_t* p, size_t n) {
  uint64_t v = 0;
  for (size_t i = 0; i < n; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return v;
}

// Appends little-endian fields to a string.
class StringWriter {
 public:
  explicit StringWriter(std::string* out) : out_(out) {}
  void U8(uint8_t v) { Put(v, 1); }
  void U16(uint16_t v) { Put(v, 2); }
  void U32(uint32_t v) { Put(v, 4); }
  void U64(uint64_t v) { Put(v, 8); }
  void Bytes(std::string_view b) { out_->append(b); }
  void Bytes(std::span<const uint8_t> b) {
    out_->append(reinterpret_cast<const char*>(b.data()), b.size());
  }
  size_t size() const { return out_->size(); }
  // `n` more bytes (zeros) for the caller to fill, e.g. with a SpanWriter:
  // a large message grows its buffer once and is written without a size
  // check per field.
  std::span<uint8_t> Extend(size_t n) {
    const size_t at = out_->size();
    out_->resize(at + n);
    return {reinterpret_cast<uint8_t*>(out_->data()) + at, n};
  }

 private:
  void Put(uint64_t v, size_t n) {
    uint8_t buf[8];
    StoreLe(buf, v, n);
    out_->append(reinterpret_cast<const char*>(buf), n);
  }
  std::string* out_;
};

// Writes little-endian fields into a span the caller has sized beforehand.
// The caller checks the total size first; writes past the end are a bug, not
// an input error, and are refused (ok() turns false) rather than performed.
class SpanWriter {
 public:
  explicit SpanWriter(std::span<uint8_t> out) : out_(out) {}
  void U8(uint8_t v) { Put(v, 1); }
  void U16(uint16_t v) { Put(v, 2); }
  void U32(uint32_t v) { Put(v, 4); }
  void U64(uint64_t v) { Put(v, 8); }
  void Bytes(std::string_view b) {
    if (!Room(b.size())) return;
    if (!b.empty()) std::memcpy(out_.data() + pos_, b.data(), b.size());
    pos_ += b.size();
  }
  size_t pos() const { return pos_; }
  bool ok() const { return ok_; }

 private:
  bool Room(size_t n) {
    if (!ok_ || out_.size() - pos_ < n) {
      ok_ = false;
      return false;
    }
    return true;
  }
  void Put(uint64_t v, size_t n) {
    if (!Room(n)) return;
    StoreLe(out_.data() + pos_, v, n);
    pos_ += n;
  }
  std::span<uint8_t> out_;
  size_t pos_ = 0;
  bool ok_ = true;
};

// Consumes little-endian fields from a span. Each Read returns false (and
// leaves the output untouched) when fewer bytes remain than requested.
class Reader {
 public:
  explicit Reader(std::span<const uint8_t> in) : in_(in) {}
  bool U8(uint8_t* v) { return Get(v, 1); }
  bool U16(uint16_t* v) { return Get(v, 2); }
  bool U32(uint32_t* v) { return Get(v, 4); }
  bool U64(uint64_t* v) { return Get(v, 8); }
  // A view of the next n bytes (valid as long as the input is).
  bool View(size_t n, std::string_view* v) {
    if (remaining() < n) return false;
    *v = std::string_view(reinterpret_cast<const char*>(in_.data() + pos_), n);
    pos_ += n;
    return true;
  }
  bool Copy(uint8_t* dst, size_t n) {
    if (remaining() < n) return false;
    if (n != 0) std::memcpy(dst, in_.data() + pos_, n);
    pos_ += n;
    return true;
  }
  size_t remaining() const { return in_.size() - pos_; }
  size_t pos() const { return pos_; }

 private:
  template <typename T>
  bool Get(T* v, size_t n) {
    if (remaining() < n) return false;
    *v = static_cast<T>(LoadLe(in_.data() + pos_, n));
    pos_ += n;
    return true;
  }
  std::span<const uint8_t> in_;
  size_t pos_ = 0;
};

}  // namespace kvnode::proto::wire

#endif  // KVNODE_PROTO_WIRE_H_
