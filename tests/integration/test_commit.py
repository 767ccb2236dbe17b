# SPDX-License-Identifier: MIT
"""blkimg commit against qemu-img 7.2 on identical backing chains: output,
exit code, then every image of the chain: guest bytes, allocation (host
offsets aside: the order clusters are allocated in may differ) and
qemu-img check; the top's view is unchanged by the commit."""
import inspect
import os
import re
import signal
import subprocess
import time

import pytest

from ops_helpers import (check_ok, guest_bytes, info_lines, layout, qio,
                         pristine_view, run_both, sh, twin_copy)

pytestmark = pytest.mark.qemu

IMAGES = ("top.qcow2", "mid.qcow2", "base.qcow2")


def build(qemu_img, d, base_fmt="qcow2"):
    base = "base." + ("qcow2" if base_fmt == "qcow2" else "raw")
    sh(qemu_img, "create", "-q", "-f", base_fmt, base, "4M", cwd=d)
    qio(base, "write -P 1 0 3M", fmt=base_fmt, cwd=d)
    sh(qemu_img, "create", "-q", "-f", "qcow2", "-b", base, "-F", base_fmt,
       "mid.qcow2", cwd=d)
    qio("mid.qcow2", "write -P 3 512k 1M", "write -z 2560k 128k", cwd=d)
    # the top is larger than its backing files: the base grows
    sh(qemu_img, "create", "-q", "-f", "qcow2", "-b", "mid.qcow2", "-F",
       "qcow2", "top.qcow2", "5M", cwd=d)
    qio("top.qcow2", "write -P 2 1M 1M", "write -z 3M 64k",
        "write -P 7 4M 100k", "write -P 8 3000k 1000", cwd=d)
    sh(qemu_img, "create", "-q", "-f", "raw", "plain.raw", "1M", cwd=d)


@pytest.fixture
def twin(qemu_img, prebuilt, tmp_path):
    """twin(base_fmt="qcow2") -> (q, b): build()'s chain, built once per
    worker, copied for qemu-img (q/) and for blkimg (b/)."""
    def twin_(base_fmt="qcow2"):
        src = prebuilt(("commit", base_fmt),
                       lambda d: build(qemu_img, d, base_fmt))
        return twin_copy(src, tmp_path)
    return twin_


CASES = [
    ["-p", "top.qcow2"],  # real stack
    ["top.qcow2"],
    ["-q", "top.qcow2"],
    ["-d", "top.qcow2"],
    ["-b", "base.qcow2", "top.qcow2"],
    ["-b", "mid.qcow2", "-q", "top.qcow2"],
    ["-t", "none", "top.qcow2"],
    ["-r", "100M", "top.qcow2"],
    ["-f", "qcow2", "mid.qcow2"],
    # errors
    ["-b", "nothere", "top.qcow2"],
    ["-b", "top.qcow2", "top.qcow2"],
    ["base.qcow2"],
    ["-f", "raw", "plain.raw"],
    ["-r", "1x", "top.qcow2"],
    ["-t", "foo", "top.qcow2"],
    ["-x", "top.qcow2"],
    ["missing.qcow2"],
    ["top.qcow2", "mid.qcow2"],
    [],
]


