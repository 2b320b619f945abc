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


def main():
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
