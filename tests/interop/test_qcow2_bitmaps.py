# SPDX-License-Identifier: MIT
"""Persistent dirty bitmaps in qcow2 images written by blkimg.

The same operations are done with qemu-io on one copy of an image and
with blkimg-io on another; afterwards both files must hold the same
bitmaps (names, flags, granularity and every bit), qemu-img check must
find nothing (no leaks, no corruption) and qemu-img info must show the
bitmaps as qemu-img does. The bits are read from the file by a small
parser here, itself cross-checked against qemu-nbd's dirty-bitmap
export. Also: disabled and in-use bitmaps are left alone, read-only use
changes nothing, resize follows QEMU, a SIGKILL leaves the bitmap in use
and the refcounts consistent, and damaged bitmap directories are refused
with one line and exit code 1 without a write."""
import hashlib
import json
import os
import shutil
import signal
import struct
import subprocess
import time

import pytest

from storage import fill_up

pytestmark = pytest.mark.qemu

BITMAPS_EXT = 0x23852875


# ------------------------------------------------------------ file parser

def parse_header(b):
    cs = 1 << struct.unpack_from(">I", b, 20)[0]
    size = struct.unpack_from(">Q", b, 24)[0]
    autoclear = struct.unpack_from(">Q", b, 88)[0]
    hl = struct.unpack_from(">I", b, 100)[0]
    off = hl
    ext = None
    while off + 8 <= cs:
        t, ln = struct.unpack_from(">II", b, off)
        if t == 0:
            break
        if t == BITMAPS_EXT:
            nb, _, dsz, doff = struct.unpack_from(">IIQQ", b, off + 8)
            ext = dict(pos=off + 8, nb=nb, dir_size=dsz, dir_offset=doff)
        off += 8 + ((ln + 7) & ~7)
    return dict(cs=cs, size=size, autoclear=autoclear, ext=ext)


def dir_entries(b):
    h = parse_header(b)
    ext = h["ext"]
    res = []
    if not ext:
        return res
    p = ext["dir_offset"]
    while p < ext["dir_offset"] + ext["dir_size"]:
        to, ts, fl, ty, gb, ns, ex = struct.unpack_from(">QIIBBHI", b, p)
        name = b[p + 24 + ex:p + 24 + ex + ns].decode()
        res.append(dict(pos=p, table_offset=to, table_size=ts, flags=fl,
                        type=ty, gran_bits=gb, name=name))
        p += (24 + ex + ns + 7) & ~7
    return res


def bitmap_bits(b, e, size):
    """Set bits of a bitmap, as a list of granule indexes."""
    cs = parse_header(b)["cs"]
    g = 1 << e["gran_bits"]
    nbits = (size + g - 1) // g
    data = bytearray()
    for i in range(e["table_size"]):
        te = struct.unpack_from(">Q", b, e["table_offset"] + 8 * i)[0]
        off = te & 0x00fffffffffffe00
        if off:
            data += b[off:off + cs]
        elif te & 1:
            data += b"\xff" * cs
        else:
            data += b"\0" * cs
    out = []
    for i, byte in enumerate(data):
        if not byte:
            continue
        for k in range(8):
            if byte >> k & 1:
                out.append(i * 8 + k)
    # the unused tail bits must be zero
    assert not out or out[-1] < nbits, (e["name"], out[-1], nbits)
    return out


def read(path):
    with open(path, "rb") as f:
        return f.read()


def sha(path):
    return hashlib.sha256(read(path)).hexdigest()


def summary(path):
    """{name: (flags, granularity bits, table size, bits)} of an image."""
    b = read(path)
    size = parse_header(b)["size"]
    res = {}
    for e in dir_entries(b):
        bits = None if e["flags"] & 1 else bitmap_bits(b, e, size)
        res[e["name"]] = (e["flags"], e["gran_bits"], e["table_size"], bits)
    return res


def check_clean(run, qemu_img, img):
    cp = run(qemu_img, "check", "--output=json", img)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    r = json.loads(cp.stdout)
    assert r.get("leaks", 0) == 0 and r.get("corruptions", 0) == 0, r
    assert r.get("check-errors", 0) == 0, r
    assert not cp.stderr, cp.stderr


def info_bitmaps(run, qemu_img, img):
    cp = run(qemu_img, "info", "--output=json", img, check=True)
    fs = json.loads(cp.stdout)["format-specific"]["data"]
    return fs.get("bitmaps")


# ----------------------------------------------------------------- setup

