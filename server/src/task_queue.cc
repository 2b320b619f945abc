#include "task_queue.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace kvnode::server {

absl::StatusOr<std::unique_ptr<TaskQueue>> TaskQueue::Create() {
  const int fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (fd < 0) return absl::InternalError(absl::StrCat("eventfd: ", strerror(errno)));
  return std::unique_ptr<TaskQueue>(new TaskQueue(fd));
}

TaskQueue::~TaskQueue() { close(fd_); }

void TaskQueue::Post(std::function<void()> task) {
  {
    AnnotatedLock l(&mu_);
    tasks_.push_back(std::move(task));
    pending_.fetch_add(1, std::memory_order_release);
  }
  const uint64_t one = 1;
  // EAGAIN only when the counter would overflow: the fd is readable anyway.
  while (write(fd_, &one, sizeof(one)) < 0 && errno == EINTR) {
  }
}

size_t TaskQueue::RunAll() {
  uint64_t v = 0;
  while (read(fd_, &v, sizeof(v)) < 0 && errno == EINTR) {
  }
  std::deque<std::function<void()>> batch;
  {
    AnnotatedLock l(&mu_);
    batch.swap(tasks_);
    pending_.fetch_sub(batch.size(), std::memory_order_release);
  }
  for (auto& t : batch) t();
  return batch.size();
}

}  // namespace kvnode::server
