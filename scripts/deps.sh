#!/bin/bash
# SPDX-License-Identifier: MIT
#
# Install the Debian packages blkimg needs to build, test and benchmark.
# A fast no-op when everything is present: only missing packages are
# installed, and `apt-get update` runs only when something is missing.
#
# Usage: scripts/deps.sh [--fuzz] [--check]
#   --fuzz    also what `make fuzz` needs (clang and its libFuzzer and
#             sanitizer runtimes; `make check` does not need them)
#   --check   only report what is missing (exit 1 if anything is)
set -euo pipefail

PACKAGES=(
    # build
    meson ninja-build pkg-config gcc libc6-dev
    liburing-dev zlib1g-dev libzstd-dev libdeflate-dev libcmocka-dev libnbd-dev
    nbdkit-plugin-dev
    libcurl4-gnutls-dev librbd-dev librados-dev libgcrypt20-dev
    # tests
    python3 python3-pytest python3-pytest-timeout python3-pytest-xdist
    python3-crcmod
    qemu-utils fio xfsprogs e2fsprogs util-linux mount
    nbdkit libnbd-bin python3-libnbd gnutls-bin
    # http(s) tests: a real web server, openssl for its certificate;
    # a single-node Ceph cluster for the rbd tests; QEMU's curl and rbd
    # modules to compare with
    nginx-light openssl ceph-mon ceph-osd ceph-common qemu-block-extra
    # format check
    clang-format
    # man pages (scdoc; groff renders them in the tests), bash completion
    scdoc groff-base man-db bash-completion
    # Debian packages (dpkg-buildpackage, lintian; the test copies the tree
    # git tracks)
    build-essential dpkg-dev debhelper lintian git
    # benchmarks (gnuplot draws bench/chart.py's charts)
    hyperfine time procps gnuplot-nox
)
FUZZ_PACKAGES=(clang libclang-rt-14-dev)

check_only=false
for arg in "$@"; do
    case $arg in
    --fuzz) PACKAGES+=("${FUZZ_PACKAGES[@]}") ;;
    --check) check_only=true ;;
    *)
        echo "usage: $0 [--fuzz] [--check]" >&2
        exit 2
        ;;
    esac
done

# One dpkg-query call for all of them (packages it does not know are simply
# absent from its output).
installed=" $( (dpkg-query -W -f='${Package}:${db:Status-Status} ' "${PACKAGES[@]}" \
    2>/dev/null || true) | tr ' ' '\n' | sed -n 's/:installed$//p' | tr '\n' ' ') "
missing=()
for p in "${PACKAGES[@]}"; do
    case "$installed" in
    *" $p "*) ;;
    *) missing+=("$p") ;;
    esac
done

if [ ${#missing[@]} -eq 0 ]; then
    exit 0
fi

if $check_only; then
    echo "missing packages: ${missing[*]}"
    exit 1
fi

echo "deps: installing missing packages: ${missing[*]}"
SUDO=
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then
        SUDO=sudo
    else
        echo "deps: not root and no sudo; please install: ${missing[*]}" >&2
        exit 1
    fi
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q </dev/null
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}" </dev/null
echo "deps: done"
