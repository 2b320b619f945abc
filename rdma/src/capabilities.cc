#include "kvnode/rdma/capabilities.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kvnode/rdma/errors.h"

namespace kvnode::rdma {

absl::StatusOr<ImportCaps> DetectImportCaps(const Device& device) {
  ImportCaps caps;
  caps.odp = device.caps().odp;
  ibv_context* ctx = device.context();
  const int fd = dup(ctx->cmd_fd);
  if (fd < 0) return ErrnoStatus("dup(cmd_fd) for the import probe", errno);
  ibv_context* imported = ibv_import_device(fd);
  if (imported == nullptr) {
    const int err = errno;
    close(fd);
    caps.detail = absl::StrCat("ibv_import_device: ", std::strerror(err), " (errno ", err, ")");
    return caps;
  }
  caps.import_device = true;  // `imported` owns fd now; closed with it

  // Throwaway PD and MR in this process, imported through the new context.
  ibv_pd* pd = ibv_alloc_pd(ctx);
  std::vector<char> page(4096);
  ibv_mr* mr = pd != nullptr ? ibv_reg_mr(pd, page.data(), page.size(), 0) : nullptr;
  if (pd == nullptr || mr == nullptr) {
    caps.detail = absl::StrCat("probe PD/MR allocation failed: ", std::strerror(errno));
  } else {
    ibv_pd* ipd = ibv_import_pd(imported, pd->handle);
    if (ipd == nullptr) {
      caps.detail = absl::StrCat("ibv_import_pd: ", std::strerror(errno));
    } else {
      caps.import_pd = true;
      ibv_mr* imr = ibv_import_mr(ipd, mr->handle);
      if (imr == nullptr) {
        caps.detail = absl::StrCat("ibv_import_mr: ", std::strerror(errno));
      } else {
        caps.import_mr = true;
        ibv_unimport_mr(imr);
      }
      ibv_unimport_pd(ipd);
    }
  }
  if (mr != nullptr) ibv_dereg_mr(mr);
  if (pd != nullptr) ibv_dealloc_pd(pd);
  ibv_close_device(imported);
  return caps;
}

}  // namespace kvnode::rdma
