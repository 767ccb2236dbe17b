# SPDX-License-Identifier: MIT
"""Data written by blkimg-io, checked byte for byte: against a model of the
image, by reading the file directly, and by qemu-io reading the same file.
Byte-granular writes at odd offsets on real storage (this disk, 4096-byte
sector loop devices with ext4 and xfs, the loop device itself, tmpfs), with
cache=none (O_DIRECT: read-modify-write and bouncing) and writeback; images
whose block 0 is a hole; concurrent aio writes sharing sectors (no lost
update); the --stats counters."""
import os
import random
import re
import subprocess

import pytest

from storage import any_storage  # noqa: F401
from test_io_common import cmds, mask

pytestmark = pytest.mark.qemu

SIZE = 4 * 1024 * 1024


def run(argv, **kw):
    cp = subprocess.run([str(a) for a in argv], capture_output=True,
                        text=True, stdin=subprocess.DEVNULL, timeout=300,
                        **kw)
    assert "AddressSanitizer" not in cp.stderr, cp.stderr
    assert "runtime error:" not in cp.stderr, cp.stderr
    return cp


def prepare(st, hole0, name="img"):
    """An image of SIZE bytes on storage st; returns (path, contents)."""
    path = st.path(name)
    if st.is_block_device:
        with open(path, "r+b") as f:
            f.write(bytes(SIZE))
            f.flush()
            os.fsync(f.fileno())
        return path, bytearray(SIZE)
    if hole0:
        with open(path, "wb") as f:
            f.truncate(SIZE)  # block 0 (and everything) a hole
    else:
        run(["qemu-img", "create", "-q", "-f", "raw", path, SIZE])
    return path, bytearray(SIZE)


def read_image(path):
    with open(path, "rb") as f:
        return f.read(SIZE)


def runs(model, ranges):
    """Maximal runs of one byte value inside the given ranges."""
    out = []
    for start, end in sorted(ranges):
        i = start
        while i < end:
            j = i
            while j < end and model[j] == model[i]:
                j += 1
            out.append((i, j - i, model[i]))
            i = j
    return out


def qemu_verify(qemu_io, path, model, ranges):
    """qemu-io reads every run back with -P; no mismatch allowed."""
    checks = ["read -q -P %d %d %d" % (v, off, n)
              for off, n, v in runs(model, ranges)]
    # Spot checks that must fail prove the verification is live.
    off, n, v = runs(model, ranges)[0]
    checks.append("read -q -P %d %d %d" % ((v + 1) % 256, off, n))
    cp = run([qemu_io, "-f", "raw"] + cmds(*checks) + [path])
    fails = [l for l in cp.stdout.splitlines()
             if l.startswith("Pattern verification failed")]
    assert fails == ["Pattern verification failed at offset %d, %d bytes" %
                     (off, n)], cp.stdout
    assert cp.returncode == 1


def odd_writes(seed, n):
    rnd = random.Random(seed)
    out = []
    for _ in range(n):
        length = rnd.choice([1, 2, 3, 7, 511, 513, 4095, 4097,
                             rnd.randint(1, 20000)])
        off = rnd.randrange(0, SIZE - length)
        if rnd.random() < 0.3:
            off = rnd.randrange(0, 3) * 4096 + rnd.choice([1, 511, 4095])
        out.append((off, length, rnd.randint(1, 255)))
    return out


@pytest.mark.parametrize("cache", ["none", "writeback"])
@pytest.mark.parametrize("hole0", [False, True], ids=["alloc0", "hole0"])
def test_odd_offset_writes(any_storage, blkimg_io, qemu_io, cache, hole0):
    st = any_storage
    if st.is_block_device and hole0:
        pytest.skip("a block device has no holes")
    path, model = prepare(st, hole0)
    writes = odd_writes(hash((st.kind, cache, hole0)) & 0xffff, 80)
    script = ["write -P %d %d %d" % (v, off, n) for off, n, v in writes]
    cp = run([blkimg_io, "-f", "raw", "-t", cache] + cmds(*script) + [path])
    assert cp.returncode == 0, cp.stderr
    lines = mask(cp.stdout).splitlines()
    assert len(lines) == 2 * len(writes), cp.stdout
    assert lines[0::2] == ["wrote %d/%d bytes at offset %d" % (n, n, off)
                           for off, n, v in writes]
    assert all(l.endswith(", 1 ops; T") for l in lines[1::2]), cp.stdout
    for off, n, v in writes:
        model[off:off + n] = bytes([v]) * n
    assert read_image(path) == bytes(model)
    qemu_verify(qemu_io, path, model, [(o, o + n) for o, n, _ in writes])

    # ... and blkimg-io reads back what it wrote, in the same cache mode.
    checks = ["read -q -P %d %d %d" % (v, off, n)
              for off, n, v in runs(model, [(o, o + n) for o, n, _ in writes])]
    cp = run([blkimg_io, "-f", "raw", "-t", cache] + cmds(*checks) + [path])
    assert cp.returncode == 0 and cp.stdout == "", cp.stdout


