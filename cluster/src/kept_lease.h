// A driver's lock lease (the fleet roll's and slot migration's, both
// kvctl's): kept alive from its own thread every `every`, revoked on
// destruction, which deletes the lock key attached to it. Private to
// cluster/.
//
// Thread safety: Lost() may be called from any thread; the object is made
// and destroyed by one.
#ifndef KVNODE_CLUSTER_SRC_KEPT_LEASE_H_
#define KVNODE_CLUSTER_SRC_KEPT_LEASE_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>

#include "absl/time/time.h"
#include "kvnode/cluster/etcd_client.h"

namespace kvnode::cluster {

class KeptLease {
 public:
  KeptLease(EtcdClient& etcd, int64_t lease, absl::Duration every)
      : etcd_(etcd), lease_(lease), thread_([this, every] { KeepAlive(every); }) {}
  ~KeptLease() {
    {
      std::lock_guard<std::mutex> l(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
    (void)etcd_.LeaseRevoke(lease_);  // the lock key goes with it
  }
  KeptLease(const KeptLease&) = delete;
  KeptLease& operator=(const KeptLease&) = delete;

  // A renewal found the lease gone (expired while etcd was away, or
  // revoked): whoever holds it no longer holds the lock.
  bool Lost() const { return lost_.load(); }
  int64_t id() const { return lease_; }

 private:
  void KeepAlive(absl::Duration every) {
    const auto period = absl::ToChronoMilliseconds(every);
    std::unique_lock<std::mutex> l(mu_);
    while (!cv_.wait_for(l, period, [this] { return stop_; })) {
      l.unlock();
      auto ttl = etcd_.LeaseKeepAliveOnce(lease_);
      if (!ttl.ok() && absl::IsNotFound(ttl.status())) lost_ = true;
      l.lock();
    }
  }

  EtcdClient& etcd_;
  const int64_t lease_;
  // std::mutex, not absl::Mutex: TSan sees it (base/annotated_mutex.h).
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;  // under mu_
  std::atomic<bool> lost_{false};
  std::thread thread_;  // last: started once the members above exist
};

}  // namespace kvnode::cluster

#endif  // KVNODE_CLUSTER_SRC_KEPT_LEASE_H_
