#!/bin/bash
# SPDX-License-Identifier: MIT
#
# `make run`: blkimg's main job on a demo image in ./demo/. Creates a raw
# image, writes patterns with blkimg-io (cache=none, unaligned on purpose),
# shows info, map and probe, reads the data back with qemu-io when it is
# installed, and, when this blkimg has `convert`, converts the image to
# qcow2 and compares the result with qemu-img compare.
set -uo pipefail

cd "$(dirname "$0")/.."
REPO=$(pwd)
BUILD=${BLKIMG_BUILD:-build}
case "$BUILD" in
/*) ;;
*) BUILD="$REPO/$BUILD" ;;
esac
BLKIMG="$BUILD/blkimg"
BLKIMG_IO="$BUILD/blkimg-io"
DEMO="$REPO/demo"
IMG=disk.raw

for t in "$BLKIMG" "$BLKIMG_IO"; do
    if [ ! -x "$t" ]; then
        echo "demo: $t is not built (run make)" >&2
        exit 1
    fi
done

if [ -t 1 ]; then
    B=$'\e[1m' D=$'\e[2m' N=$'\e[0m'
else
    B="" D="" N=""
fi
step=0
failed=0

# quote ARG...: a command line as one would type it.
quote() {
    local a out=""
    for a in "$@"; do
        a=${a#"$BUILD/"}
        if [[ "$a" =~ ^[A-Za-z0-9_./=:,+%@-]+$ ]]; then
            out+="$a "
        else
            out+="'${a//\'/\'\\\'\'}' "
        fi
    done
    echo "${out% }"
}

# show TITLE CMD...: prints the step and the command line, runs it.
show() {
    local title=$1
    shift
    step=$((step + 1))
    echo
    echo "${B}== $step. $title${N}"
    echo "${D}\$ $(quote "$@")${N}"
    "$@"
    local rc=$?
    if [ $rc -ne 0 ]; then
        echo "demo: step $step failed (exit $rc)"
        failed=$((failed + 1))
    fi
    return $rc
}

# has_subcommand NAME (qemu-img answers "Command not found: NAME").
has_subcommand() {
    local out
    out=$("$BLKIMG" "$1" </dev/null 2>&1) && return 0
    ! echo "$out" | grep -qiE "command not found|unknown (sub)?command|invalid command"
}

rm -rf "$DEMO"
mkdir -p "$DEMO"
cd "$DEMO" || exit 1
start=$(date +%s.%N)
echo "${B}blkimg demo${N} in $DEMO (binaries from $BUILD)"

show "Create a 64 MiB raw image" \
    "$BLKIMG" create -f raw "$IMG" 64M

show "Write patterns with blkimg-io, cache=none (O_DIRECT), some unaligned; --stats counts the I/O" \
    "$BLKIMG_IO" -f raw -t none --stats \
    -c "write -P 0xaa 0 1M" \
    -c "write -P 0x55 4M 64k" \
    -c "write -P 0x11 1000 3000" \
    -c "write -z 8M 1M" \
    -c "write -P 0x77 33554431 1" \
    -c "read -P 0x11 1000 3000" \
    -c "read -v 33554424 16" \
    "$IMG"

show "Image information" \
    "$BLKIMG" info -f raw "$IMG"

show "Allocation map (human)" \
    "$BLKIMG" map -f raw "$IMG"

show "Allocation map (JSON)" \
    "$BLKIMG" map -f raw --output=json "$IMG"

show "Direct-I/O limits of this storage, and where each came from" \
    "$BLKIMG" probe -t none "$IMG"

if command -v qemu-io >/dev/null 2>&1; then
    step=$((step + 1))
    echo
    echo "${B}== $step. Cross-check: QEMU's qemu-io reads back what blkimg-io wrote${N}"
    checks=(-c "read -P 0xaa 0 1000" -c "read -P 0x11 1000 3000"
        -c "read -P 0xaa 4000 1044576" -c "read -P 0x55 4M 64k"
        -c "read -P 0 8M 1M" -c "read -P 0x77 33554431 1")
    echo "${D}\$ $(quote qemu-io -f raw -r "${checks[@]}" "$IMG")${N}"
    out=$(qemu-io -f raw -r "${checks[@]}" "$IMG" 2>&1)
    echo "$out" | grep -v "^[0-9.]* \(bytes\|[KMG]iB\), [0-9]* ops;"
    if echo "$out" | grep -q "Pattern verification failed" ||
        [ "$(echo "$out" | grep -c "^read ")" -ne 6 ]; then
        echo "demo: qemu-io did not read back the expected data"
        failed=$((failed + 1))
    else
        echo "(all six patterns verified by qemu-io)"
    fi
fi

if has_subcommand convert; then
    show "Convert to qcow2 with blkimg convert (cache=none on both sides)" \
        "$BLKIMG" convert -p -t none -T none -f raw -O qcow2 "$IMG" disk.qcow2
    show "Information about the qcow2 image" \
        "$BLKIMG" info disk.qcow2
    if command -v qemu-img >/dev/null 2>&1; then
        show "qemu-img compare: the qcow2 holds the same data as the raw image" \
            qemu-img compare -f raw -F qcow2 "$IMG" disk.qcow2
        show "qemu-img check: the qcow2 is consistent" \
            qemu-img check disk.qcow2
    fi
else
    echo
    echo "(this blkimg has no convert subcommand yet: conversion skipped)"
fi

secs=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b - a}')
echo
if [ "$failed" -eq 0 ]; then
    echo "${B}demo finished in $secs s; files are in $DEMO${N}"
else
    echo "${B}demo finished in $secs s with $failed failed step(s)${N}"
    exit 1
fi
