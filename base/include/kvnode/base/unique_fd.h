// UniqueFd: sole owner of one file descriptor, closed on destruction.
//
// Thread safety: a plain value; one owner at a time.
#ifndef KVNODE_BASE_UNIQUE_FD_H_
#define KVNODE_BASE_UNIQUE_FD_H_

#include <unistd.h>

#include <utility>

namespace kvnode::base {

class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  ~UniqueFd() { Reset(); }
  UniqueFd(UniqueFd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept {
    if (this != &o) {
      Reset();
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  // Gives up ownership; the caller closes the descriptor.
  [[nodiscard]] int Release() { return std::exchange(fd_, -1); }
  // Closes the descriptor (errors from close() are ignored: the fd is gone
  // either way on Linux).
  void Reset(int fd = -1) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }

 private:
  int fd_ = -1;
};

}  // namespace kvnode::base

#endif  // KVNODE_BASE_UNIQUE_FD_H_
