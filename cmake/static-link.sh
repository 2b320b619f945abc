#!/usr/bin/env bash
# Link launcher for the kvnode executable (KVNODE_STATIC_EXE, set as the
# target's CXX_LINKER_LAUNCHER): runs the link command it is given with each
# library of the allow-list below taken from its static archive (lib<name>.a
# beside the shared object, or in the compiler's search path for -l<name>)
# when Debian ships one, and the shared object otherwise.
#
# Why a launcher: the imported targets of Abseil, glog and gflags (their own
# CMake config files) name the shared objects, and every library of this tree
# links them; only the executable may swap them for archives (libkvclient.so
# must not carry a private Abseil: its headers use absl::Status). Why: the
# dynamic loader's work at exec, ~50 shared objects, is much of a new
# process's start in a live upgrade.
#
# libibverbs (and libnl it needs) stays dynamic on purpose: it dlopen()s the
# provider of the device (librxe, libmlx5, ...), which links libibverbs.so
# itself; glibc stays dynamic (NSS, dlopen); libunwind too (Debian's archive
# is not position-independent and clashes with libgcc_eh's _Unwind_Resume).
#
# The archives are also repeated in one --start-group at the end: the order
# CMake emits suits shared objects, and glog's archive needs gflags and
# libunwind, which libglog.so brought itself.
set -euo pipefail
allow='^(absl_.*|glog|gflags|gflags_nothreads|snappy|z|bz2|lz4|zstd|xxhash|rocksdb)$'
args=()
group=()
add_group() {
  local a
  for a in "${group[@]}"; do [[ $a == "$1" ]] && return; done
  group+=("$1")
}
for arg in "$@"; do
  if [[ $arg =~ ^(.*/)?lib([^/]+)\.so(\.[0-9.]+)?$ ]]; then
    name=${BASH_REMATCH[2]}
    archive=${BASH_REMATCH[1]}lib$name.a
    if [[ $name =~ $allow && -f $archive ]]; then
      args+=("$archive")
      add_group "$archive"
      continue
    fi
  elif [[ $arg =~ ^-l([^:].*)$ ]]; then
    name=${BASH_REMATCH[1]}
    if [[ $name =~ $allow ]]; then
      archive=$("$1" -print-file-name="lib$name.a")
      if [[ $archive == /* && -f $archive ]]; then
        args+=("$archive")
        add_group "$archive"
        continue
      fi
    fi
  fi
  args+=("$arg")
done
# What the shared objects brought themselves and the archives do not.
extra=()
for g in "${group[@]}"; do
  case $g in
  */libglog.a)
    a=$("$1" -print-file-name=libgflags.a)
    [[ $a == /* && -f $a ]] && add_group "$a"
    extra+=(-lunwind)
    ;;
  esac
done
if ((${#group[@]})); then
  args+=(-Wl,--start-group "${group[@]}" -Wl,--end-group)
fi
args+=("${extra[@]}")
exec "${args[@]}"
