#!/bin/bash
# SPDX-License-Identifier: MIT
#
# convert from an http source (issue 11), blkimg vs qemu-img's curl driver,
# both with their default readahead (QEMU's 256 KiB): nginx on 127.0.0.1
# (started here, killed by PID) serves a raw file about half allocated
# with random data (BENCH_HTTP_MIB, default 1024; 256 with BENCH_QUICK=1)
# and a qcow2 of it; each is converted to a local raw file. Goal: wall
# <= 1.0x qemu-img. Every blkimg output is checked with qemu-img compare.
#
# qemu-img 7.2's curl driver hangs now and then (it stops waking some of
# its coroutines; tests/interop/test_http.py meets it too): a run of
# either tool that takes over HTTP_TIMEOUT seconds (60) is killed and
# counted as a hang, not a time, and the hangs are reported.
set -uo pipefail
BENCH_NAME="http"
. "$(dirname "$0")/lib.sh"

src_mib=${BENCH_HTTP_MIB:-$(quick 256 1024)}
HTTP_TIMEOUT=${HTTP_TIMEOUT:-60}
title "14. convert from http: blkimg vs qemu-img's curl driver ($src_mib MiB, half allocated)"
need_tools
command -v qemu-img >/dev/null || skip "qemu-img missing"
command -v nginx >/dev/null || skip "nginx missing"
qemu-img --help 2>/dev/null | grep -qw http ||
    [ -e /usr/lib/x86_64-linux-gnu/qemu/block-curl.so ] ||
    skip "qemu-img has no curl driver (qemu-block-extra)"

WWW="$BENCH_DIR/www"
NG="$BENCH_DIR/nginx"
OUT="$BENCH_DIR/http-out.raw"
mkdir -p "$WWW" "$NG"
if [ ! -f "$WWW/half.raw" ] ||
    [ "$(stat -c %s "$WWW/half.raw")" -ne $((src_mib << 20)) ]; then
    note "creating $WWW/half.raw ($src_mib MiB, about half allocated with random data) and half.qcow2"
    rm -f "$WWW/half.raw" "$WWW/half.qcow2"
    half_random_raw "$WWW/half.raw" "$src_mib" 14 || skip "cannot write the source"
    qemu-img convert -f raw -O qcow2 "$WWW/half.raw" "$WWW/half.qcow2" ||
        skip "qemu-img convert failed"
fi

port=$("$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
cat >"$NG/nginx.conf" <<EOF
daemon off;
master_process off;
$([ "$(id -u)" -eq 0 ] && echo "user root root;")
pid $NG/nginx.pid;
error_log $NG/error.log;
events { worker_connections 256; }
http {
    access_log off;
    client_body_temp_path $NG/t1; proxy_temp_path $NG/t2;
    fastcgi_temp_path $NG/t3; uwsgi_temp_path $NG/t4; scgi_temp_path $NG/t5;
    types { }
    default_type application/octet-stream;
    server { listen 127.0.0.1:$port; root $WWW; }
}
EOF
nginx -c "$NG/nginx.conf" -p "$NG" -e "$NG/error.log" </dev/null >/dev/null 2>&1 &
NGINX_PID=$!
trap 'kill "$NGINX_PID" 2>/dev/null; wait "$NGINX_PID" 2>/dev/null; rm -f "$OUT"' EXIT
for _ in $(seq 50); do
    (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
    sleep 0.1
done
kill -0 "$NGINX_PID" 2>/dev/null || skip "nginx did not start: $(tail -n 1 "$NG/error.log")"
note "nginx on 127.0.0.1:$port (PID $NGINX_PID); $((BENCH_REPS * 2 - 1)) interleaved run(s) per tool (median), caches dropped before each; a run past ${HTTP_TIMEOUT}s is a hang"

# one TOOL URL: one timed convert to $OUT; sets T ("wall cpu" or "") and
# HUNG (1 when it was killed).
one() {
    local t w u s m rc
    rm -f "$OUT"
    drop_caches
    HUNG=0 T=""
    "$TIME" -f '%e %U %S %M' -o "$BENCH_DIR/time.out" \
        timeout -s KILL "$HTTP_TIMEOUT" "$1" convert -O raw "$2" "$OUT" \
        </dev/null >"$BENCH_DIR/last.out" 2>&1
    rc=$?
    if [ "$rc" -eq 137 ] || [ "$rc" -eq 124 ]; then
        HUNG=1
        return
    fi
    [ "$rc" -eq 0 ] || return
    read -r w u s m <"$BENCH_DIR/time.out"
    T="$w $(awk -v u="$u" -v s="$s" 'BEGIN{print u + s}')"
}

printf '  %-22s | %7s %7s %5s | %7s %7s | %5s %5s | %s\n' case "wall s" qemu \
    ratio "cpu s" qemu hangs qhang "blkimg output"
for src in half.raw half.qcow2; do
    url="http://127.0.0.1:$port/$src"
    bw=() bc=() qw=() qc=() bh=0 qh=0 OK=ok
    for ((i = 0; i < BENCH_REPS * 2 - 1; i++)); do
        order=("$BLKIMG" qemu-img)
        ((i % 2)) && order=(qemu-img "$BLKIMG")
        for tool in "${order[@]}"; do
            one "$tool" "$url"
            if [ "$tool" = qemu-img ]; then
                qh=$((qh + HUNG))
                [ -n "$T" ] && read -r w c <<<"$T" && qw+=("$w") qc+=("$c")
                continue
            fi
            bh=$((bh + HUNG))
            if [ -z "$T" ]; then
                OK="convert FAILED"
                continue
            fi
            read -r w c <<<"$T"
            bw+=("$w") bc+=("$c")
            if [ "$i" -eq 0 ] && ! qemu-img compare -q -F raw "$WWW/$src" \
                "$OUT" >/dev/null 2>&1; then
                OK="qemu-img compare: DIFFERENT"
            fi
        done
    done
    BW=- BC=- QW=- QC=-
    [ ${#bw[@]} -gt 0 ] && BW=$(median "${bw[@]}") BC=$(median "${bc[@]}")
    [ ${#qw[@]} -gt 0 ] && QW=$(median "${qw[@]}") QC=$(median "${qc[@]}")
    rw=$(ratio "$BW" "$QW")
    printf '  %-22s | %7s %7s %5s | %7s %7s | %5s %5s | %s\n' "http $src -> raw" \
        "$(fmt "$BW" 2)" "$(fmt "$QW" 2)" "$rw" "$(fmt "$BC" 2)" \
        "$(fmt "$QC" 2)" "$bh" "$qh" "$OK"
    result "http $src -> raw" qemu-img "wall s" "$BW" "$QW" "$rw" "<=" 1.0
    summary "http $src -> raw" "wall $rw (goal <= 1.0: $(verdict "$rw" "<=" 1.0)); hangs: blkimg $bh, qemu-img $qh; output $OK"
done
note "ratios are blkimg / qemu-img (lower is better); 'hangs' count runs killed after ${HTTP_TIMEOUT}s"