def dateless(lines):
    """Snapshot dates: the twin chains are built a moment apart."""
    return [re.sub(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", "DATE", l)
            for l in lines]


def compare_chain(qemu_img, q, b, tmp_path, images=IMAGES, file_holes=False):
    for img in images:
        assert guest_bytes(qemu_img, b / img, tmp_path) == \
            guest_bytes(qemu_img, q / img, tmp_path), img
        assert layout(qemu_img, b / img, file_holes) == \
            layout(qemu_img, q / img, file_holes), img
        assert dateless(info_lines(qemu_img, b / img)) == \
            dateless(info_lines(qemu_img, q / img)), img
        assert check_ok(qemu_img, b / img)[0] == 0, img


def progress_ok(out):
    """qemu-img's job progress lines: how many intermediate steps it
    prints depends on the job's internals; the frame is fixed."""
    return (out.startswith(b"    (0.00/100%)\r") and
            out.endswith(b"    (100.00/100%)\r\nImage committed.\n"))


@pytest.mark.parametrize("case", CASES, ids=lambda c: " ".join(c) or "none")
def test_commit_matches_qemu(qemu_img, blkimg, tmp_path, twin, case):
    q, b = twin()
    before = pristine_view(qemu_img, q / "top.qcow2", tmp_path)
    rq, rb = run_both(qemu_img, blkimg, ["commit"] + case, q, b)
    if "-p" in case:
        assert rb[0] == rq[0] == 0 and rb[2] == rq[2] == ""
        assert progress_ok(rq[1]) and progress_ok(rb[1])
    else:
        assert rb == rq
    compare_chain(qemu_img, q, b, tmp_path)
    assert guest_bytes(qemu_img, b / "top.qcow2", tmp_path) == before


def test_commit_empties_top(qemu_img, blkimg, tmp_path, twin):
    """Without -d the top keeps no cluster (unallocated, not zero: the
    backing shows through) and its file data is freed."""
    q, b = twin()
    run_both(qemu_img, blkimg, ["commit", "top.qcow2"], q, b)
    lay = layout(qemu_img, b / "top.qcow2")
    assert all(e["depth"] > 0 or not e["present"] for e in lay), lay
    cp = check_ok(qemu_img, b / "top.qcow2")
    assert cp[0] == 0 and "leaked" not in cp[1]


def test_commit_into_raw_base(qemu_img, blkimg, tmp_path, twin):
    q, b = twin(base_fmt="raw")
    rq, rb = run_both(qemu_img, blkimg, ["commit", "-b", "base.raw",
                                         "top.qcow2"], q, b)
    assert rb == rq
    assert rq[0] == 0
    assert guest_bytes(qemu_img, b / "base.raw", tmp_path, "raw") == \
        guest_bytes(qemu_img, q / "base.raw", tmp_path, "raw")
    compare_chain(qemu_img, q, b, tmp_path, ("top.qcow2", "mid.qcow2"))


def test_commit_with_snapshot_in_top(qemu_img, blkimg, tmp_path, twin):
    """A top with an internal snapshot: its clusters are shared, emptying
    the active table must leave the snapshot intact."""
    q, b = twin()
    for d in (q, b):
        sh(qemu_img, "snapshot", "-c", "s1", "top.qcow2", cwd=d)
        qio("top.qcow2", "write -P 6 0 64k", cwd=d)
    rq, rb = run_both(qemu_img, blkimg, ["commit", "top.qcow2"], q, b)
    assert rb == rq
    compare_chain(qemu_img, q, b, tmp_path)
    for d in (q, b):
        sh(qemu_img, "snapshot", "-a", "s1", "top.qcow2", cwd=d)
    compare_chain(qemu_img, q, b, tmp_path, file_holes=True)


# ------------------------------------------------- the parallel copy path

MiB = 1024 * 1024


def random_writes(seed, size, n, cluster=65536):
    """qemu-io commands: n writes of random data patterns, zero writes and
    discards at random (partly unaligned) offsets of an image of size."""
    import random
    r = random.Random(seed)
    cmds = []
    for _ in range(n):
        length = r.choice([512, 4096, 65536, 3 * 65536 + 512, MiB,
                           3 * MiB, cluster])
        off = r.randrange(0, size - length) // 512 * 512
        kind = r.random()
        if kind < 0.7:
            cmds.append("write -P %d %d %d" % (r.randrange(1, 255), off,
                                                length))
        elif kind < 0.9:
            cmds.append("write -z %d %d" % (off, length))
        else:
            cmds.append("discard %d %d" % (off, length))
    return cmds


def build_big(qemu_img, d, depth=1, base_opts=(), top_opts=(), size=64,
              seed=11, base_fmt="qcow2"):
    """base (random writes) <- img1 <- ... <- img<depth> (the top), each
    layer with its own random writes; returns the chain, top first."""
    names = ["base." + base_fmt] + ["img%d.qcow2" % i
                                    for i in range(1, depth + 1)]
    sh(qemu_img, "create", "-q", "-f", base_fmt, *base_opts, names[0],
       "%dM" % size, cwd=d)
    qio(names[0], *random_writes(seed, size * MiB, 40), fmt=base_fmt, cwd=d)
    for i in range(1, depth + 1):
        sh(qemu_img, "create", "-q", "-f", "qcow2", *top_opts, "-b",
           names[i - 1], "-F", base_fmt if i == 1 else "qcow2", names[i],
           cwd=d)
        qio(names[i], *random_writes(seed + i, size * MiB, 60), cwd=d)
    return names[::-1]


@pytest.fixture
def big_twin(qemu_img, prebuilt, tmp_path):
    """big_twin(**build_big arguments) -> (q, b, names): the chain built
    once per worker and set of arguments, copied for each tool."""
    def big_twin_(**kw):
        built = {}

        def build(d):
            built[d] = build_big(qemu_img, d, **kw)
        # the same chain whichever arguments are left at their defaults
        args = inspect.signature(build_big).bind(qemu_img, None, **kw)
        args.apply_defaults()
        key = tuple(sorted((k, v) for k, v in args.arguments.items()
                           if k not in ("qemu_img", "d")))
        src = prebuilt(("commit-big",) + key, build)
        _chains.update(built)
        q, b = twin_copy(src, tmp_path)
        return q, b, _chains[src]
    return big_twin_


_chains = {}  # built directory -> its chain, top first


# `slow` (the normal build runs them, the sanitizer pass skips them): a
# case whose code path another case on the sanitizer pass covers too.
SLOW = pytest.mark.slow

BIG_CASES = [
    # (chain depth, commit options, base options, top options)
    (1, [], (), ()),
    (1, ["-t", "none"], (), ()),
    # -d: test_commit_matches_qemu[-d top.qcow2]
    pytest.param(1, ["-d", "-t", "none"], (), (), marks=SLOW),
    # progress: [3--b img2.qcow2 -p--]
    pytest.param(1, ["-p"], (), (), marks=SLOW),
    # 4k clusters: [1---o cluster_size=2M--o cluster_size=4096]
    pytest.param(1, [], ("-o", "cluster_size=4096"), (), marks=SLOW),
    (1, [], ("-o", "cluster_size=2M"), ("-o", "cluster_size=4096")),
    (1, [], (), ("-o", "cluster_size=512")),
    (1, [], ("-o", "compat=0.10"), ("-o", "compat=0.10")),
    # the rate limit: test_commit_interrupted (-r 4M)
    pytest.param(1, ["-r", "1G"], (), (), marks=SLOW),
    # into img2 as by default: [3--b img2.qcow2 -p--]
    pytest.param(3, [], (), (), marks=SLOW),
    (3, ["-b", "base.qcow2", "-t", "none"], (), ()),
    (3, ["-b", "img1.qcow2"], (), ()),  # into a middle image
    (3, ["-b", "img2.qcow2", "-p"], (), ()),
]


@pytest.mark.parametrize("depth,opts,base_opts,top_opts", BIG_CASES,
                         ids=lambda c: " ".join(c) if isinstance(c, (list,
                                                                     tuple))
                         else str(c))
def test_commit_many_extents(qemu_img, blkimg, tmp_path, big_twin, depth,
                             opts, base_opts, top_opts):
    """Chains with hundreds of extents of data, zeroes and discards at
    unaligned offsets, clusters from 512 bytes to 2 MiB: the images after
    the commit read, map and check as qemu-img leaves them."""
    q, b, names = big_twin(depth=depth, base_opts=base_opts,
                           top_opts=top_opts)
    before = pristine_view(qemu_img, q / names[0], tmp_path)
    rq, rb = run_both(qemu_img, blkimg, ["commit"] + opts + [names[0]], q, b)
    if "-p" in opts:
        assert rb[0] == rq[0] == 0 and rb[2] == rq[2] == ""
        assert progress_ok(rq[1]) and progress_ok(rb[1])
        pct = [float(x.split(b"/")[0].strip(b" (")) for x in
               rb[1].split(b"\r")[:-1]]
        assert pct == sorted(pct) and len(pct) >= 2
    else:
        assert rb == rq
    compare_chain(qemu_img, q, b, tmp_path, names)
    # every image above the base that stays keeps its view
    assert guest_bytes(qemu_img, b / names[0], tmp_path) == before
    base = opts[opts.index("-b") + 1] if "-b" in opts else names[1]
    assert guest_bytes(qemu_img, b / base, tmp_path) == before
    # the top's file: emptied (reset and truncated) or untouched alike;
    # where the base's clusters land depends on the order requests
    # complete in (QEMU's job has 16 in flight too)
    assert os.path.getsize(b / names[0]) == os.path.getsize(q / names[0])


def test_commit_big_into_raw_base(qemu_img, blkimg, tmp_path, big_twin):
    """A raw base: the base file's allocation (what qemu-img map shows)
    comes out as qemu-img's commit job leaves it (64 KiB granules, zeroes
    punched)."""
    q, b, names = big_twin(base_fmt="raw",
                           top_opts=("-o", "cluster_size=4096"))
    rq, rb = run_both(qemu_img, blkimg, ["commit", "-t", "none", names[0]],
                      q, b)
    assert rb == rq and rq[0] == 0
    assert guest_bytes(qemu_img, b / "base.raw", tmp_path, "raw") == \
        guest_bytes(qemu_img, q / "base.raw", tmp_path, "raw")
    assert guest_bytes(qemu_img, b / names[0], tmp_path) == \
        guest_bytes(qemu_img, q / names[0], tmp_path)
    # ext4 reports zeroed (unwritten) extents as data while their pages
    # are cached: the maps are compared with both files out of the cache
    for d in (q, b):
        fd = os.open(d / "base.raw", os.O_RDONLY)
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
    assert layout(qemu_img, b / "base.raw") == layout(qemu_img, q / "base.raw")
    assert layout(qemu_img, b / names[0]) == layout(qemu_img, q / names[0])
    assert check_ok(qemu_img, b / names[0])[0] == 0


# ---------------------------------------------------- emptying the top


@pytest.mark.parametrize("top_opts", [
    (),
    # other cluster sizes: test_commit_many_extents[1----o cluster_size=512]
    # and [1---o cluster_size=2M--o cluster_size=4096]
    pytest.param(("-o", "cluster_size=4096"), marks=SLOW),
    pytest.param(("-o", "cluster_size=512"), marks=SLOW),
    ("-o", "compat=0.10"),
    ("-o", "lazy_refcounts=on"),
    ("-o", "refcount_bits=1"),
], ids=lambda o: " ".join(o) or "default")
def test_commit_top_emptied_as_qemu(qemu_img, blkimg, tmp_path, big_twin,
                                    top_opts):
    """qcow2 v3 tops are reset and truncated to header, refcount table,
    refcount block and L1 table (QEMU's make_completely_empty): the same
    bytes as qemu-img leaves. v2 tops keep their size with every cluster
    discarded (their data freed in the file)."""
    q, b, names = big_twin(top_opts=top_opts)
    rq, rb = run_both(qemu_img, blkimg, ["commit", names[0]], q, b)
    assert rb == rq and rq[0] == 0
    top = names[0]
    assert os.path.getsize(b / top) == os.path.getsize(q / top)
    compare_chain(qemu_img, q, b, tmp_path, names)
    lay = layout(qemu_img, b / top)
    assert all(e["depth"] > 0 or not e["present"] for e in lay), lay
    cp = check_ok(qemu_img, b / top)
    assert cp[0] == 0 and "leaked" not in cp[1]
    # byte for byte what qemu-img leaves (reset, or discarded for v2)
    with open(q / top, "rb") as f:
        want = f.read()
    with open(b / top, "rb") as f:
        assert f.read() == want
    # the emptied top's data clusters are freed in the file
    assert os.stat(b / top).st_blocks <= os.stat(q / top).st_blocks + 64


def test_commit_top_with_bitmap_not_truncated(qemu_img, blkimg, tmp_path,
                                              big_twin):
    """A persistent bitmap in the top: QEMU discards instead of resetting
    the file (the bitmap's clusters stay)."""
    q, b, names = big_twin()
    for d in (q, b):
        sh(qemu_img, "bitmap", "--add", names[0], "bm0", cwd=d)
    rq, rb = run_both(qemu_img, blkimg, ["commit", names[0]], q, b)
    assert rb == rq and rq[0] == 0
    assert os.path.getsize(b / names[0]) == os.path.getsize(q / names[0])
    compare_chain(qemu_img, q, b, tmp_path, names)


# ------------------------------------------------------------- SIGINT


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_commit_interrupted(qemu_img, blkimg, tmp_path, sig):
    """A signal stops the copy after the requests in flight: exit 1, one
    message, the top not emptied, every image consistent and the top's
    view unchanged."""
    d = tmp_path
    sh(qemu_img, "create", "-q", "-f", "qcow2", "base.qcow2", "64M", cwd=d)
    sh(qemu_img, "create", "-q", "-f", "qcow2", "-b", "base.qcow2", "-F",
       "qcow2", "top.qcow2", cwd=d)
    qio("top.qcow2", "write -P 5 0 48M", cwd=d)
    before = guest_bytes(qemu_img, d / "top.qcow2", tmp_path)
    # 4 MiB/s: the 48 MiB take far longer than the test waits
    p = subprocess.Popen([str(blkimg), "commit", "-r", "4M", "top.qcow2"],
                         cwd=d, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    try:
        time.sleep(1.0)
        assert p.poll() is None, "commit ended before the signal"
        t0 = time.time()
        p.send_signal(sig)
        out, err = p.communicate(timeout=30)
        elapsed = time.time() - t0
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    name = "SIGINT" if sig == signal.SIGINT else "SIGTERM"
    assert p.returncode == 1
    assert out == b""
    err = err.decode()
    assert err.startswith("blkimg: Interrupted by %s: the commit into " %
                          name), err
    assert err.count("\n") == 1
    # the rate limiter's sleeps end at the signal, not after each worker's
    # queued delay (was 7.5-10 s)
    assert elapsed < 3
    for img in ("top.qcow2", "base.qcow2"):
        assert check_ok(qemu_img, d / img)[0] == 0, img
    assert guest_bytes(qemu_img, d / "top.qcow2", tmp_path) == before
    # the top still holds its data
    assert any(e["depth"] == 0 and e["data"]
               for e in layout(qemu_img, d / "top.qcow2"))