def make_image(run, qemu_img, path, size, bitmaps, opts="", backing=None):
    cmd = [qemu_img, "create", "-q", "-f", "qcow2"]
    if opts:
        cmd += ["-o", opts]
    if backing:
        cmd += ["-b", backing, "-F", "qcow2"]
    run(*cmd, path, size, check=True)
    for spec in bitmaps:
        args = ["bitmap", "--add"]
        name = spec[0]
        if len(spec) > 1 and spec[1]:
            args += ["-g", spec[1]]
        if len(spec) > 2 and spec[2]:
            args += ["--disable"]
        run(qemu_img, *args, path, name, check=True)


def session(run, tool, img, cmds, extra=()):
    argv = [tool, *extra]
    for c in cmds:
        argv += ["-c", c]
    cp = run(*argv, img)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    assert "failed" not in cp.stdout and "error" not in cp.stderr.lower(), \
        cp.stdout + cp.stderr
    return cp


def pair(tmp_path, src):
    q = str(tmp_path / "qemu.qcow2")
    m = str(tmp_path / "blkimg.qcow2")
    shutil.copy(src, q)
    shutil.copy(src, m)
    return q, m


def compare_images(run, qemu_img, q, m):
    check_clean(run, qemu_img, m)
    check_clean(run, qemu_img, q)
    assert info_bitmaps(run, qemu_img, m) == info_bitmaps(run, qemu_img, q)
    sq, sm = summary(q), summary(m)
    assert sm == sq
    # and the guest data is the same
    cp = run(qemu_img, "compare", "-f", "qcow2", "-F", "qcow2", q, m)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    return sm


BASIC = ["write -P 1 64k 1k", "write -z 1M 128k", "discard 2M 64k",
         "discard 3M 1k", "write -c -P 3 3584k 64k", "write -P 4 4000k 100",
         "write -P 5 130k 200k", "write -z -u 1536k 64k"]

SCENARIOS = {
    "basic": dict(size="4M", bitmaps=[("b0",), ("fine", "512"),
                                      ("coarse", "2M")],
                  sessions=[BASIC]),
    "two-sessions": dict(size="4M", bitmaps=[("b0",), ("b1", "4k")],
                         sessions=[["write 0 4k", "write 1M 64k"],
                                   ["write 2M 4k", "discard 1M 64k",
                                    "write -z 3M 8k"]]),
    "small-clusters": dict(size="8M", opts="cluster_size=512",
                           bitmaps=[("b0", "512"), ("b1", "64k")],
                           sessions=[["write -P 7 1536k 3M", "write 0 1",
                                      "write 8388096 512"],
                                     ["write -z 7M 4k"]]),
    "odd-size": dict(size="3146240", bitmaps=[("b0", "1M"), ("b1", "512")],
                     sessions=[["write 3145728 512", "write -z 0 4k"]]),
    "extended-l2": dict(size="4M", opts="extended_l2=on,cluster_size=128k",
                        bitmaps=[("b0", "4k")],
                        sessions=[["write 0 4k", "write -z 8k 4k",
                                   "discard 512k 128k", "write 1M 20k"]]),
    "many-bitmaps": dict(size="2M",
                         bitmaps=[("m%d" % i, "%dk" % (1 << (i % 6)))
                                  for i in range(12)],
                         sessions=[["write 0 1k", "write 1000k 300k"]]),
    "lazy-refcounts": dict(size="4M", opts="lazy_refcounts=on",
                           bitmaps=[("b0",), ("b1", "2k")],
                           sessions=[BASIC, ["write 3M 4k"]]),
    "whole-image": dict(size="2M", opts="cluster_size=4k",
                        bitmaps=[("all", "512")],
                        sessions=[["write 0 2M"], ["write -z 0 2M"]]),
}


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_same_bitmaps_as_qemu(run, qemu_img, qemu_io, blkimg_io, tmp_path,
                              name):
    sc = SCENARIOS[name]
    src = str(tmp_path / "src.qcow2")
    make_image(run, qemu_img, src, sc["size"], sc["bitmaps"],
               sc.get("opts", ""))
    q, m = pair(tmp_path, src)
    for cmds in sc["sessions"]:
        session(run, qemu_io, q, cmds)
        session(run, blkimg_io, m, cmds)
    s = compare_images(run, qemu_img, q, m)
    # the operations really set bits
    assert any(v[3] for v in s.values()), s
    for info in info_bitmaps(run, qemu_img, m):
        assert info["flags"] == ["auto"], info