@pytest.mark.parametrize("cache", ["none", "writeback"])
def test_concurrent_aio_writes_share_sectors(any_storage, blkimg_io, qemu_io,
                                             cache):
    """Many aio writes in flight, disjoint bytes but the same sectors: a
    read-modify-write that raced another would lose its neighbour's bytes."""
    st = any_storage
    path, model = prepare(st, hole0=not st.is_block_device)
    rnd = random.Random(7)
    base = 4096 * 3 + 5
    pieces, off = [], base
    while off < base + 3 * 4096:
        n = rnd.randint(1, 700)
        pieces.append((off, n, rnd.randint(1, 255)))
        off += n
    rnd.shuffle(pieces)
    script = ["aio_write -q -P %d %d %d" % (v, o, n) for o, n, v in pieces]
    script.append("aio_flush")
    script += ["read -q -P %d %d %d" % (v, o, n) for o, n, v in pieces]
    cp = run([blkimg_io, "-f", "raw", "-t", cache] + cmds(*script) + [path])
    assert cp.returncode == 0 and cp.stdout == "", cp.stdout + cp.stderr
    for o, n, v in pieces:
        model[o:o + n] = bytes([v]) * n
    assert read_image(path) == bytes(model)
    qemu_verify(qemu_io, path, model, [(o, o + n) for o, n, _ in pieces])


def test_readv_writev_vectors(any_storage, blkimg_io, qemu_io):
    st = any_storage
    path, model = prepare(st, hole0=False)
    script = ["writev -P 0x61 4093 1 2 3 4 5 600 4096",
              "writev -P 0x62 100000 4096 4096", "writev -P 0x63 9 1"]
    cp = run([blkimg_io, "-f", "raw", "-t", "none", "-m"] + cmds(*script) +
             [path])
    assert cp.returncode == 0, cp.stderr
    model[4093:4093 + 4711] = b"a" * 4711
    model[100000:100000 + 8192] = b"b" * 8192
    model[9:10] = b"c"
    assert read_image(path) == bytes(model)
    qemu_verify(qemu_io, path, model,
                [(4093, 4093 + 4711), (100000, 108192), (9, 10)])


def test_reads_what_qemu_wrote(tmp_path, blkimg_io, qemu_io):
    """qemu-io writes; blkimg-io's dumps and pattern checks of the same
    file equal qemu-io's own."""
    path = tmp_path / "q.img"
    run(["qemu-img", "create", "-q", "-f", "raw", path, SIZE])
    w = ["write -P 0x%02x %d %d" % (v, o, n)
         for o, n, v in odd_writes(3, 40)]
    assert run([qemu_io, "-f", "raw"] + cmds(*w) + [path]).returncode == 0
    reads = ["read -v 0 64", "read -v 4090 20", "readv -v 511 3 5 8",
             "read -v 1000000 100"]
    reads += ["read -P 0x%02x %d %d" % (v, o, n)
              for o, n, v in odd_writes(3, 40)[-5:]]
    for cache in ("none", "writeback"):
        q = run([qemu_io, "-f", "raw", "-t", cache] + cmds(*reads) + [path])
        b = run([blkimg_io, "-f", "raw", "-t", cache] + cmds(*reads) +
                [path])
        assert mask(b.stdout) == mask(q.stdout)
        assert b.returncode == q.returncode


def stats(text):
    m = dict(re.findall(r"^  ([a-z ]+): (\d+)$", text, re.M))
    return {k: int(v) for k, v in m.items()}


