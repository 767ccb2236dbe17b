# SPDX-License-Identifier: MIT
"""qcow2 images made by QEMU 7.2 read identically in blkimg.

Every image is created by qemu-img with one set of options and written by
qemu-io (patterns, zeroes, discards, partial clusters), or compressed by
`qemu-img convert -c`, or chained through backing files; then the whole
guest content read through blkimg-io must equal QEMU's raw conversion,
and blkimg-io's `map` must equal qemu-io's.
"""
import hashlib
import json
import os
import re

import pytest

pytestmark = pytest.mark.qemu

HEX_LINE = re.compile(r"^([0-9a-f]{8}):  ((?:[0-9a-f]{2} ){1,16})")


def blkimg_content(run, blkimg_io, path, size, fmt="qcow2"):
    """The guest bytes of path as blkimg reads them (blkimg-io read -v)."""
    cp = run(blkimg_io, "-r", "-f", fmt, "-c", "read -v 0 %d" % size, path)
    assert cp.returncode == 0, cp.stderr
    out = bytearray()
    for line in cp.stdout.splitlines():
        m = HEX_LINE.match(line)
        if not m:
            continue
        assert int(m.group(1), 16) == len(out)
        out += bytes.fromhex(m.group(2).replace(" ", ""))
    assert len(out) == size, "short dump: %d of %d" % (len(out), size)
    return bytes(out)


def qemu_content(run, qemu_img, path, tmp_path, fmt="qcow2"):
    raw = str(tmp_path / ("ref-%s.raw" % os.path.basename(path)))
    run(qemu_img, "convert", "-f", fmt, "-O", "raw", path, raw, check=True)
    with open(raw, "rb") as f:
        data = f.read()
    os.unlink(raw)
    return data


def qemu_size(run, qemu_img, path):
    cp = run(qemu_img, "info", "--output=json", path, check=True)
    return json.loads(cp.stdout)["virtual-size"]


def byte_runs(data):
    """(value, start, end) of each run of one byte value; compares whole
    blocks first, so megabytes of one pattern cost a few comparisons."""
    view = memoryview(data)
    i, n = 0, len(data)
    while i < n:
        v = data[i]
        j = i + 1
        for step in (65536, 4096, 512, 64, 8, 1):
            blk = bytes([v]) * step
            while j + step <= n and view[j:j + step] == blk:
                j += step
        yield v, i, j
        i = j


def verify_runs(run, blkimg_io, path, want, fmt="qcow2"):
    """Checks blkimg's view of path against want (bytes made of runs of
    one byte value, as qemu-io's patterns are) with blkimg-io read -P,
    one command per run."""
    cmds = []
    for v, start, end in byte_runs(want):
        cmds.append("read -P %d %d %d" % (v, start, end - start))
    assert len(cmds) < 20000, "content is not made of pattern runs"
    for i in range(0, len(cmds), 2000):
        argv = [blkimg_io, "-r", "-f", fmt]
        for c in cmds[i:i + 2000]:
            argv += ["-c", c]
        argv.append(path)
        cp = run(*argv)
        assert cp.returncode == 0, cp.stderr
        assert "verification failed" not in cp.stdout + cp.stderr, \
            (cp.stdout + cp.stderr)[-2000:]
        assert cp.stdout.count("read ") == len(cmds[i:i + 2000]), \
            (cp.stdout + cp.stderr)[-2000:]


def same_output(run, qemu_img, blkimg, *args):
    q = run(qemu_img, *args)
    b = run(blkimg, *args)
    assert b.returncode == q.returncode, b.stderr
    assert b.stdout == q.stdout, args
    assert b.stderr.replace("blkimg:", "qemu-img:") == q.stderr


def check_same(run, qemu_img, qemu_io, blkimg_io, path, tmp_path,
               blkimg=None):
    want = qemu_content(run, qemu_img, path, tmp_path)
    verify_runs(run, blkimg_io, path, want)
    if blkimg is None:
        blkimg = os.path.join(os.path.dirname(blkimg_io), "blkimg")
    for args in (["map", "--output=json"], ["info", "--output=json"],
                 ["info"], ["info", "--backing-chain", "--output=json"]):
        same_output(run, qemu_img, blkimg, *args, path)
    # allocation map as qemu-io prints it
    q = run(qemu_io, "-r", "-c", "map", path, check=True).stdout
    b = run(blkimg_io, "-r", "-c", "map", path)
    assert b.returncode == 0, b.stderr
    assert b.stdout == q
    return want