def test_backing_and_snapshot(run, qemu_img, qemu_io, blkimg, blkimg_io,
                              tmp_path):
    """Bitmaps of an overlay and of an image with an internal snapshot
    (writes COW shared clusters) are kept as QEMU keeps them."""
    base = str(tmp_path / "base.qcow2")
    run(qemu_img, "create", "-q", "-f", "qcow2", base, "4M", check=True)
    run(qemu_io, "-c", "write -P 9 0 4M", base, check=True)
    top = str(tmp_path / "top.qcow2")
    make_image(run, qemu_img, top, "4M", [("b0",), ("b1", "8k")],
               backing=base)
    run(qemu_io, "-c", "write -P 2 1M 64k", top, check=True)
    run(qemu_img, "snapshot", "-c", "s1", top, check=True)
    q, m = pair(tmp_path, top)
    cmds = ["write -P 3 1M 4k", "write -P 4 10k 4k", "discard 2M 64k",
            "write -z 3M 64k"]
    session(run, qemu_io, q, cmds)
    session(run, blkimg_io, m, cmds)
    compare_images(run, qemu_img, q, m)
    # applying the snapshot is refused while there are bitmaps, as QEMU
    # refuses it; nothing is written
    for name in ("s1", "nosuch"):
        before = sha(m)
        qr = run(qemu_img, "snapshot", "-a", name, q)
        br = run(blkimg, "snapshot", "-a", name, m)
        assert qr.returncode == 1 and br.returncode == 1, br.stderr
        assert br.stderr == qr.stderr.replace("qemu-img", "blkimg")
        assert sha(m) == before
    # deleting and creating snapshots keeps them
    for args in (["-d", "s1"], ["-c", "s2"]):
        run(qemu_img, "snapshot", *args, q, check=True)
        run(blkimg, "snapshot", *args, m, check=True)
    check_clean(run, qemu_img, m)
    assert summary(m) == summary(q)
    # the data of the overlay is intact
    cp = run(qemu_io, "-r", "-c", "read -P 3 1M 4k", "-c",
             "read -P 2 1028k 60k", "-c", "read -P 9 3M 64k", m)
    assert "failed" in cp.stdout  # 3M was zeroed
    cp = run(qemu_io, "-r", "-c", "read -P 3 1M 4k", "-c",
             "read -P 2 1028k 60k", "-c", "read -P 0 3M 64k", m)
    assert cp.returncode == 0 and "failed" not in cp.stdout, cp.stdout


