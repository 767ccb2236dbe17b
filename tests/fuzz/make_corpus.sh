#!/bin/bash
# SPDX-License-Identifier: MIT
#
# Regenerates the seed corpora of the fuzz targets, tests/fuzz/corpus/
# <target>/, with QEMU's qemu-img and qemu-io: tiny images (virtual sizes
# of a few KiB to a MiB, small clusters) of the kinds the image targets
# should start from, and strings for fuzz_parse. Every seed stays a few
# KiB; the foreign formats are cut to their first 4 KiB (their headers).
#
# Usage: tests/fuzz/make_corpus.sh   (from anywhere; rewrites the corpora)
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
OUT=$HERE/corpus
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

img() { qemu-img "$@" >/dev/null; }
io() { qemu-io "$@" >/dev/null; }

# qcow2 NAME SIZE OPTIONS [qemu-io commands...]: a qcow2 image with data.
qcow2() {
    local name=$1 size=$2 opts=$3 f=$WORK/$1
    shift 3
    img create -f qcow2 -o "$opts" "$f" "$size"
    for c in "$@"; do
        io -f qcow2 -c "$c" "$f"
    done
}

mkdir -p "$WORK/img"
cd "$WORK"
qcow2 qcow2-v3-512 64k cluster_size=512 "write -P 0xaa 0 1k" \
    "write -z 4k 1k" "write -P 0x11 60k 4k"
qcow2 qcow2-v2-512 64k compat=0.10,cluster_size=512 "write -P 0x55 1k 2k"
qcow2 qcow2-ext-l2 64k cluster_size=16k,extended_l2=on \
    "write -P 0x33 0 3k" "write -z 8k 2k"
qcow2 qcow2-zlib 64k cluster_size=512 "write -c -P 0x66 0 512" \
    "write -c -P 0x67 4k 512" "write -P 0x68 8k 512"
qcow2 qcow2-zstd 64k cluster_size=512,compression_type=zstd \
    "write -c -P 0x77 0 512" "write -c -P 0x78 2k 1k"
qcow2 qcow2-refcount1 32k cluster_size=512,refcount_bits=1 "write -P 1 0 1k"
qcow2 qcow2-refcount64 32k cluster_size=512,refcount_bits=64 \
    "write -P 2 0 1k"
qcow2 qcow2-lazy 32k cluster_size=512,lazy_refcounts=on "write -P 3 0 1k"
qcow2 qcow2-snapshots 32k cluster_size=512 "write -P 4 0 1k"
img snapshot -c snap1 qcow2-snapshots
io -f qcow2 -c "write -P 5 512 1k" qcow2-snapshots
img snapshot -c snap2 qcow2-snapshots
qcow2 qcow2-bitmaps 64k cluster_size=512 "write -P 6 0 1k"
img bitmap --add -g 4k qcow2-bitmaps b0
img bitmap --add --disable -g 16k qcow2-bitmaps b1
io -f qcow2 -c "write -P 7 8k 4k" qcow2-bitmaps
head -c 32k /dev/zero >base.raw
qcow2 qcow2-backing 32k cluster_size=512,backing_file=base.raw,backing_fmt=raw \
    "write -P 8 0 512"
: >data.raw
qcow2 qcow2-datafile 32k cluster_size=512,data_file=data.raw \
    "write -P 9 0 512"
qcow2 qcow2-empty 1M cluster_size=4k
qcow2 qcow2-prealloc 8k cluster_size=512,preallocation=metadata
seq 2000 | head -c 4096 >raw-random
printf 'some raw bytes\n' >raw-small
: >raw-empty
for fmt in vmdk vdi vpc vhdx qed parallels qcow luks; do
    extra=()
    case $fmt in
    luks) extra=(--object secret,id=s0,data=x -o key-secret=s0,iter-time=10) ;;
    esac
    img create -f $fmt "${extra[@]}" "$WORK/full.$fmt" 64k
    head -c 4096 "$WORK/full.$fmt" >"foreign-$fmt"
done

# whole images of the other formats blkimg writes (empty: with data, a
# vdi holds 1 MiB blocks and a vpc 2 MiB ones)
img create -f vdi vdi-empty 64k
img create -f vpc vpc-empty 64k

for t in open check write; do
    rm -rf "${OUT:?}/$t"
    mkdir -p "$OUT/$t"
    cp qcow2-* raw-* vdi-empty vpc-empty "$OUT/$t/"
done
cp foreign-* "$OUT/open/"

rm -rf "${OUT:?}/parse"
mkdir -p "$OUT/parse"
n=0
while IFS= read -r line; do
    n=$((n + 1))
    printf '%s' "$line" >"$OUT/parse/seed-$(printf %02d $n)"
done <<'SEEDS'
1G
0x10k
1.5M
18446744073709551615
-1
cluster_size=64k,compat=v2,lazy_refcounts
backing_file=a,,b.img,backing_fmt=qcow2,nofoo
json:{"driver": "qcow2", "file": {"driver": "file", "filename": "a.img"}}
{"a": [1, -2, true, false, "x\u00e9\ud83d\ude00"], "b": {"c": 18446744073709551615}}
nbd://localhost:10809/export
nbd+unix:///disk?socket=/run/nbd.sock
nbds://[::1]:10809/e?tls-creds=tls0
nbd:unix:/tmp/s:exportname=x
nbd:example.org:10809:exportname=y
SEEDS
echo "corpora written to $OUT"
