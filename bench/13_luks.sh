#!/bin/bash
# SPDX-License-Identifier: MIT
#
# Encrypted images (issue 13), blkimg vs qemu-img side by side, with
# aes-256-xts-plain64 (QEMU's default LUKS cipher):
#
# - convert a qcow2+LUKS image about half allocated with random data
#   (BENCH_LUKS_MIB, default 2048 MiB; 512 with BENCH_QUICK=1) to plain
#   raw, and the plain raw back to qcow2+LUKS, with -t none -T none and
#   with the default cache modes: goal wall <= 0.7x qemu-img;
# - blkimg's CPU per byte of encrypted data in those converts, net of
#   what does not grow with the data (start-up, key derivation: the CPU
#   of the same convert of an image with no data), against libgcrypt's
#   own AES-256-XTS speed here (bench/xts_speed: 512-byte sectors,
#   plain64 IVs, one thread): goal within 1.2x;
# - 4 KiB random reads at QD32 (blkimg bench --random -t none) on a raw
#   LUKS image against the same reads on the plain raw image it was made
#   from: goal >= 0.9x. (qemu-img 7.2's bench takes no --object and so
#   cannot open an encrypted image.)
#
# Every output blkimg writes is checked with `qemu-img compare` against
# the source (and `qemu-img check` for qcow2). The encrypted sources are
# made by blkimg with iter-time=10, so that unlocking one costs both tools
# the same 10 ms of PBKDF2 and the data decides the figures (qemu-img 7.2
# times PBKDF2 by the thread's CPU clock, and on a loaded machine it
# writes ten times the iterations asked for). Creating an encrypted image
# costs qemu-img at least half a second of PBKDF2 timing, blkimg 100 ms:
# that difference is in the raw->qcow2+luks figures, as a user meets it.
set -uo pipefail
BENCH_NAME="luks"
. "$(dirname "$0")/lib.sh"

src_mib=${BENCH_LUKS_MIB:-$(quick 512 2048)}
title "13. encrypted images: blkimg vs qemu-img ($src_mib MiB qcow2+LUKS aes-256-xts-plain64, half allocated)"
need_tools
command -v qemu-img >/dev/null || skip "qemu-img missing"
has_subcommand convert || skip "blkimg convert not available"
XTS_SPEED="$BUILD/bench/xts_speed"
[ -x "$XTS_SPEED" ] || skip "$XTS_SPEED not built (make bench-tools)"

SEC="secret,id=s0,data=bench-passphrase"
ENC="encrypt.format=luks,encrypt.key-secret=s0,encrypt.cipher-alg=aes-256,encrypt.cipher-mode=xts,encrypt.ivgen-alg=plain64,encrypt.iter-time=10"
RAW="$BENCH_DIR/luks-half.raw"
SRC="$BENCH_DIR/luks-half.qcow2"
DST="$BENCH_DIR/luks.out"
EMPTY_Q="$BENCH_DIR/luks-empty.qcow2"
EMPTY_RAW="$BENCH_DIR/luks-empty.raw"
SRC_OPTS="driver=qcow2,encrypt.key-secret=s0,file.filename=$SRC"

if [ ! -f "$RAW" ] || [ "$(stat -c %s "$RAW")" -ne $((src_mib << 20)) ]; then
    note "creating $RAW ($src_mib MiB, about half allocated with random data)"
    rm -f "$RAW" "$SRC" "$EMPTY_Q" "$EMPTY_RAW"
    half_random_raw "$RAW" "$src_mib" 13 || skip "cannot write $RAW"
fi
if [ ! -f "$SRC" ]; then
    note "creating $SRC (blkimg convert -O qcow2 -o $ENC)"
    "$BLKIMG" convert --object "$SEC" -f raw -O qcow2 -o "$ENC" "$RAW" \
        "$SRC" || skip "blkimg convert to qcow2+LUKS failed"
    qemu-img compare -q --object "$SEC" --image-opts \
        "driver=raw,file.filename=$RAW" "$SRC_OPTS" ||
        skip "qemu-img compare: $SRC differs from $RAW"
fi
if [ ! -f "$EMPTY_Q" ]; then
    "$BLKIMG" create -q --object "$SEC" -f qcow2 -o "$ENC" "$EMPTY_Q" \
        "${src_mib}M" || skip "blkimg create failed"
    truncate -s "${src_mib}M" "$EMPTY_RAW"
