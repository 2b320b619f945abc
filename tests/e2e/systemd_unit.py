#!/usr/bin/env python3
"""Prints one command line of a systemd service unit as systemd would run it,
for tests on a machine without systemd (tests/e2e/deploy_unit.sh).

  systemd_unit.py --unit deploy/kvnode.service --root ROOT [--set VAR=VALUE]... KEY
  systemd_unit.py --unit deploy/kvnode.service --root ROOT --value KEY

KEY is ExecStart, ExecReload, ... of the [Service] section. With --value, the
setting KEY (User, LimitMEMLOCK, ...) is printed as written, specifiers
replaced, newline-terminated; the last one wins as in systemd; nothing when
the unit does not set it. What systemd does
and this script imitates (systemd.service(5), systemd.unit(5), systemd.exec(5)):
  - lines ending in a backslash continue on the next line;
  - specifiers %S (/var/lib), %t (/run), %E (/etc) and %% -- the directories
    are placed under ROOT; any other specifier is an error here;
  - EnvironmentFile= (its path under ROOT) gives VAR=VALUE lines (# and ;
    comments, optional quotes around the value); --set adds variables that
    systemd provides itself (MAINPID);
  - words split like a shell (quotes, backslashes); "${VAR}" inside a word is
    replaced by the value as is; a word that is exactly "$VAR" becomes the
    value split at whitespace (zero or more words); unset variables are empty;
  - the command's prefixes (-, @, :, +, !) are refused: the unit uses none.
The words are printed NUL-terminated.

  systemd_unit.py --notify SOCKET --main_pid_file FILE --log FILE

imitates the notify socket of a Type=notify, NotifyAccess=all service
(sd_notify(3), systemd.service(5)) until killed: a datagram socket at SOCKET
(mode 0777, as /run/systemd/notify), each message logged with its sender's pid
("pid P: READY=1 MAINPID=N"). FILE holds the service's main PID: the test
writes it when it starts the service, as systemd knows the process it forked,
and a MAINPID= naming a live process replaces it (a dead one is refused, as
systemd refuses an unsuitable main PID). When the main process dies the log
says "main process P exited": systemd would then stop the unit and kill
whatever else it runs (an upgrade's other process).
"""
import argparse
import os
import re
import shlex
import sys


def fail(msg):
    sys.stderr.write(f"systemd_unit.py: {msg}\n")
    sys.exit(2)


def service_settings(path):
    """(key, value) pairs of the [Service] section, continuations joined."""
    out, section, pending = [], None, ""
    with open(path) as f:
        for raw in f:
            line = raw.rstrip("\n")
            if pending:
                line = pending + " " + line.strip()
                pending = ""
            elif line.strip().startswith(("#", ";")) or not line.strip():
                continue
            if line.endswith("\\"):
                pending = line[:-1].rstrip()
                continue
            line = line.strip()
            if line.startswith("[") and line.endswith("]"):
                section = line[1:-1]
                continue
            if "=" not in line:
                fail(f"{path}: not KEY=VALUE: {line!r}")
            k, v = line.split("=", 1)
            if section == "Service":
                out.append((k.strip(), v.strip()))
    if pending:
        fail(f"{path}: ends in a continuation")
    return out


def specifiers(s, root):
    table = {"S": f"{root}/var/lib", "t": f"{root}/run", "E": f"{root}/etc", "%": "%"}

    def one(m):
        if m.group(1) not in table:
            fail(f"specifier %{m.group(1)} not handled by this test")
        return table[m.group(1)]

    return re.sub(r"%(.)", one, s)


def environment_file(path):
    env = {}
    with open(path) as f:
        for n, raw in enumerate(f, 1):
            line = raw.strip()
            if not line or line.startswith(("#", ";")):
                continue
            m = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*)=(.*)", line)
            if not m:
                fail(f"{path}:{n}: not VAR=VALUE: {line!r}")
            v = m.group(2)
            if len(v) >= 2 and v[0] == v[-1] and v[0] in "\"'":
                v = v[1:-1]
            env[m.group(1)] = v
    return env


