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
# libibverbs is taken from its archive too, with every provider's archive
# and libnl's (pkg-config --static): the shared libibverbs dlopen()s all the
# providers it is configured with at the first ibv_get_device_list, on the
# new process's way to Ready. The static one registers the providers the
# executable references (node/src/static_verbs_providers.cc, which CMake adds
# when libibverbs.a exists). glibc stays dynamic (NSS, dlopen); libunwind
# too (Debian's archive is not position-independent and clashes with
# libgcc_eh's _Unwind_Resume).
#
# The archives are also repeated in one --start-group at the end: the order
# CMake emits suits shared objects, and glog's archive needs gflags and
# libunwind, which libglog.so brought itself.
set -euo pipefail
# gRPC and protobuf (the cluster's etcd client) with everything Debian's
# grpc++.pc names: their shared objects would bring ~40 shared Abseil
# libraries beside the executable's static copy.
allow='^(absl_.*|glog|gflags|gflags_nothreads|snappy|z|bz2|lz4|zstd|xxhash|rocksdb|ibverbs|grpc\+\+|grpc|gpr|upb|address_sorting|re2|cares|protobuf|ssl|crypto)$'
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
  */libibverbs.a)
    libs=$(pkg-config --static --libs-only-l libibverbs) || {
      echo "static-link.sh: pkg-config --static libibverbs failed (libibverbs-dev, pkg-config)" >&2
      exit 1
    }
    for l in $libs; do
      name=${l#-l}
      [[ $name == pthread ]] && continue
      a=$("$1" -print-file-name="lib$name.a")
      if [[ $a != /* || ! -f $a ]]; then
        echo "static-link.sh: libibverbs.a needs lib$name.a, which is not installed" >&2
        exit 1
      fi
      add_group "$a"
    done
    ;;
  esac
done
if ((${#group[@]})); then
  args+=("-Wl,--start-group" "${group[@]}" "-Wl,--end-group")
fi
args+=("${extra[@]}")
exec "${args[@]}"