fi
sync
alloc=$(($(stat -c %b "$RAW") * 512 >> 20))
speeds=$("$XTS_SPEED" 256)
dec_speed=$(awk '$1 == "decrypt" {print $2}' <<<"$speeds")
enc_speed=$(awk '$1 == "encrypt" {print $2}' <<<"$speeds")
note "source: $SRC, $src_mib MiB virtual, $alloc MiB of it encrypted data; $((BENCH_REPS * 2 - 1)) interleaved run(s) each (median; default cache: $((BENCH_REPS * 3))), caches dropped before each run"
note "libgcrypt AES-256-XTS here (512-byte sectors, one thread, best of 3): decrypt $dec_speed MiB/s, encrypt $enc_speed MiB/s of CPU"

# verify_from_luks: the plain copy of SRC, compared by qemu-img.
verify_from_luks() {
    qemu-img compare -q --object "$SEC" --image-opts "$SRC_OPTS" \
        "driver=raw,file.filename=$DST" >/dev/null 2>&1 ||
        echo "qemu-img compare: DIFFERENT"
}

# verify_to_luks: the encrypted copy of RAW, compared and checked.
verify_to_luks() {
    local dst="driver=qcow2,encrypt.key-secret=s0,file.filename=$DST"
    if ! qemu-img compare -q --object "$SEC" --image-opts \
        "driver=raw,file.filename=$RAW" "$dst" >/dev/null 2>&1; then
        echo "qemu-img compare: DIFFERENT"
    elif ! qemu-img check -q --object "$SEC" --image-opts "$dst" \
        >/dev/null 2>&1; then
        echo "qemu-img check FAILED"
    elif ! qemu-img info "$DST" | grep -q "encrypted: yes"; then
        echo "not encrypted"
    fi
}