def alive(pid):
    """Running, not a zombie (the test's shell reaps the first process late)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def notify_socket(path, main_pid_file, log_path):
    import socket
    import struct

    if os.path.exists(path):
        os.unlink(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
    sock.bind(path)
    os.chmod(path, 0o777)
    sock.settimeout(0.05)  # how often the main process is looked at
    log = open(log_path, "a", buffering=1)
    main, dead = None, None

    def read_main():
        try:
            with open(main_pid_file) as f:
                return int(f.read().strip() or 0) or None
        except (OSError, ValueError):
            return None

    def write_main(pid):
        with open(main_pid_file + ".tmp", "w") as f:
            f.write(f"{pid}\n")
        os.rename(main_pid_file + ".tmp", main_pid_file)

    while True:
        main = read_main()
        if main is not None and main != dead and not alive(main):
            log.write(f"main process {main} exited: systemd would stop the unit\n")
            dead = main
        try:
            data, anc, _, _ = sock.recvmsg(4096, socket.CMSG_SPACE(12))
        except socket.timeout:
            continue
        sender = None
        for level, kind, payload in anc:
            if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
                sender = struct.unpack("iII", payload[:12])[0]
        fields = data.decode(errors="replace").split("\n")
        log.write(f"pid {sender}: {' '.join(f for f in fields if f)}\n")
        for f in fields:
            if not f.startswith("MAINPID="):
                continue
            pid = int(f[len("MAINPID="):])
            if not alive(pid):
                log.write(f"MAINPID={pid} refused: no such process\n")
            elif pid != main:
                write_main(pid)
                log.write(f"main PID {main} -> {pid}\n")


def main():
    if "--notify" in sys.argv:
        ap = argparse.ArgumentParser()
        ap.add_argument("--notify", required=True)
        ap.add_argument("--main_pid_file", required=True)
        ap.add_argument("--log", required=True)
        a = ap.parse_args()
        notify_socket(a.notify, a.main_pid_file, a.log)
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--unit", required=True)
    ap.add_argument("--root", required=True)
    ap.add_argument("--set", action="append", default=[])
    ap.add_argument("--value", action="store_true")
    ap.add_argument("key")
    a = ap.parse_args()
    settings = service_settings(a.unit)
    if a.value:
        values = [v for k, v in settings if k == a.key]
        if values:
            sys.stdout.write(specifiers(values[-1], a.root) + "\n")
        return
    env = {}
    for k, v in settings:
        if k == "EnvironmentFile":
            optional = v.startswith("-")
            p = specifiers(v.lstrip("-"), a.root)
            if not p.startswith("/"):
                fail(f"EnvironmentFile={v} is not absolute")
            p = p if p.startswith(a.root + "/") else a.root + p
            if os.path.exists(p):
                env.update(environment_file(p))
            elif not optional:
                fail(f"EnvironmentFile {p} is missing (systemd would not start the unit)")
        elif k == "Environment":
            for w in shlex.split(specifiers(v, a.root)):
                name, _, val = w.partition("=")
                env[name] = val
    for s in a.set:
        name, _, val = s.partition("=")
        env[name] = val
    lines = [v for k, v in settings if k == a.key]
    if len(lines) != 1:
        fail(f"{a.key}= appears {len(lines)} times in [Service], expected once")
    cmd = specifiers(lines[0], a.root)
    if cmd[:1] in "-@:+!":
        fail(f"{a.key}= has a prefix this test does not handle: {cmd[:1]}")
    words = []
    for w in shlex.split(cmd):
        m = re.fullmatch(r"\$([A-Za-z_][A-Za-z0-9_]*)", w)
        if m:
            words.extend(env.get(m.group(1), "").split())
            continue
        words.append(re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", lambda m: env.get(m.group(1), ""), w))
    sys.stdout.write("".join(w + "\0" for w in words))


if __name__ == "__main__":
    main()
