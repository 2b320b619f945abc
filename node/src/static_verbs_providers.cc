// Linked into kvnode only when libibverbs comes from its archive
// (KVNODE_STATIC_EXE, node/CMakeLists.txt, cmake/static-link.sh). A static
// libibverbs loads no provider from /etc/libibverbs.d: a provider is linked
// in when its verbs_provider_<name> symbol is referenced (its constructor
// then registers it), and verbs_provider_all references every provider the
// archive was built with, so the executable drives the same devices as the
// shared library does.
//
// Why the archive: the shared libibverbs dlopen()s every provider it is
// configured with (17 on Debian 12) at the first ibv_get_device_list, which
// is on a new process's way to Ready in a live upgrade. docs/upgrade.md,
// "Starting the new process", has the measurement.
#define RDMA_STATIC_PROVIDERS all
#include <infiniband/verbs.h>

namespace {
[[maybe_unused]] const bool kProvidersLinked =
    (ibv_static_providers(nullptr, &verbs_provider_all, nullptr), true);
}  // namespace
