// A std::mutex with Clang thread-safety annotations, for state that threads
// share. Not absl::Mutex: Debian's libabsl is built without TSan
// instrumentation, so TSan cannot see its happens-before edges and reports
// false races; pthread mutexes it sees.
#ifndef KVNODE_BASE_ANNOTATED_MUTEX_H_
#define KVNODE_BASE_ANNOTATED_MUTEX_H_

#include <mutex>

#include "absl/base/thread_annotations.h"

namespace kvnode {

class ABSL_LOCKABLE AnnotatedMutex {
 public:
  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { mu_.lock(); }
  void Unlock() ABSL_UNLOCK_FUNCTION() { mu_.unlock(); }

 private:
  std::mutex mu_;
};

class ABSL_SCOPED_LOCKABLE AnnotatedLock {
 public:
  explicit AnnotatedLock(AnnotatedMutex* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) {
    mu_->Lock();
  }
  ~AnnotatedLock() ABSL_UNLOCK_FUNCTION() { mu_->Unlock(); }
  AnnotatedLock(const AnnotatedLock&) = delete;
  AnnotatedLock& operator=(const AnnotatedLock&) = delete;

 private:
  AnnotatedMutex* mu_;
};

}  // namespace kvnode

#endif  // KVNODE_BASE_ANNOTATED_MUTEX_H_
