#!/usr/bin/env python3
"""Copies one of etcd's .proto files without its gogoproto and google.api
annotations, which only steer Go code generation and the HTTP gateway, so
that protoc with grpc_cpp_plugin can compile it without those imports.

    strip-etcd-proto.py IN OUT

Removes: `import "gogoproto/...";`, `import "google/api/...";`, file options
`option (gogoproto.X) = ...;`, field options `[(gogoproto.X) = ...]`, and
every `option (google.api.http) = { ... };` block (braces counted).
"""
import re
import sys


def strip_http_options(text):
    out = []
    i = 0
    marker = re.compile(r"option\s*\(google\.api\.http\)\s*=\s*\{")
    while True:
        m = marker.search(text, i)
        if not m:
            out.append(text[i:])
            return "".join(out)
        out.append(text[i:m.start()])
        depth = 1
        j = m.end()
        while depth and j < len(text):
            depth += {"{": 1, "}": -1}.get(text[j], 0)
            j += 1
        if depth:
            sys.exit("strip-etcd-proto: unbalanced google.api.http option")
        if text[j:j + 1] == ";":
            j += 1
        i = j


def strip(text):
    text = re.sub(r'^\s*import\s+"(gogoproto|google/api)/[^"]*";\s*$', "", text, flags=re.M)
    text = re.sub(r"^\s*option\s*\(gogoproto\.[^)]*\)\s*=[^;]*;\s*$", "", text, flags=re.M)
    text = re.sub(r"\s*\[\s*\(gogoproto\.[^\]]*\]", "", text)
    return strip_http_options(text)


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: strip-etcd-proto.py IN OUT")
    with open(sys.argv[1], encoding="utf-8") as f:
        text = strip(f.read())
    if "gogoproto" in text or "google.api" in text:
        sys.exit("strip-etcd-proto: %s still names gogoproto or google.api" % sys.argv[1])
    with open(sys.argv[2], "w", encoding="utf-8") as f:
        f.write(text)


main()
