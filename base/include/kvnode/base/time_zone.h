// The process's time zone, fixed at start.
#ifndef KVNODE_BASE_TIME_ZONE_H_
#define KVNODE_BASE_TIME_ZONE_H_

namespace kvnode::base {

// Sets TZ to ":/etc/localtime" (the zone the system names now) unless TZ is
// already set, and reads the zone now. glibc converts times under one
// process-wide lock, and with TZ unset its mktime(), which glog calls for
// every log line, stats /etc/localtime inside that lock to see whether it
// changed. A file-system round trip per line then serialises every thread
// that logs: on a slow root (the test bed's 9p) two client threads logging
// their Moves at once both stalled for milliseconds, and with them every
// GET they poll. With TZ set, the zone file is read here, once; a later
// change of /etc/localtime is seen at the next start. Call it first in
// main, before any thread starts: setenv() is not thread-safe.
void PinLocalTimeZone();

}  // namespace kvnode::base

#endif  // KVNODE_BASE_TIME_ZONE_H_
