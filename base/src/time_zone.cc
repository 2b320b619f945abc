#include "kvnode/base/time_zone.h"

#include <cstdlib>
#include <ctime>

namespace kvnode::base {

void PinLocalTimeZone() {
  setenv("TZ", ":/etc/localtime", /*overwrite=*/0);
  tzset();
}

}  // namespace kvnode::base