def qio(run, qemu_io, path, *cmds):
    argv = [qemu_io, "-f", "qcow2"]
    for c in cmds:
        argv += ["-c", c]
    argv.append(path)
    cp = run(*argv)
    assert cp.returncode == 0 and "error" not in cp.stdout.lower(), \
        cp.stdout + cp.stderr


# A write pattern touching cluster heads/tails, L2 boundaries, zeroes and
# discards; offsets scale with the cluster size.
def scribble(run, qemu_io, path, cs, size):
    cmds = [
        "write -P 0x11 0 %d" % (3 * cs),
        "write -P 0x22 %d %d" % (cs // 2, cs),
        "write -P 0x33 %d 512" % (5 * cs + 512),
        "write -z %d %d" % (cs, cs),
        "write -P 0x44 %d %d" % (8 * cs, 4 * cs),
        "discard %d %d" % (9 * cs, cs),
        "write -z -u %d %d" % (10 * cs, cs),
        "write -P 0x55 %d %d" % (size - cs - 512, cs + 512),
    ]
    l2_span = cs * (cs // 8)
    if l2_span + 2 * cs < size - 2 * cs:
        cmds.append("write -P 0x66 %d %d" % (l2_span - cs, 2 * cs))
    qio(run, qemu_io, path, *cmds)


CREATE_CASES = [
    # (id, -o options, size)
    ("v3-64k", "", 16 << 20),
    ("v2-64k", "compat=0.10", 16 << 20),
    ("v3-512", "cluster_size=512", 2 << 20),
    ("v2-512", "compat=0.10,cluster_size=512", 2 << 20),
    ("v3-4k", "cluster_size=4096", 8 << 20),
    ("v3-2M", "cluster_size=2M", 32 << 20),
    ("rc1", "refcount_bits=1", 16 << 20),
    ("rc8", "refcount_bits=8", 16 << 20),
    ("rc64", "refcount_bits=64,cluster_size=512", 2 << 20),
    ("rc32", "refcount_bits=32", 16 << 20),
    ("lazy", "lazy_refcounts=on", 16 << 20),
    ("extl2-64k", "extended_l2=on", 16 << 20),
    ("extl2-16k", "extended_l2=on,cluster_size=16k", 16 << 20),
    ("extl2-2M", "extended_l2=on,cluster_size=2M", 32 << 20),
    ("zstd", "compression_type=zstd", 16 << 20),
    ("prealloc-meta", "preallocation=metadata", 8 << 20),
    ("prealloc-falloc", "preallocation=falloc", 8 << 20),
    ("prealloc-full", "preallocation=full", 4 << 20),
    ("odd-size", "", (16 << 20) + 12345 * 512),
]


@pytest.mark.parametrize("opts,size", [c[1:] for c in CREATE_CASES],
                         ids=[c[0] for c in CREATE_CASES])
def test_read_qemu_written(run, qemu_img, qemu_io, blkimg_io, tmp_path, opts,
                           size):
    img = str(tmp_path / "t.qcow2")
    argv = [qemu_img, "create", "-q", "-f", "qcow2"]
    if opts:
        argv += ["-o", opts]
    run(*argv, img, str(size), check=True)
    m = re.search(r"cluster_size=(\w+)", opts)
    cs = {"512": 512, "4096": 4096, "16k": 16384, "2M": 2 << 20}.get(
        m.group(1) if m else "", 65536)
    scribble(run, qemu_io, img, cs, size)
    check_same(run, qemu_img, qemu_io, blkimg_io, img, tmp_path)


@pytest.mark.parametrize("ctype", ["zlib", "zstd"])
@pytest.mark.parametrize("cs", [512, 65536, 2 << 20])
def test_read_compressed(run, qemu_img, qemu_io, blkimg_io, tmp_path, ctype,
                         cs):
    src = str(tmp_path / "src.qcow2")
    size = max(4 << 20, 4 * cs)
    run(qemu_img, "create", "-q", "-f", "qcow2", src, str(size), check=True)
    qio(run, qemu_io, src, "write -P 0xab 0 %d" % (size // 2),
        "write -P 0x0c %d %d" % (size // 2 + 4096, 5000),
        "write -z %d %d" % (size - cs, cs))
    dst = str(tmp_path / "c.qcow2")
    run(qemu_img, "convert", "-c", "-O", "qcow2", "-o",
        "compression_type=%s,cluster_size=%d" % (ctype, cs), src, dst,
        check=True)
    # some clusters overwritten after compression (partial: COW from the
    # compressed cluster)
    qio(run, qemu_io, dst, "write -P 0x5a %d 700" % (cs + 100))
    check_same(run, qemu_img, qemu_io, blkimg_io, dst, tmp_path)


def test_read_backing_chain_relative(run, qemu_img, qemu_io, blkimg_io,
                                     tmp_path):
    """Depth-3 chain with relative names, opened from another directory;
    the base is shorter than the overlays (zeroes past its end)."""
    d = tmp_path / "imgs"
    d.mkdir()
    base = str(d / "base.qcow2")
    mid = str(d / "mid.qcow2")
    top = str(d / "top.qcow2")
    run(qemu_img, "create", "-q", "-f", "qcow2", base, "4M", check=True)
    qio(run, qemu_io, base, "write -P 1 0 4M")
    run(qemu_img, "create", "-q", "-f", "qcow2", "-b", "base.qcow2", "-F",
        "qcow2", mid, "6M", cwd=str(d), check=True)
    qio(run, qemu_io, mid, "write -P 2 1M 1M", "write -z 3M 64k",
        "write -P 7 4M 100k")
    run(qemu_img, "create", "-q", "-f", "qcow2", "-b", "mid.qcow2", "-F",
        "qcow2", "-o", "cluster_size=4k", top, "8M", cwd=str(d), check=True)
    qio(run, qemu_io, top, "write -P 3 1536k 10000", "discard 0 64k",
        "write -P 4 7M 4k")
    want = check_same(run, qemu_img, qemu_io, blkimg_io, top, tmp_path)
    # discarded in a v3 overlay: zero clusters, the backing is hidden
    assert want[:65536] == b"\0" * 65536
    assert want[65536:65536 + 4096] == b"\x01" * 4096
    assert want[(4 << 20) + 102400:(4 << 20) + 106496] == b"\0" * 4096


def test_read_data_file(run, qemu_img, qemu_io, blkimg_io, tmp_path):
    for raw in ("off", "on"):
        img = str(tmp_path / ("d-%s.qcow2" % raw))
        run(qemu_img, "create", "-q", "-f", "qcow2", "-o",
            "data_file=%s,data_file_raw=%s" % (
                os.path.basename(img) + ".data", raw), img, "8M",
            cwd=str(tmp_path), check=True)
        # QEMU finds the data file relative to its working directory
        os.chdir(str(tmp_path))
        scribble(run, qemu_io, img, 65536, 8 << 20)
        check_same(run, qemu_img, qemu_io, blkimg_io, img, tmp_path)
        # blkimg also finds it relative to the image from elsewhere
        os.chdir("/")
        want = qemu_content(run, qemu_img, img, tmp_path) if False else None
        cp = run(blkimg_io, "-r", "-c", "read -P 0x11 0 32768", img)
        assert cp.returncode == 0 and "verification" not in cp.stdout, \
            cp.stdout + cp.stderr


def test_read_with_snapshots(run, qemu_img, qemu_io, blkimg_io, tmp_path):
    img = str(tmp_path / "s.qcow2")
    run(qemu_img, "create", "-q", "-f", "qcow2", img, "8M", check=True)
    qio(run, qemu_io, img, "write -P 1 0 2M")
    run(qemu_img, "snapshot", "-c", "one", img, check=True)
    qio(run, qemu_io, img, "write -P 2 1M 64k", "write -P 3 3M 64k")
    run(qemu_img, "snapshot", "-c", "two", img, check=True)
    qio(run, qemu_io, img, "write -P 4 0 4k")
    check_same(run, qemu_img, qemu_io, blkimg_io, img, tmp_path)


def test_extent_io_is_one_request(run, qemu_img, qemu_io, blkimg_io,
                                  tmp_path):
    """Seed 004: 64 host-contiguous clusters are read with one I/O."""
    img = str(tmp_path / "e.qcow2")
    run(qemu_img, "create", "-q", "-f", "qcow2", "-o", "cluster_size=4k",
        img, "1M", check=True)
    qio(run, qemu_io, img, "write -P 9 0 256k")
    m = run(qemu_img, "map", "--output=json", img, check=True).stdout
    assert len(json.loads(m)) == 2  # one data run, then the rest
    def calls(cmd):
        cp = run(blkimg_io, "-r", "--stats", "-c", cmd, img)
        assert cp.returncode == 0, cp.stderr
        assert "verification failed" not in cp.stdout
        m = re.search(r"io calls: ([0-9]+)", cp.stdout + cp.stderr)
        assert m, cp.stdout + cp.stderr
        return int(m.group(1))
    # opening costs the same metadata reads; the data is one read either
    # way: 64 clusters cost what one cluster costs
    assert calls("read -P 9 0 256k") == calls("read -P 9 0 4k")
