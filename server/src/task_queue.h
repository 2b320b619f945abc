// A queue of closures run by one owner thread, woken through an eventfd: the
// only way the control thread and the data-plane thread hand work to each
// other (no shared mutable state beyond this queue and the atomic counters).
//
// Post() may be called from any thread. RunAll() only by the owner.
#ifndef KVNODE_SERVER_SRC_TASK_QUEUE_H_
#define KVNODE_SERVER_SRC_TASK_QUEUE_H_

#include <atomic>
#include <deque>
#include <functional>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "kvnode/base/annotated_mutex.h"

namespace kvnode::server {

class TaskQueue {
 public:
  static absl::StatusOr<std::unique_ptr<TaskQueue>> Create();
  ~TaskQueue();
  TaskQueue(const TaskQueue&) = delete;
  TaskQueue& operator=(const TaskQueue&) = delete;

  void Post(std::function<void()> task);
  // Cheap check for the owner's hot loop (no lock, no syscall).
  bool pending() const { return pending_.load(std::memory_order_acquire) != 0; }
  // Runs every task queued so far (tasks they post run next time); returns
  // how many ran. Clears the eventfd.
  size_t RunAll();
  // Readable while tasks are pending (EFD_NONBLOCK eventfd).
  int fd() const { return fd_; }

 private:
  explicit TaskQueue(int fd) : fd_(fd) {}
  const int fd_;
  AnnotatedMutex mu_;
  std::deque<std::function<void()>> tasks_ ABSL_GUARDED_BY(mu_);
  std::atomic<uint64_t> pending_{0};
};

}  // namespace kvnode::server

#endif  // KVNODE_SERVER_SRC_TASK_QUEUE_H_
