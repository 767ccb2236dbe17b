#!/bin/bash
# SPDX-License-Identifier: MIT
#
# compare, blkimg vs qemu-img: bench 7's 2 GiB half-allocated qcow2 against
# its raw conversion (identical content, so the whole image is walked and
# every allocated byte read from both), default cache and -T none; runs
# interleaved, caches dropped before each; wall time and CPU time.
set -uo pipefail
BENCH_NAME="compare"
. "$(dirname "$0")/lib.sh"

title "9. compare: blkimg vs qemu-img (2 GiB qcow2 vs its raw copy)"
need_tools
command -v qemu-img >/dev/null || skip "qemu-img missing"
has_subcommand compare || skip "blkimg compare not available"

Q="$BENCH_DIR/half2g.qcow2"
R="$BENCH_DIR/half2g-compare.raw"
mib=$(quick 512 2048)
ensure_half_qcow2 "$Q" "$mib" || skip "qemu-img convert failed"
qemu-img convert -f qcow2 -O raw "$Q" "$R" || skip "qemu-img convert failed"

reps=$((BENCH_REPS * 2 - 1))
note "$reps interleaved runs per case (median)"
printf '  %-24s | %8s %8s %6s | %8s %8s %6s | %s\n' case "wall s" qemu ratio "cpu s" qemu ratio "blkimg output"
for opts in "" "-T none"; do
    declare -a bw=() bc=() qw=() qc=()
    out=ok
    for ((i = 0; i < reps; i++)); do
        order=("$BLKIMG" qemu-img)
        ((i % 2)) && order=(qemu-img "$BLKIMG")
        for tool in "${order[@]}"; do
            drop_caches
            # shellcheck disable=SC2086
            timed t "$tool" compare $opts -f qcow2 -F raw "$Q" "$R"
            [ -n "$t" ] || { out="compare FAILED"; continue; }
            read -r w u s _ <<<"$t"
            c=$(awk -v u="$u" -v s="$s" 'BEGIN{print u + s}')
            if [ "$tool" = qemu-img ]; then
                qw+=("$w") qc+=("$c")
            else
                bw+=("$w") bc+=("$c")
                grep -qx "Images are identical." "$BENCH_DIR/last.out" ||
                    out="unexpected output: $(head -n 1 "$BENCH_DIR/last.out")"
            fi
        done
    done
    BW=- BC=- QW=- QC=-
    [ ${#bw[@]} -gt 0 ] && BW=$(median "${bw[@]}") BC=$(median "${bc[@]}")
    [ ${#qw[@]} -gt 0 ] && QW=$(median "${qw[@]}") QC=$(median "${qc[@]}")
    label="compare ${opts:-(default cache)}"
    rw=$(ratio "$BW" "$QW")
    rc=$(ratio "$BC" "$QC")
    printf '  %-24s | %8s %8s %6s | %8s %8s %6s | %s\n' "$label" \
        "$(fmt "$BW" 2)" "$(fmt "$QW" 2)" "$rw" "$(fmt "$BC" 2)" "$(fmt "$QC" 2)" "$rc" "$out"
    result "$label" qemu-img "wall s" "$BW" "$QW" "$rw" - -
    result "$label" qemu-img "CPU s" "$BC" "$QC" "$rc" - -
    summary "$label" "wall $rw, CPU $rc (blkimg / qemu-img); output $out"
    unset bw bc qw qc
done
rm -f "$R"
