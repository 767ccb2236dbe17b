#!/bin/bash
# SPDX-License-Identifier: MIT
#
# convert over NBD, blkimg vs qemu-img (and nbdcopy), on bench 7's 2 GiB
# qcow2 about half allocated with random data:
#   qcow2 -> NBD export: convert -n into qemu-nbd serving a raw file (made
#       empty again before every run)
#   NBD -> local raw: qemu-nbd -r serving the source's raw copy (it allows
#       multi-conn: nbdcopy and blkimg use several connections), also
#       nbdcopy
# Servers run on Unix sockets in BENCH_DIR and are killed by PID. Runs are
# interleaved (the order alternating), caches dropped before each, medians
# reported; every output blkimg writes is checked with qemu-img compare.
# Goals: wall <= 0.7x qemu-img in both directions; NBD -> raw >= 1.0x
# nbdcopy's speed (wall <= 1.0x nbdcopy's).
set -uo pipefail
BENCH_NAME="nbd"
. "$(dirname "$0")/lib.sh"

title "10. convert over NBD: blkimg vs qemu-img vs nbdcopy (2 GiB qcow2, half allocated)"
need_tools
command -v qemu-img >/dev/null || skip "qemu-img missing"
command -v qemu-nbd >/dev/null || skip "qemu-nbd missing"

SRC_Q="$BENCH_DIR/half2g.qcow2"
SRC_R="$BENCH_DIR/half2g.raw"
EXP="$BENCH_DIR/nbd-export.raw"
OUT="$BENCH_DIR/nbd-out.raw"
SOCK="$BENCH_DIR/nbd.sock"
src_mib=$(quick 512 2048)
NBDCOPY=$(command -v nbdcopy || true)

ensure_half_qcow2 "$SRC_Q" "$src_mib" || skip "qemu-img convert failed"
if [ ! -f "$SRC_R" ] || [ "$(stat -c %s "$SRC_R")" -ne $((src_mib << 20)) ]; then
    rm -f "$SRC_R"
    qemu-img convert -f qcow2 -O raw "$SRC_Q" "$SRC_R" || skip "qemu-img convert failed"
fi

SERVER_PID=
# serve FILE [QEMU-NBD OPTIONS...]: qemu-nbd on $SOCK, export "exp".
serve() {
    local file=$1 i
    shift
    stop_server
    rm -f "$SOCK"
    qemu-nbd -t -e 8 -f raw -x exp -k "$SOCK" "$@" "$file" </dev/null \
        >/dev/null 2>&1 &
    SERVER_PID=$!
    for ((i = 0; i < 500; i++)); do
        [ -S "$SOCK" ] && return 0
        sleep 0.01
    done
    echo "  qemu-nbd did not start" >&2
}
stop_server() {
    if [ -n "$SERVER_PID" ]; then
        kill "$SERVER_PID" 2>/dev/null
        wait "$SERVER_PID" 2>/dev/null
        SERVER_PID=
    fi
}
trap 'stop_server; rm -f "$EXP" "$OUT" "$SOCK"' EXIT
URL="nbd+unix:///exp?socket=$SOCK"

# fresh_export: an empty sparse export of the source's size, served.
fresh_export() {
    stop_server
    rm -f "$EXP"
    truncate -s $((src_mib << 20)) "$EXP"
    serve "$EXP"
}

# one_run DIRECTION TOOL: one timed run; sets WALL to its wall seconds (""
# on a failure). Not in a subshell: the server it starts is stopped by PID.
one_run() {
    local dir=$1 tool=$2 t
    if [ "$dir" = to ]; then
        fresh_export
        drop_caches
        timed t "$tool" convert -n -f qcow2 -O raw "$SRC_Q" "$URL"
    else
        rm -f "$OUT"
        drop_caches
        if [ "$tool" = nbdcopy ]; then
            timed t "$NBDCOPY" "$URL" "$OUT"
        else
            timed t "$tool" convert -f raw -O raw "$URL" "$OUT"
        fi
    fi
    WALL=${t%% *}
}

check_output() {
    local dir=$1
    if [ "$dir" = to ]; then
        qemu-img compare -q -f qcow2 -F raw "$SRC_Q" "$URL" >/dev/null 2>&1
    else
        qemu-img compare -q -f raw -F raw "$SRC_R" "$OUT" >/dev/null 2>&1
    fi
}

note "source: $SRC_Q ($src_mib MiB virtual); $((BENCH_REPS * 2 - 1)) interleaved run(s) per tool, medians, caches dropped before each run"
printf '  %-22s | %8s %8s %6s | %8s %6s | %s\n' "case" "wall s" "qemu" "ratio" "nbdcopy" "ratio" "blkimg output"

for dir in to from; do
    if [ "$dir" = from ]; then
        serve "$SRC_R" -r
        label="NBD -> local raw"
    else
        label="qcow2 -> NBD export"
    fi
    tools=("$BLKIMG" qemu-img)
    [ "$dir" = from ] && [ -n "$NBDCOPY" ] && tools+=(nbdcopy)
    bw=() qw=() nw=()
    OK=ok
    for ((i = 0; i < BENCH_REPS * 2 - 1; i++)); do
        order=("${tools[@]}")
        if ((i % 2)); then
            order=()
            for ((k = ${#tools[@]} - 1; k >= 0; k--)); do order+=("${tools[k]}"); done
        fi
        for tool in "${order[@]}"; do
            one_run "$dir" "$tool"
            w=$WALL
            if [ -z "$w" ]; then
                [ "$tool" = "$BLKIMG" ] && OK="convert FAILED"
                continue
            fi
            case "$tool" in
            "$BLKIMG")
                bw+=("$w")
                if [ "$i" -eq 0 ] && ! check_output "$dir"; then
                    OK="qemu-img compare: DIFFERENT"
                fi
                ;;
            qemu-img) qw+=("$w") ;;
            nbdcopy) nw+=("$w") ;;
            esac
        done
    done
    stop_server
    BW=- QW=- NW=-
    [ ${#bw[@]} -gt 0 ] && BW=$(median "${bw[@]}")
    [ ${#qw[@]} -gt 0 ] && QW=$(median "${qw[@]}")
    [ ${#nw[@]} -gt 0 ] && NW=$(median "${nw[@]}")
    rq=$(ratio "$BW" "$QW")
    rn=$(ratio "$BW" "$NW")
    printf '  %-22s | %8s %8s %6s | %8s %6s | %s\n' "$label" "$(fmt "$BW" 2)" \
        "$(fmt "$QW" 2)" "$rq" "$(fmt "$NW" 2)" "$rn" "$OK"
    result "$label" qemu-img "wall s" "$BW" "$QW" "$rq" "<=" 0.7
    line="wall $rq x qemu-img (goal <= 0.7: $(verdict "$rq" "<=" 0.7))"
    if [ "$dir" = from ]; then
        if [ -n "$NBDCOPY" ]; then
            result "$label" nbdcopy "wall s" "$BW" "$NW" "$rn" "<=" 1.0
            line="$line, $rn x nbdcopy (goal <= 1.0: $(verdict "$rn" "<=" 1.0))"
        else
            line="$line, nbdcopy missing"
        fi
    fi
    summary "nbd $label" "$line; output $OK"
done
note "ratios are blkimg's wall time / the other's (lower is better)"