def test_stats(tmp_path, blkimg_io):
    path = tmp_path / "s.img"
    run(["qemu-img", "create", "-q", "-f", "raw", path, SIZE])
    cp = run([blkimg_io, "--stats", "-f", "raw", "-t", "none", "-c",
              "write -q 0 64k", path])
    assert cp.returncode == 0, cp.stderr
    assert cp.stdout.startswith("stats for '%s' (protocol node):\n" % path)
    s = stats(cp.stdout)
    assert set(s) == {"io calls", "bytes read", "bytes written",
                      "bounced bytes", "rmw operations", "serialised waits"}
    # aligned, from an aligned buffer: straight to the kernel
    assert s["bytes written"] == 65536 and s["bounced bytes"] == 0
    assert s["rmw operations"] == 0 and s["io calls"] >= 1

    # one byte at an odd offset under O_DIRECT: one read-modify-write
    cp = run([blkimg_io, "--stats", "-f", "raw", "-t", "none", "-c",
              "write -q -P 7 1 1", path])
    s = stats(cp.stdout)
    assert s["rmw operations"] == 1 and s["bytes read"] > 0
    assert s["bytes written"] == s["bytes read"]

    # misaligned buffers (-m) are bounced under O_DIRECT ...
    cp = run([blkimg_io, "--stats", "-m", "-f", "raw", "-t", "none", "-c",
              "write -q 0 64k", path])
    s = stats(cp.stdout)
    assert s["bounced bytes"] == 65536 and s["rmw operations"] == 0

    # ... and nothing is bounced or padded without O_DIRECT
    cp = run([blkimg_io, "--stats", "-m", "-f", "raw", "-t", "writeback",
              "-c", "write -q 1 3", "-c", "read -q 5 7", path])
    s = stats(cp.stdout)
    assert s["bounced bytes"] == 0 and s["rmw operations"] == 0
    assert s["bytes written"] == 3 and s["bytes read"] == 7

    # stats are printed when an image is closed, each time
    cp = run([blkimg_io, "--stats", "-f", "raw", "-c", "read -q 0 1",
              "-c", "close", "-c", "open -o driver=raw %s" % path, "-c",
              "read -q 0 2", path])
    assert cp.stdout.count("stats for ") == 2
    assert [stats(x)["bytes read"] for x in
            cp.stdout.split("stats for ")[1:]] == [1, 2]


@pytest.mark.parametrize("aio", ["threads", "io_uring"])
def test_stats_engine(tmp_path, blkimg_io, aio):
    path = tmp_path / "e.img"
    run(["qemu-img", "create", "-q", "-f", "raw", path, "1M"])
    cp = run([blkimg_io, "--stats", "-i", aio, "-f", "raw", "-t", "none",
              "-c", "aio_write -q -P 1 0 4k", "-c", "aio_write -q -P 2 4k 4k",
              "-c", "aio_flush", "-c", "read -q -P 1 0 4k", path])
    assert cp.returncode == 0, cp.stdout + cp.stderr
    engine = re.search(r"^  aio engine: (\S+)$", cp.stdout, re.M).group(1)
    if aio == "io_uring" and engine == "threads":
        pytest.skip("io_uring not available here")
    assert engine == aio
    s = stats(cp.stdout)
    assert s["bytes written"] == 8192 and s["bytes read"] == 4096


def test_stats_in_help(blkimg_io):
    cp = run([blkimg_io, "--help"])
    assert cp.returncode == 0 and "--stats" in cp.stdout


def test_compressed_write(tmp_path, blkimg_io, qemu_io):
    """write -c goes through the library's compressed write: qemu-io
    reads the data back and qemu-img sees compressed clusters."""
    path = tmp_path / "c.qcow2"
    run(["qemu-img", "create", "-q", "-f", "qcow2", path, "1M"])
    cp = run([blkimg_io, "-c", "write -c -P 0x33 0 64k",
              "-c", "write -c -P 0x44 128k 64k", path])
    assert cp.returncode == 0, cp.stdout + cp.stderr
    cp = run([qemu_io, "-c", "read -q -P 0x33 0 64k",
              "-c", "read -q -P 0x44 128k 64k", "-c", "read -q -P 0 64k 64k",
              path])
    assert cp.returncode == 0 and cp.stdout == "", cp.stdout
    cp = run(["qemu-img", "check", path])
    assert cp.returncode == 0, cp.stdout
    assert "compressed clusters" in cp.stdout, cp.stdout
