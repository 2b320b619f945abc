#!/usr/bin/env python3
"""Compiles every Python snippet the scripts under deploy/ and tests/ run.

The scripts embed Python (`python3 - <<'PY'` heredocs, `python3 -c '...'`)
that no compiler sees until the script reaches it, sometimes only at the end
of a long run (deploy/demo.sh's summary did). Debian 12 ships Python 3.11,
which rejects syntax that is legal only from 3.12 (a backslash or the
enclosing quote reused inside an f-string's braces), so this test is only
meaningful with a python3 older than 3.12 and says so when it is not.

usage: python_syntax_test.py REPO_ROOT
"""
import os
import re
import sys

HEREDOC = re.compile(r"<<-?\s*['\"]?(\w+)['\"]?")
DASH_C_SINGLE = re.compile(r"python3\s+(?:-u\s+)?-c\s+'([^']*)'")
DASH_C_DOUBLE = re.compile(r'python3\s+(?:-u\s+)?-c\s+"((?:[^"\\]|\\.)*)"')


def snippets(path, text):
    """Yields (line, source) for each Python program in one file."""
    if path.endswith(".py"):
        yield 1, text
        return
    lines = text.split("\n")
    for i, line in enumerate(lines):
        at = line.find("python3")
        m = HEREDOC.search(line)
        if at < 0 or not m or m.start() < at:
            continue
        body = []
        for following in lines[i + 1:]:
            if following.strip() == m.group(1):
                break
            body.append(following)
        yield i + 2, "\n".join(body)
    for pattern in (DASH_C_SINGLE, DASH_C_DOUBLE):
        for m in pattern.finditer(text):
            yield text.count("\n", 0, m.start()) + 1, m.group(1)


def main():
    root = sys.argv[1]
    checked = failed = 0
    for top in ("deploy", "tests"):
        for dirpath, _, names in os.walk(os.path.join(root, top)):
            for name in sorted(names):
                path = os.path.join(dirpath, name)
                try:
                    with open(path, encoding="utf-8") as f:
                        text = f.read()
                except (UnicodeDecodeError, OSError):
                    continue
                if not path.endswith(".py") and "python3" not in text:
                    continue
                for line, source in snippets(path, text):
                    checked += 1
                    where = f"{os.path.relpath(path, root)}:{line}"
                    try:
                        compile(source, where, "exec")
                    except SyntaxError as e:
                        failed += 1
                        print(f"{where}: {e}")
    version = ".".join(map(str, sys.version_info[:3]))
    print(f"{checked} Python snippets compiled with Python {version}, {failed} failed")
    if sys.version_info >= (3, 12):
        print("note: Python >= 3.12 accepts syntax Debian 12's 3.11 rejects")
    # The extraction must find the scripts' snippets, or this passes vacuously.
    if checked < 10:
        print(f"expected at least 10 snippets, found {checked}: extraction broke")
        return 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
