#include "common/device_env.h"

#include <infiniband/verbs.h>

#include <cstdlib>
#include <memory>

namespace kvnode::testing {
namespace {

bool PortActive(ibv_device* dev, int port) {
  ibv_context* ctx = ibv_open_device(dev);
  if (ctx == nullptr) return false;
  ibv_port_attr attr{};
  bool active = ibv_query_port(ctx, port, &attr) == 0 && attr.state == IBV_PORT_ACTIVE;
  ibv_close_device(ctx);
  return active;
}

}  // namespace

std::optional<TestDevice> FindTestDevice(std::string* why) {
  int n = 0;
  std::unique_ptr<ibv_device*, decltype(&ibv_free_device_list)> list(ibv_get_device_list(&n),
                                                                     &ibv_free_device_list);
  if (list == nullptr || n == 0) {
    *why = "ibv_get_device_list found no verbs device (run under deploy/vm/rxe-vm)";
    return std::nullopt;
  }
  std::string want;
  int want_port = 1;
  if (const char* env = std::getenv("KVNODE_TEST_DEVICE"); env != nullptr && *env != '\0') {
    want = env;
    if (auto colon = want.find(':'); colon != std::string::npos) {
      want_port = std::atoi(want.c_str() + colon + 1);
      want.resize(colon);
    }
  }
  for (int i = 0; i < n; ++i) {
    ibv_device* dev = list.get()[i];
    const char* name = ibv_get_device_name(dev);
    if (!want.empty() && want != name) continue;
    if (PortActive(dev, want_port)) return TestDevice{name, want_port};
    if (!want.empty()) {
      *why =
          "KVNODE_TEST_DEVICE=" + want + ": port " + std::to_string(want_port) + " is not ACTIVE";
      return std::nullopt;
    }
  }
  *why = want.empty() ? "no verbs device has an ACTIVE port 1"
                      : "KVNODE_TEST_DEVICE=" + want + ": no such device";
  return std::nullopt;
}

}  // namespace kvnode::testing