def test_contents_match_qemu_nbd(run, qemu_img, blkimg_io, tmp_path):
    """The parser used by these tests reads what qemu-nbd exports as the
    dirty bitmap of an image written by blkimg."""
    img = str(tmp_path / "n.qcow2")
    make_image(run, qemu_img, img, "4M", [("b0",), ("b1", "4k")])
    session(run, blkimg_io, img, ["write 64k 1k", "write -z 1M 128k",
                                  "discard 3M 1k", "write 1234k 10k"])
    size = 4 << 20
    b = read(img)
    for e in dir_entries(b):
        bits = set(bitmap_bits(b, e, size))
        g = 1 << e["gran_bits"]
        sock = str(tmp_path / ("s-%s.sock" % e["name"]))
        p = subprocess.Popen(["qemu-nbd", "-r", "-f", "qcow2", "-B",
                              e["name"], "--socket=" + sock, img],
                             stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE)
        try:
            for _ in range(100):
                if os.path.exists(sock):
                    break
                time.sleep(0.05)
            opts = ("driver=nbd,server.type=unix,server.path=%s,export=,"
                    "x-dirty-bitmap=qemu:dirty-bitmap:%s" % (sock, e["name"]))
            cp = run(qemu_img, "map", "--output=json", "--image-opts", opts,
                     check=True)
        finally:
            p.terminate()
            p.wait(timeout=10)
        dirty = set()
        for ext in json.loads(cp.stdout):
            # x-dirty-bitmap: dirty ranges show as "data": false
            if not ext["data"]:
                assert ext["start"] % g == 0
                for i in range(ext["start"] // g,
                               (ext["start"] + ext["length"] + g - 1) // g):
                    dirty.add(i)
        assert dirty == bits, e["name"]
        assert bits


def test_disabled_bitmap_untouched(run, qemu_img, qemu_io, blkimg_io,
                                   tmp_path):
    img = str(tmp_path / "d.qcow2")
    make_image(run, qemu_img, img, "4M", [("on",), ("off",)])
    run(qemu_io, "-c", "write 0 64k", "-c", "write 2M 4k", img, check=True)
    run(qemu_img, "bitmap", "--disable", img, "off", check=True)
    before = {e["name"]: e for e in dir_entries(read(img))}
    bits_before = summary(img)["off"]
    assert bits_before[3] == [0, 32]
    q, m = pair(tmp_path, img)
    cmds = ["write 1M 64k", "write -z 3M 64k", "discard 0 64k"]
    session(run, qemu_io, q, cmds)
    session(run, blkimg_io, m, cmds)
    compare_images(run, qemu_img, q, m)
    after = {e["name"]: e for e in dir_entries(read(m))}
    # the disabled bitmap keeps its table where it was, same bits
    assert after["off"]["table_offset"] == before["off"]["table_offset"]
    assert after["off"]["flags"] == 0
    assert summary(m)["off"] == bits_before
    assert summary(m)["on"][3] == [0, 16, 32, 48]


def set_flags(img, name, flags):
    b = bytearray(read(img))
    for e in dir_entries(b):
        if e["name"] == name:
            struct.pack_into(">I", b, e["pos"] + 12, flags)
    with open(img, "wb") as f:
        f.write(b)


def test_in_use_bitmap_left_in_use(run, qemu_img, qemu_io, blkimg, blkimg_io,
                                   tmp_path):
    img = str(tmp_path / "u.qcow2")
    make_image(run, qemu_img, img, "4M", [("stale",), ("good",)])
    set_flags(img, "stale", 3)
    stale_before = [e for e in dir_entries(read(img))
                    if e["name"] == "stale"][0]
    q, m = pair(tmp_path, img)
    cmds = ["write 0 64k", "write -z 1M 64k"]
    session(run, qemu_io, q, cmds)
    session(run, blkimg_io, m, cmds)
    check_clean(run, qemu_img, m)
    assert info_bitmaps(run, qemu_img, m) == info_bitmaps(run, qemu_img, q)
    st = [e for e in dir_entries(read(m)) if e["name"] == "stale"][0]
    assert st["flags"] == 3
    assert st["table_offset"] == stale_before["table_offset"]
    assert summary(m)["good"] == summary(q)["good"]
    # a resize is refused as qemu-img refuses it, nothing written
    before = sha(m)
    qr = run(qemu_img, "resize", q, "8M")
    br = run(blkimg, "resize", m, "8M")
    assert qr.returncode == 1 and br.returncode == 1, br.stdout + br.stderr
    assert "Bitmap 'stale' is inconsistent and cannot be used" in br.stderr
    assert br.stderr == qr.stderr.replace("qemu-img", "blkimg")
    assert sha(m) == before


@pytest.mark.parametrize("sizes", [("8M",), ("2M",), ("1M", "3M"),
                                   ("5M", "+512")])
def test_resize_like_qemu(run, qemu_img, qemu_io, blkimg, blkimg_io,
                          tmp_path, sizes):
    img = str(tmp_path / "r.qcow2")
    make_image(run, qemu_img, img, "4M", [("b0",), ("b1", "512"),
                                          ("off", "", True)])
    run(qemu_io, "-c", "write 0 64k", "-c", "write 1500k 1M", "-c",
        "write 4190208 4096", img, check=True)
    run(qemu_img, "bitmap", "--enable", img, "off", check=True)
    run(qemu_io, "-c", "write 3M 8k", img, check=True)
    run(qemu_img, "bitmap", "--disable", img, "off", check=True)
    q, m = pair(tmp_path, img)
    for sz in sizes:
        args = ["resize", "--shrink"] if not sz.startswith("+") else \
            ["resize"]
        qr = run(qemu_img, *args, q, sz)
        br = run(blkimg, *args, m, sz)
        assert qr.returncode == 0, qr.stderr
        assert br.returncode == 0, br.stdout + br.stderr
    compare_images(run, qemu_img, q, m)
    # and writes afterwards are tracked in the resized bitmaps
    cmds = ["write -z 0 4k", "write 1M 512"]
    session(run, qemu_io, q, cmds)
    session(run, blkimg_io, m, cmds)
    compare_images(run, qemu_img, q, m)


def test_read_only_and_reads_change_nothing(run, qemu_img, qemu_io, blkimg,
                                            blkimg_io, tmp_path):
    img = str(tmp_path / "ro.qcow2")
    make_image(run, qemu_img, img, "4M", [("b0",)])
    run(qemu_io, "-c", "write 0 64k", img, check=True)
    before = sha(img)
    for cmd in ([blkimg_io, "-r", "-c", "read 0 1M", img],
                [blkimg_io, "-c", "read 0 1M", img],
                [blkimg, "info", img], [blkimg, "check", img],
                [blkimg, "map", img]):
        cp = run(*cmd)
        assert cp.returncode == 0, cp.stderr
    assert sha(img) == before


def test_commit_marks_base_bitmaps(run, qemu_img, qemu_io, blkimg, tmp_path):
    """Data committed into a base with bitmaps marks them: every granule
    of the clusters copied from the top. (QEMU 7.2's qemu-img commit
    leaves the base's bitmaps unmarked, which would make an incremental
    backup miss the committed data: blkimg marks them.)"""
    base = str(tmp_path / "base.qcow2")
    make_image(run, qemu_img, base, "4M", [("b0",), ("b1", "4k")])
    top = str(tmp_path / "top.qcow2")
    run(qemu_img, "create", "-q", "-f", "qcow2", "-b", base, "-F", "qcow2",
        top, check=True)
    run(qemu_io, "-c", "write -P 5 100k 10k", "-c", "write -z 2M 64k",
        "-c", "write -P 6 3M 200k", top, check=True)
    m = json.loads(run(qemu_img, "map", "--output=json", top,
                       check=True).stdout)
    copied = [(e["start"], e["length"]) for e in m if e["depth"] == 0]
    ref = str(tmp_path / "ref.qcow2")
    shutil.copy(top, ref)
    cp = run(blkimg, "commit", "-q", top)
    assert cp.returncode == 0, cp.stderr
    check_clean(run, qemu_img, base)
    s = summary(base)
    for name, (flags, gbits, _, bits) in s.items():
        assert flags == 2
        g = 1 << gbits
        want = set()
        for start, length in copied:
            want.update(range(start // g, (start + length + g - 1) // g))
        assert set(bits) == want, name
    # the data went into the base
    cp = run(qemu_img, "compare", "-F", "qcow2", ref, base)
    assert cp.returncode == 0, cp.stdout


def test_sigkill_leaves_bitmap_in_use(run, qemu_img, blkimg_io, tmp_path):
    img = str(tmp_path / "k.qcow2")
    make_image(run, qemu_img, img, "64M", [("b0",), ("off", "", True)])
    p = subprocess.Popen([blkimg_io, img], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        p.stdin.write(b"write -P 1 0 64k\n")
        p.stdin.flush()
        out = b""
        while b"wrote" not in out:
            ch = p.stdout.read1(4096)
            assert ch, (out, p.stderr.read())
            out += ch
        # a second, longer write in flight when the process dies
        p.stdin.write(b"write -P 2 1M 48M\n")
        p.stdin.flush()
        time.sleep(0.05)
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait()
    cp = run(qemu_img, "check", "--output=json", img)
    r = json.loads(cp.stdout)
    assert r.get("corruptions", 0) == 0, r
    flags = {i["name"]: i["flags"] for i in info_bitmaps(run, qemu_img, img)}
    assert flags == {"b0": ["in-use", "auto"], "off": []}
    # a repair and a later writer leave everything consistent
    cp = run(qemu_img, "check", "-r", "all", img)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    session(run, blkimg_io, img, ["write 0 4k"])
    check_clean(run, qemu_img, img)
    flags = {i["name"]: i["flags"] for i in info_bitmaps(run, qemu_img, img)}
    assert flags == {"b0": ["in-use", "auto"], "off": []}


def test_sigkill_random_moments(run, qemu_img, blkimg_io, tmp_path):
    """Killed at random moments (also while storing at close): never a
    corruption; each bitmap either consistent or in use."""
    src = str(tmp_path / "src.qcow2")
    make_image(run, qemu_img, src, "16M", [("a",), ("b", "512")],
               "cluster_size=4k")
    cmds = []
    for i in range(40):
        cmds += ["-c", "write -P %d %d 12k" % (i + 1, (i * 397 % 4000) * 4096)]
    for k, delay in enumerate([0.0, 0.01, 0.03, 0.06, 0.1, 0.2, 0.4]):
        img = str(tmp_path / ("t%d.qcow2" % k))
        shutil.copy(src, img)
        p = subprocess.Popen([blkimg_io, *cmds, img],
                             stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
        time.sleep(delay)
        p.send_signal(signal.SIGKILL)
        p.wait()
        cp = run(qemu_img, "check", "--output=json", img)
        r = json.loads(cp.stdout)
        assert r.get("corruptions", 0) == 0, (delay, r)
        for name, (flags, _, _, bits) in summary(img).items():
            assert flags in (2, 3), (name, flags)


# ----------------------------------------------------------- hostile images

def poke_entry(img, idx, off, fmt, value):
    b = bytearray(read(img))
    e = dir_entries(b)[idx]
    struct.pack_into(fmt, b, e["pos"] + off, value)
    with open(img, "wb") as f:
        f.write(b)


def poke_ext(img, off, fmt, value):
    b = bytearray(read(img))
    ext = parse_header(b)["ext"]
    struct.pack_into(fmt, b, ext["pos"] + off, value)
    with open(img, "wb") as f:
        f.write(b)


def poke_table(img, idx, entry_idx, value):
    b = bytearray(read(img))
    e = dir_entries(b)[idx]
    struct.pack_into(">Q", b, e["table_offset"] + 8 * entry_idx, value)
    with open(img, "wb") as f:
        f.write(b)


CONSTRAINTS = "Bitmap 'b0' doesn't satisfy the constraints"
HOSTILE = [
    ("flags-reserved", lambda i: poke_entry(i, 0, 12, ">I", 6), CONSTRAINTS),
    ("type-2", lambda i: poke_entry(i, 0, 16, ">B", 2), CONSTRAINTS),
    ("gran-8", lambda i: poke_entry(i, 0, 17, ">B", 8), CONSTRAINTS),
    ("gran-32", lambda i: poke_entry(i, 0, 17, ">B", 32), CONSTRAINTS),
    ("gran-255", lambda i: poke_entry(i, 0, 17, ">B", 255), CONSTRAINTS),
    ("table-size-0", lambda i: poke_entry(i, 0, 8, ">I", 0), CONSTRAINTS),
    ("table-size-huge", lambda i: poke_entry(i, 0, 8, ">I", 0xffffffff),
     CONSTRAINTS),
    ("table-size-2", lambda i: poke_entry(i, 0, 8, ">I", 2),
     "Could not read bitmap 'b0' from image: Invalid argument"),
    ("table-offset-0", lambda i: poke_entry(i, 0, 0, ">Q", 0), CONSTRAINTS),
    ("table-offset-unaligned", lambda i: poke_entry(i, 0, 0, ">Q", 0x90001),
     CONSTRAINTS),
    ("table-offset-past-eof", lambda i: poke_entry(i, 0, 0, ">Q", 1 << 50),
     "Could not read bitmap_table table"),
    ("extra-data", lambda i: poke_entry(i, 0, 20, ">I", 8),
     "Bitmap extra data is not supported"),
    ("name-size-0", lambda i: poke_entry(i, 0, 18, ">H", 0),
     "Bitmap extra data is not supported"),
    ("name-size-huge", lambda i: poke_entry(i, 0, 18, ">H", 0xffff),
     "Broken bitmap directory"),
    ("nb-bitmaps-more", lambda i: poke_ext(i, 0, ">I", 3),
     "Less bitmaps found than specified in header extension"),
    ("nb-bitmaps-less", lambda i: poke_ext(i, 0, ">I", 1),
     "More bitmaps found than specified in header extension"),
    ("nb-bitmaps-zero", lambda i: poke_ext(i, 0, ">I", 0), "zero bitmaps"),
    ("dir-size-huge", lambda i: poke_ext(i, 8, ">Q", 1 << 40),
     "exceeds the maximum supported size"),
    ("dir-size-zero", lambda i: poke_ext(i, 8, ">Q", 0),
     "bitmap directory size is zero"),
    ("dir-offset-unaligned", lambda i: poke_ext(i, 16, ">Q", 0x10008),
     "invalid bitmap directory offset"),
    ("dir-offset-past-eof", lambda i: poke_ext(i, 16, ">Q", 1 << 45),
     "Failed to read bitmap directory"),
    ("table-entry-reserved", lambda i: poke_table(i, 0, 0, 0x2),
     "Could not read bitmap_table table"),
    ("table-entry-ones-and-offset", lambda i: poke_table(i, 0, 0,
                                                         0x50000 | 1),
     "Could not read bitmap_table table"),
    ("table-entry-unaligned", lambda i: poke_table(i, 0, 0, 0x50200),
     "Could not read bitmap_table table"),
    ("table-entry-past-eof", lambda i: poke_table(i, 0, 0, 1 << 50),
     "Could not read bitmap_table table"),
    ("duplicate-name", lambda i: poke_entry(i, 1, 24, ">2s", b"b0"),
     "Bitmap already exists: b0"),
]


@pytest.mark.parametrize("idx", range(len(HOSTILE)),
                         ids=[h[0] for h in HOSTILE])
def test_hostile_bitmap_directory(run, qemu_img, blkimg, blkimg_io, tmp_path,
                                  prebuilt, idx):
    name, damage, expect = HOSTILE[idx]
    img = str(tmp_path / "h.qcow2")
    # the undamaged image is made once per worker; each test damages a copy
    src = prebuilt("bitmaps-hostile",
                   lambda d: make_image(run, qemu_img, str(d / "h.qcow2"),
                                        "1M", [("b0",), ("b1",)]))
    shutil.copyfile(src / "h.qcow2", img)
    damage(img)
    before = sha(img)
    for cmd in ([blkimg, "info", img], [blkimg, "info", "--output=json", img],
                [blkimg, "check", img], [blkimg, "map", img],
                [blkimg_io, "-r", "-c", "read 0 4k", img],
                [blkimg_io, "-c", "write 0 4k", img],
                [blkimg, "resize", img, "2M"]):
        cp = run(*cmd, timeout=60)
        assert cp.returncode == 1, (cmd, cp.stdout, cp.stderr)
        lines = cp.stderr.strip().splitlines()
        assert len(lines) == 1, cp.stderr
        assert expect in lines[0], lines[0]
        assert sha(img) == before, cmd
    # where QEMU refuses the image, it says the same (QEMU reads tables and
    # data past the end of the file as zeroes: those are refused here only)
    cp = run(qemu_img, "info", img)
    if "past-eof" not in name:
        assert cp.returncode == 1, cp.stdout
        b = run(blkimg, "info", img)
        assert b.stderr == cp.stderr.replace("qemu-img", "blkimg")


def test_hostile_shared_clusters_refused_for_writing(run, qemu_img, blkimg,
                                                     blkimg_io, qemu_io,
                                                     tmp_path):
    """A bitmap data cluster that is also the L1 table would be freed at
    close: a read-write open refuses the image, nothing is written."""
    img = str(tmp_path / "s.qcow2")
    make_image(run, qemu_img, img, "1M", [("b0",)])
    run(qemu_io, "-c", "write 0 64k", img, check=True)
    b = read(img)
    l1 = struct.unpack_from(">Q", b, 40)[0]
    poke_table(img, 0, 0, l1)
    before = sha(img)
    cp = run(blkimg_io, "-c", "write 0 4k", img)
    assert cp.returncode == 1
    assert len(cp.stderr.strip().splitlines()) == 1, cp.stderr
    assert "overlap" in cp.stderr
    assert sha(img) == before


def test_rebase_and_convert_mark_like_qemu(run, qemu_img, qemu_io, blkimg,
                                           tmp_path):
    """Safe rebase writes what differs into the image, convert -n writes an
    existing target: the bitmaps record it as QEMU records it."""
    old = str(tmp_path / "old.qcow2")
    new = str(tmp_path / "new.qcow2")
    for p, pat in ((old, 1), (new, 2)):
        run(qemu_img, "create", "-q", "-f", "qcow2", p, "4M", check=True)
        run(qemu_io, "-c", "write -P %d 0 1M" % pat, "-c",
            "write -P 7 2M 64k", p, check=True)
    top = str(tmp_path / "top.qcow2")
    make_image(run, qemu_img, top, "4M", [("b0",), ("b1", "4k")],
               backing=old)
    run(qemu_io, "-c", "write -P 3 100k 10k", top, check=True)
    q, m = pair(tmp_path, top)
    run(qemu_img, "rebase", "-b", new, "-F", "qcow2", q, check=True)
    run(blkimg, "rebase", "-b", new, "-F", "qcow2", m, check=True)
    compare_images(run, qemu_img, q, m)

    src = str(tmp_path / "src.raw")
    with open(src, "wb") as f:
        f.truncate(4 << 20)
        f.seek(300 << 10)
        f.write(b"\x05" * (200 << 10))
        f.seek(3 << 20)
        f.write(b"\x06" * 4096)
    dst = str(tmp_path / "dst.qcow2")
    make_image(run, qemu_img, dst, "4M", [("b0",), ("b1", "4k")])
    run(qemu_io, "-c", "write -P 9 0 4M", dst, check=True)
    q, m = pair(tmp_path, dst)
    run(qemu_img, "convert", "-n", "-f", "raw", "-O", "qcow2", src, q,
        check=True)
    run(blkimg, "convert", "-n", "-f", "raw", "-O", "qcow2", src, m,
        check=True)
    compare_images(run, qemu_img, q, m)


@pytest.mark.parametrize("cache", ["none", "writethrough", "unsafe"])
def test_cache_modes(run, qemu_img, qemu_io, blkimg_io, tmp_path, cache):
    src = str(tmp_path / "src.qcow2")
    make_image(run, qemu_img, src, "4M", [("b0",), ("b1", "512")],
               "cluster_size=4k")
    q, m = pair(tmp_path, src)
    session(run, qemu_io, q, BASIC)
    session(run, blkimg_io, m, BASIC, extra=("-t", cache))
    compare_images(run, qemu_img, q, m)


@pytest.mark.parametrize("resize", [None, "3M", "6M"])
def test_all_ones_table_entries(run, qemu_img, qemu_io, blkimg, blkimg_io,
                                tmp_path, resize):
    """Table entries 1 (a cluster of ones, which QEMU reads but never
    writes) are loaded, kept and stored as QEMU stores them."""
    src = str(tmp_path / "src.qcow2")
    # 512-byte clusters: 4096 bits per table entry, 4M / 512 = 8192 bits
    make_image(run, qemu_img, src, "4M", [("b0", "512"), ("b1", "1k")],
               "cluster_size=512")
    b = read(src)
    assert [e["table_size"] for e in dir_entries(b)] == [2, 1]
    poke_table(src, 0, 1, 1)
    poke_table(src, 1, 0, 1)
    q, m = pair(tmp_path, src)
    cmds = ["write 0 512", "write 3M 1k"]
    session(run, qemu_io, q, cmds)
    session(run, blkimg_io, m, cmds)
    if resize:
        args = ["resize", "--shrink"]
        run(qemu_img, *args, q, resize, check=True)
        cp = run(blkimg, *args, m, resize)
        assert cp.returncode == 0, cp.stderr
    s = compare_images(run, qemu_img, q, m)
    assert len(s["b0"][3]) > 2000


@pytest.mark.parametrize("opt", ["compat=0.10", "lazy_refcounts=on",
                                 "size=8M", "size=3M"])
def test_amend_like_qemu(run, qemu_img, qemu_io, blkimg, tmp_path, opt):
    src = str(tmp_path / "src.qcow2")
    make_image(run, qemu_img, src, "4M", [("b0",), ("b1", "4k", True)])
    run(qemu_io, "-c", "write 0 64k", "-c", "write 3M 5k", src, check=True)
    q, m = pair(tmp_path, src)
    for tool, img in ((qemu_img, q), (blkimg, m)):
        cp = run(tool, "amend", "-o", opt, img)
        assert cp.returncode == 0, cp.stderr
    iq = run(qemu_img, "info", "--output=json", q, check=True)
    im = run(qemu_img, "info", "--output=json", m, check=True)
    assert json.loads(im.stdout)["format-specific"] == \
        json.loads(iq.stdout)["format-specific"]
    if opt != "compat=0.10":  # QEMU's downgrade leaks the bitmaps
        compare_images(run, qemu_img, q, m)


@pytest.mark.root
def test_no_space_for_bitmap_update(run, qemu_img, qemu_io, blkimg_io,
                                    tmp_path, small_tmpfs):
    """The bitmaps cannot be marked in use (file system full): the write
    fails with an error and nothing in the image changes; with space
    again, writes and bitmaps work."""
    mnt = small_tmpfs("2M")
    img = str(mnt / "full.qcow2")
    make_image(run, qemu_img, img, "64M", [("b0",), ("b1", "4k")])
    filler = str(mnt / "filler")
    fill_up(filler)
    cp = run(blkimg_io, "-c", "write -P 1 0 64k", img)
    assert "write failed" in cp.stdout + cp.stderr, cp.stdout + cp.stderr
    check_clean(run, qemu_img, img)
    assert summary(img) == {"b0": (2, 16, 1, []), "b1": (2, 12, 1, [])}
    assert os.path.getsize(img) == len(read(img))
    os.unlink(filler)
    session(run, blkimg_io, img, ["write -P 1 0 64k"])
    check_clean(run, qemu_img, img)
    s = summary(img)
    assert s["b0"][3] == [0] and s["b1"][3] == list(range(16))
    cp = run(qemu_io, "-r", "-c", "read -P 1 0 64k", img)
    assert "failed" not in cp.stdout


def test_hostile_65535_bitmaps_sharing_a_table(run, qemu_img, blkimg_io,
                                               tmp_path):
    """The most bitmaps QEMU allows, all pointing at one table: read-only
    use works quickly, a read-write open refuses the shared clusters."""
    img = str(tmp_path / "many.qcow2")
    make_image(run, qemu_img, img, "1M", [("b0",)])
    b = bytearray(read(img))
    h = parse_header(b)
    e = dir_entries(b)[0]
    d = bytearray()
    n = 65535
    for i in range(n):
        name = b"n%07d" % i
        d += struct.pack(">QIIBBHI", e["table_offset"], 1, 2, 1, 16,
                         len(name), 0) + name
    cs = h["cs"]
    off = (len(b) + cs - 1) // cs * cs
    b += b"\0" * (off - len(b)) + d + b"\0" * (-len(d) % cs)
    struct.pack_into(">IIQQ", b, h["ext"]["pos"], n, 0, len(d), off)
    with open(img, "wb") as f:
        f.write(b)
    before = sha(img)
    t = time.monotonic()
    cp = run(blkimg_io, "-r", "-c", "read 0 4k", img, timeout=60)
    assert cp.returncode == 0, cp.stderr
    cp = run(blkimg_io, "-c", "write 0 4k", img, timeout=60)
    assert cp.returncode == 1
    assert "overlap" in cp.stderr and len(cp.stderr.splitlines()) == 1
    assert time.monotonic() - t < 30
    assert sha(img) == before