# fixed_cpu REPS CONVERT_ARGS...: blkimg's median CPU s for a convert of
# an image with no data (the last argument is the target).
fixed_cpu() {
    local reps=$1 i t w u s m c=()
    shift
    for ((i = 0; i < reps; i++)); do
        timed_retry t "${!#}" "$BLKIMG" convert "$@"
        [ -n "$t" ] || continue
        read -r w u s m <<<"$t"
        c+=("$(awk -v u="$u" -v s="$s" 'BEGIN{print u + s}')")
    done
    rm -f "${!#}"
    if [ ${#c[@]} -gt 0 ]; then median "${c[@]}"; else echo -; fi
}

# measure LABEL REPS SPEED FIXED_CPU VERIFY CONVERT_ARGS...: one row: wall
# against qemu-img, and blkimg's CPU beyond FIXED_CPU per encrypted byte
# against SPEED (MiB/s).
measure() {
    local label=$1 reps=$2 speed=$3 fcpu=$4 verify=$5 rw rc extra
    shift 5
    convert_pair "$reps" "$verify" "$@"
    rw=$(ratio "$BW" "$QW")
    extra=$(awk -v c="$BC" -v p="$fcpu" 'BEGIN {
        if (c == "-" || p == "-") print "-"; else printf "%.3f", c - p }')
    # the added CPU per MiB, as a multiple of the cipher's own
    rc=$(awk -v c="$extra" -v a="$alloc" -v s="$speed" 'BEGIN {
        if (c == "-" || a == 0) print "-"; else printf "%.2f", c * s / a }')
    printf '  %-34s | %7s %7s %5s | %7s %7s %7s | %5s | %6s | %s\n' \
        "$label" "$(fmt "$BW" 2)" "$(fmt "$QW" 2)" "$rw" "$(fmt "$BC" 2)" \
        "$(fmt "$QC" 2)" "$(fmt "$fcpu" 2)" "$rc" "$BM" "$OK"
    result "$label" qemu-img "wall s" "$BW" "$QW" "$rw" "<=" 0.7
    result "$label" "libgcrypt AES-XTS" "CPU s for the data" \
        "$extra" \
        "$(awk -v a="$alloc" -v s="$speed" 'BEGIN{printf "%.3f", a / s}')" \
        "$rc" "<=" 1.2
    summary "luks $label" "wall $rw (goal <= 0.7: $(verdict "$rw" "<=" 0.7)), CPU/byte $rc x libgcrypt's (goal <= 1.2: $(verdict "$rc" "<=" 1.2)); output $OK"
}

reps=$((BENCH_REPS * 2 - 1))
dreps=$((BENCH_REPS * 3))
note "blkimg's CPU for the same converts of images with no data (the 'fixed' column) is measured first"
P="$BENCH_DIR/luks-fixed.out"
E_OPTS="driver=qcow2,encrypt.key-secret=s0,file.filename=$EMPTY_Q"
f_dec_none=$(fixed_cpu "$reps" --object "$SEC" -t none -T none \
    --image-opts "$E_OPTS" -O raw "$P")
f_dec_def=$(fixed_cpu "$reps" --object "$SEC" --image-opts "$E_OPTS" \
    -O raw "$P")
f_enc_none=$(fixed_cpu "$reps" --object "$SEC" -t none -T none -f raw \
    -O qcow2 -o "$ENC" "$EMPTY_RAW" "$P")
f_enc_def=$(fixed_cpu "$reps" --object "$SEC" -f raw -O qcow2 -o "$ENC" \
    "$EMPTY_RAW" "$P")
printf '  %-34s | %7s %7s %5s | %7s %7s %7s | %5s | %6s | %s\n' case \
    "wall s" qemu ratio "cpu s" qemu fixed "xts x" "RSS" "blkimg output"
measure "qcow2+luks->raw -t none -T none" "$reps" "$dec_speed" \
    "$f_dec_none" verify_from_luks --object "$SEC" -t none -T none --image-opts \
    "$SRC_OPTS" -O raw "$DST"
measure "qcow2+luks->raw default cache" "$dreps" "$dec_speed" \
    "$f_dec_def" verify_from_luks --object "$SEC" --image-opts "$SRC_OPTS" -O raw "$DST"
measure "raw->qcow2+luks -t none -T none" "$reps" "$enc_speed" \
    "$f_enc_none" verify_to_luks --object "$SEC" -t none -T none -f raw -O qcow2 -o "$ENC" \
    "$RAW" "$DST"
measure "raw->qcow2+luks default cache" "$dreps" "$enc_speed" \
    "$f_enc_def" verify_to_luks --object "$SEC" -f raw -O qcow2 -o "$ENC" "$RAW" "$DST"
note "wall ratios are blkimg / qemu-img (lower is better); 'xts x' is blkimg's CPU for the data (cpu s - fixed) per encrypted byte over libgcrypt's own (1.0: the cipher's cost and nothing more)"

# 4 KiB random reads, QD32, O_DIRECT: raw LUKS vs the plain raw file.
PLAIN="$BENCH_DIR/raw1g.img"
LUKS="$BENCH_DIR/raw1g.luks"
ensure_random_raw "$PLAIN" 1024
if [ ! -f "$LUKS" ]; then
    note "creating $LUKS (blkimg convert -O luks of $PLAIN)"
    "$BLKIMG" convert --object "$SEC" -f raw -O luks \
        -o key-secret=s0,iter-time=10 "$PLAIN" "$LUKS" ||
        skip "blkimg convert to luks failed"
    sync
fi
count=$(quick 20000 100000)
iops_of() { # COUNT SECONDS
    awk -v c="$1" -v t="$2" 'BEGIN{ if (t == "" || t + 0 == 0) print "-"; else printf "%.0f", c / t }'
}
common=(-t none -d 32 -s 4096 -c "$count" --random)
lv=() pv=()
for ((i = 0; i < reps; i++)); do
    s=$(bench_seconds "$BLKIMG" bench --object "$SEC" --image-opts \
        "${common[@]}" "driver=luks,key-secret=s0,file.filename=$LUKS")
    [ -n "$s" ] && lv+=("$(iops_of "$count" "$s")")
    s=$(bench_seconds "$BLKIMG" bench -f raw "${common[@]}" "$PLAIN")
    [ -n "$s" ] && pv+=("$(iops_of "$count" "$s")")
done
li=- pi=-
[ ${#lv[@]} -gt 0 ] && li=$(median "${lv[@]}")
[ ${#pv[@]} -gt 0 ] && pi=$(median "${pv[@]}")
rr=$(ratio "$li" "$pi")
echo
printf '  %-34s %10s\n' "4 KiB random reads, QD32, -t none" IOPS
printf '  %-34s %10s\n' "raw LUKS (aes-256-xts-plain64)" "$li" "plain raw" "$pi"
note "LUKS / plain = $rr (goal >= 0.9: $(verdict "$rr" ">=" 0.9)); $reps interleaved runs of $count requests each, median"
result "4 KiB reads QD32 on LUKS" "the same reads on plain raw" IOPS "$li" \
    "$pi" "$rr" ">=" 0.9
summary "luks 4 KiB random reads QD32" "LUKS/plain = $rr (goal >= 0.9: $(verdict "$rr" ">=" 0.9))"
rm -f "$DST"
