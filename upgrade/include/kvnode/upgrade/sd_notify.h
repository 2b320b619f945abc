// systemd's readiness protocol (sd_notify(3)) written directly to
// $NOTIFY_SOCKET: one datagram per call, no libsystemd.
//
// With deploy/kvnode.service (Type=notify, NotifyAccess=all, ExecReload
// starts an upgrade) a live upgrade reads to systemd as a reload:
//   O at the start        SdNotifyReloading()       "RELOADING=1\nMONOTONIC_USEC=..."
//   O at its commit       SdNotifyNewMainPid(N)     "MAINPID=<N>\nREADY=1"
//     (Owned taken in: the point after which nothing rolls back; N says the
//     same once O has exited, in case O died before)
//   O on a rollback       SdNotifyMainPid(O) first, SdNotifyReady() when done
// and at first start the node sends SdNotifyReady().
//
// Thread safety: reentrant.
#ifndef KVNODE_UPGRADE_SD_NOTIFY_H_
#define KVNODE_UPGRADE_SD_NOTIFY_H_

#include <sys/types.h>

#include <string_view>

#include "absl/status/status.h"

namespace kvnode::upgrade {

// Sends `state` ("KEY=VALUE" lines) to $NOTIFY_SOCKET: a path, or an abstract
// socket when it starts with '@'. OK and nothing sent when the variable is
// unset or empty (not started by systemd). Never blocks.
[[nodiscard]] absl::Status SdNotify(std::string_view state);

[[nodiscard]] absl::Status SdNotifyReady();
// RELOADING=1 with MONOTONIC_USEC (what Type=notify-reload requires, harmless
// for Type=notify).
[[nodiscard]] absl::Status SdNotifyReloading();
// MAINPID=<pid>: the service's main process is `pid`.
[[nodiscard]] absl::Status SdNotifyMainPid(pid_t pid);
// MAINPID=<pid> then READY=1: the service's main process is now `pid`.
[[nodiscard]] absl::Status SdNotifyNewMainPid(pid_t pid);
[[nodiscard]] absl::Status SdNotifyStatus(std::string_view text);
[[nodiscard]] absl::Status SdNotifyStopping();

}  // namespace kvnode::upgrade

#endif  // KVNODE_UPGRADE_SD_NOTIFY_H_
