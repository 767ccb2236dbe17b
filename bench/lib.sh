# SPDX-License-Identifier: MIT
# shellcheck shell=bash
#
# Helpers shared by the benchmark scripts (sourced, not run).
#
# Environment:
#   BLKIMG_BUILD   build directory with blkimg and blkimg-io (default build)
#   BENCH_DIR      scratch directory on a real disk (default
#                  /var/tmp/blkimg-bench); files there are reused between
#                  benchmarks of one run and removed at the end
#   BENCH_REPS     repetitions per measurement (default 3; the median counts)
#   BENCH_QUICK=1  smaller counts, one repetition (to try the scripts)
#   BENCH_SUMMARY  file collecting one line per headline ratio (run.sh)
#   BENCH_RESULTS  file recording every ratio measured (`title` and
#                  `result` records, read by bench/chart.py; run.sh keeps
#                  it beside the report and the charts)

BENCH_LIB_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$BENCH_LIB_DIR/.." && pwd)
BUILD=${BLKIMG_BUILD:-build}
case "$BUILD" in
/*) ;;
*) BUILD="$REPO/$BUILD" ;;
esac
BLKIMG="$BUILD/blkimg"
BLKIMG_IO="$BUILD/blkimg-io"
DIO_ALIGN="$BUILD/bench/dio_align"
BENCH_DIR=${BENCH_DIR:-/var/tmp/blkimg-bench}
BENCH_QUICK=${BENCH_QUICK:-0}
if [ "$BENCH_QUICK" = 1 ]; then
    BENCH_REPS=${BENCH_REPS:-1}
else
    BENCH_REPS=${BENCH_REPS:-3}
fi
PY=/usr/bin/python3
[ -x "$PY" ] || PY=python3
TIME=/usr/bin/time

mkdir -p "$BENCH_DIR"

# quick VALUE_QUICK VALUE_FULL: picks by BENCH_QUICK.
quick() {
    if [ "$BENCH_QUICK" = 1 ]; then echo "$1"; else echo "$2"; fi
}

# The benchmark's group in the recorded results: its script's name.
BENCH_GROUP=${BENCH_GROUP:-$(basename "$0" .sh)}

# record FIELD...: one tab-separated record in $BENCH_RESULTS (if set).
record() {
    if [ -n "${BENCH_RESULTS:-}" ]; then
        local IFS=$'\t'
        printf '%s\n' "$*" >>"$BENCH_RESULTS"
    fi
}

title() {
    echo
    echo "=== $* ==="
    record title "$BENCH_GROUP" "$*"
}

# result CASE REFERENCE METRIC BLKIMG REF RATIO GOAL_OP GOAL: records one
# measured ratio for the charts: blkimg's value of METRIC for CASE, the
# reference tool's, RATIO = BLKIMG / REF, and the goal (GOAL_OP ">=" or
# "<=", or "-" "-" without one). A missing value is "-".
result() {
    record result "$BENCH_GROUP" "$1" "$2" "$3" "${4:--}" "${5:--}" \
        "${6:--}" "${7:--}" "${8:--}"
}

note() {
    echo "  $*"
}

# skip REASON: prints the standard skip line and ends the benchmark.
skip() {
    echo "  skipped: $*"
    summary "$BENCH_NAME" "skipped: $*"
    exit 0
}

# summary NAME TEXT: one line for run.sh's closing table.
summary() {
    if [ -n "${BENCH_SUMMARY:-}" ]; then
        printf '%s\t%s\n' "$1" "$2" >>"$BENCH_SUMMARY"
    fi
}

need_tools() {
    [ -x "$BLKIMG" ] || skip "$BLKIMG not built"
    [ -x "$BLKIMG_IO" ] || skip "$BLKIMG_IO not built"
}

# has_subcommand NAME: does this blkimg know the subcommand? (qemu-img says
# "Command not found: NAME" for unknown ones; any other answer, including a
# usage error for missing arguments, means it exists.)
has_subcommand() {
    local out
    out=$("$BLKIMG" "$1" </dev/null 2>&1)
    local rc=$?
    if [ $rc -eq 0 ]; then
        return 0
    fi
    if echo "$out" | grep -qiE "command not found|unknown (sub)?command|invalid command|not implemented|not supported"; then
        return 1
    fi
    return 0
}

# has_bench_option OPTION FILE: does `blkimg bench OPTION` run on FILE?
has_bench_option() {
    "$BLKIMG" bench "$1" -c 1 -f raw -q "$2" </dev/null >/dev/null 2>&1
}

drop_caches() {
    sync
    echo 3 >/proc/sys/vm/drop_caches 2>/dev/null || true
}

# median V...: the median of numbers.
median() {
    printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {
        if (NR == 0) { print "nan"; exit }
        if (NR % 2) print a[(NR + 1) / 2];
        else printf "%.6g\n", (a[NR / 2] + a[NR / 2 + 1]) / 2 }'
}

# ratio A B: A/B with two decimals ("-" when either is missing or B is 0).
# peak_mib KIB...: the largest of the peak RSS figures (KiB, as
# /usr/bin/time's %M) in MiB with one decimal.
peak_mib() {
    awk -v k="$(printf '%s\n' "$@" | sort -g | tail -n 1)" 'BEGIN{printf "%.1f", k / 1024}'
}

ratio() {
    awk -v a="$1" -v b="$2" 'BEGIN {
        if (a == "" || b == "" || a == "-" || b == "-" || b + 0 == 0)
            print "-";
        else printf "%.2f\n", a / b }'
}

# fmt NUMBER [DECIMALS]
fmt() {
    awk -v a="$1" -v d="${2:-0}" 'BEGIN {
        if (a == "" || a == "-") print "-"; else printf "%.*f\n", d, a }'
}

# verdict VALUE OP GOAL: "met" / "NOT met" (OP is >= or <=).
verdict() {
    awk -v v="$1" -v op="$2" -v g="$3" 'BEGIN {
        if (v == "-" || v == "") { print "n/a"; exit }
        ok = (op == ">=") ? (v + 0 >= g + 0) : (v + 0 <= g + 0);
        print ok ? "met" : "NOT met" }'
}

# bench_seconds CMD...: runs a `qemu-img bench`-style command and prints
# the seconds from its "Run completed in N seconds." line (empty on
# failure; the command's output goes to $BENCH_DIR/last.out).
bench_seconds() {
    if ! "$@" </dev/null >"$BENCH_DIR/last.out" 2>&1; then
        echo "  command failed: $*" >&2
        sed 's/^/    /' "$BENCH_DIR/last.out" | head -n 5 >&2
        return 0
    fi
    sed -n 's/^Run completed in \([0-9.]*\) seconds\.$/\1/p' \
        "$BENCH_DIR/last.out" | tail -n 1
}

# timed OUTVAR CMD...: runs CMD under /usr/bin/time; sets OUTVAR to
# "wall user sys maxrss_kib" ("" on failure).
timed() {
    local __var=$1
    shift
    local tf="$BENCH_DIR/time.out"
    if "$TIME" -f '%e %U %S %M' -o "$tf" "$@" </dev/null \
        >"$BENCH_DIR/last.out" 2>&1; then
        printf -v "$__var" '%s' "$(tail -n 1 "$tf")"
    else
        echo "  command failed: $*" >&2
        sed 's/^/    /' "$BENCH_DIR/last.out" | tail -n 5 >&2
        printf -v "$__var" '%s' ""
    fi
}

# timed_retry OUTVAR DST CMD...: timed, DST removed and caches dropped
# first; a run that fails for qemu-img 7.2's PBKDF2 timing ("Unable to
# get accurate CPU usage", its sanity check on a loaded machine) is tried
# again, up to five times, after a pause that grows.
timed_retry() {
    local __out=$1 dst=$2 try
    shift 2
    for try in 1 2 3 4 5; do
        [ "$try" -gt 1 ] && sleep "0.$((try * 2))"
        rm -f "$dst"
        drop_caches
        timed "$__out" "$@" 2>/dev/null
        [ -n "${!__out}" ] && return
        grep -q "Unable to get accurate CPU usage" "$BENCH_DIR/last.out" ||
            break
    done
    echo "  command failed: $*" >&2
    sed 's/^/    /' "$BENCH_DIR/last.out" | tail -n 5 >&2
}

# convert_pair REPS VERIFY ARGS...: `blkimg convert ARGS` and `qemu-img
# convert ARGS` interleaved, REPS runs each, the order alternating (the
# shared disk drifts too much for back-to-back series), caches dropped
# before each run. The last of ARGS is the target, removed before each
# run and at the end. VERIFY is a command (words, no quoting) run after
# blkimg's first run, or "-": its failure message, if it prints one,
# becomes OK. Sets BW BC BM (blkimg's median wall s, median CPU s
# user+sys, peak RSS MiB), QW QC QM (qemu-img's) and OK ("ok" or what
# failed). PAIR_PREP, when set, is a command run before each run (an RBD
# target made empty again, say).
convert_pair() {
    local reps=$1 verify=$2 i tool t w u s m v
    shift 2
    local dst=${!#} bw=() bc=() bm=() qw=() qc=() qm=()
    OK=ok
    for ((i = 0; i < reps; i++)); do
        local order=("$BLKIMG" qemu-img)
        ((i % 2)) && order=(qemu-img "$BLKIMG")
        for tool in "${order[@]}"; do
            [ -n "${PAIR_PREP:-}" ] && $PAIR_PREP
            timed_retry t "$dst" "$tool" convert "$@"
            if [ -z "$t" ]; then
                OK="convert FAILED"
                continue
            fi
            read -r w u s m <<<"$t"
            if [ "$tool" = qemu-img ]; then
                qw+=("$w") qc+=("$(awk -v u="$u" -v s="$s" 'BEGIN{print u + s}')") qm+=("$m")
                continue
            fi
            bw+=("$w") bc+=("$(awk -v u="$u" -v s="$s" 'BEGIN{print u + s}')") bm+=("$m")
            if [ "$i" -eq 0 ] && [ "$verify" != - ]; then
                # shellcheck disable=SC2086
                v=$($verify)
                [ -n "$v" ] && OK=$v
            fi
        done
    done
    rm -f "$dst"
    pair_summary
}

# pair_summary: from the caller's arrays bw bc bm (blkimg's wall s, CPU s,
# max RSS KiB per run) and qw qc qm (qemu-img's), sets BW BC BM QW QC QM
# (medians, peak RSS in MiB; "-" where a tool has no run).
pair_summary() {
    BW=- BC=- BM=- QW=- QC=- QM=-
    if [ ${#bw[@]} -gt 0 ]; then
        BW=$(median "${bw[@]}") BC=$(median "${bc[@]}")
        BM=$(peak_mib "${bm[@]}")
    fi
    if [ ${#qw[@]} -gt 0 ]; then
        QW=$(median "${qw[@]}") QC=$(median "${qc[@]}")
        QM=$(peak_mib "${qm[@]}")
    fi
}

# verify_copy SFMT SRC TFMT DST: prints what is wrong with a converted
# image (nothing when qemu-img compare finds it identical and, for the
# formats qemu-img checks, qemu-img check finds it clean).
verify_copy() {
    if ! qemu-img compare -q -f "$1" -F "$3" "$2" "$4" >/dev/null 2>&1; then
        echo "qemu-img compare: DIFFERENT"
    elif [ "$3" != raw ] && [ "$3" != vpc ] &&
        ! qemu-img check -q -f "$3" "$4" >/dev/null 2>&1; then
        echo "qemu-img check FAILED"
    fi
}

# ensure_random_raw FILE SIZE_MIB: a fully allocated raw file of random data
# (reused when it already exists with the right size).
ensure_random_raw() {
    local f=$1 mib=$2
    if [ -f "$f" ] && [ "$(stat -c %s "$f")" -eq $((mib * 1048576)) ]; then
        return 0
    fi
    rm -f "$f"
    note "creating $f ($mib MiB of random data)"
    fio --name=fill --filename="$f" --size="${mib}M" --rw=write --bs=1M \
        --direct=1 --ioengine=psync --refill_buffers --randrepeat=0 \
        --output=/dev/null
}

# half_random_raw FILE SIZE_MIB SEED: a sparse raw file about half of which
# is random data, in runs of 64 KiB .. 4 MiB alternating at random with
# holes (the same file for the same seed).
half_random_raw() {
    "$PY" - "$1" "$2" "$3" <<'PYEOF'
import os, random, sys
path, mib, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
r = random.Random(seed)
with open(path, "wb") as f:
    f.truncate(mib << 20)
    off = 0
    while off < mib << 20:
        n = min(r.choice([1, 2, 4, 8, 16, 32, 64]) << 16, (mib << 20) - off)
        if r.random() < 0.5:
            f.seek(off)
            f.write(os.urandom(n))
        off += n
PYEOF
}

# ensure_half_qcow2 FILE SIZE_MIB: the convert source of bench 7 and the
# compare input of bench 9, a qcow2 (qemu-img convert, 64 KiB clusters)
# of half_random_raw's file, reused when it has the right size.
ensure_half_qcow2() {
    local f=$1 mib=$2
    if [ -f "$f" ] && [ "$(qemu-img info --output=json "$f" 2>/dev/null |
        "$PY" -c 'import json,sys; print(json.load(sys.stdin)["virtual-size"])' 2>/dev/null)" = $((mib * 1048576)) ]; then
        return 0
    fi
    note "creating $f ($mib MiB, about half allocated with random data)"
    rm -f "$f" "$f.raw"
    half_random_raw "$f.raw" "$mib" 7 &&
        qemu-img convert -f raw -O qcow2 "$f.raw" "$f"
    local rc=$?
    rm -f "$f.raw"
    return $rc
}
