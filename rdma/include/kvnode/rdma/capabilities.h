// Capability detection for sharing verbs objects with another process.
//
// ibv_import_device / ibv_import_pd / ibv_import_mr let a second process use
// the first one's PD and MR (mlx5 supports it). rxe does not
// (ibv_import_device fails with EOPNOTSUPP): the upgrade module then
// registers the shared pages again in the new process, which is fine: two
// processes may register the same MAP_SHARED pages at once.
#ifndef KVNODE_RDMA_CAPABILITIES_H_
#define KVNODE_RDMA_CAPABILITIES_H_

#include <string>

#include "absl/status/statusor.h"
#include "kvnode/rdma/device.h"

namespace kvnode::rdma {

struct ImportCaps {
  bool import_device = false;  // ibv_import_device on a dup of cmd_fd works
  bool import_pd = false;      // ibv_import_pd of a live PD works
  bool import_mr = false;      // ibv_import_mr of a live MR works
  bool odp = false;            // on-demand paging (DeviceCaps.odp)
  std::string detail;          // why not, e.g. "ibv_import_device: Operation not supported"

  // All three imports work: PD and MR may be shared instead of re-registered.
  bool can_share_mr() const { return import_device && import_pd && import_mr; }
};

// Probes the device by trying each import on throwaway objects of this
// process (cleaned up before returning). Error only if the probe itself
// could not run (e.g. dup failed); "unsupported" is a value, not an error.
absl::StatusOr<ImportCaps> DetectImportCaps(const Device& device);

}  // namespace kvnode::rdma

#endif  // KVNODE_RDMA_CAPABILITIES_H_
