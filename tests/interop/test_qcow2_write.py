# SPDX-License-Identifier: MIT
"""qcow2 images written by blkimg are clean and read identically in QEMU.

The same command script is applied to two copies of an image, one by
qemu-io and one by blkimg-io; afterwards `qemu-img check` must find no
errors and no leaks in blkimg's copy, and QEMU must read both copies
identically.
"""
import json
import os
import shutil
import subprocess
import time

import pytest

pytestmark = pytest.mark.qemu


def raw_of(run, qemu_img, path, tmp_path, extra=()):
    out = str(tmp_path / (os.path.basename(path) + ".raw"))
    run(qemu_img, "convert", *extra, "-O", "raw", path, out, check=True)
    with open(out, "rb") as f:
        data = f.read()
    os.unlink(out)
    return data


def apply(run, tool, path, cmds, fmt="qcow2"):
    argv = [tool, "-f", fmt]
    for c in cmds:
        argv += ["-c", c]
    argv.append(path)
    cp = run(*argv)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    low = cp.stdout.lower()
    assert "error" not in low and "failed" not in low, cp.stdout
    return cp


def qemu_check_clean(run, qemu_img, path):
    cp = run(qemu_img, "check", "--output=json", path)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    res = json.loads(cp.stdout)
    assert res.get("corruptions", 0) == 0, cp.stdout + cp.stderr
    assert res.get("leaks", 0) == 0, cp.stdout + cp.stderr
    assert res.get("check-errors", 0) == 0, cp.stdout + cp.stderr
    return res


def twin(run, qemu_img, qemu_io, blkimg_io, tmp_path, img, cmds):
    """Applies cmds with both tools to copies of img and compares."""
    ours = str(tmp_path / "ours.qcow2")
    theirs = str(tmp_path / "theirs.qcow2")
    shutil.copy(img, ours)
    shutil.copy(img, theirs)
    apply(run, qemu_io, theirs, cmds)
    apply(run, blkimg_io, ours, cmds)
    qemu_check_clean(run, qemu_img, ours)
    a = raw_of(run, qemu_img, theirs, tmp_path)
    b = raw_of(run, qemu_img, ours, tmp_path)
    assert len(a) == len(b)
    if a != b:
        for i in range(0, len(a), 512):
            if a[i:i + 512] != b[i:i + 512]:
                pytest.fail("content differs from offset %d" % i)
    return ours


def script(cs, size):
    c = [
        "write -P 0x11 0 %d" % (3 * cs),             # allocating run
        "write -P 0x22 %d %d" % (cs // 2, cs),          # in place, unaligned
        "write -P 0x33 %d 512" % (5 * cs + 512),        # COW head + tail
        "write -P 0x34 %d 1000" % (6 * cs - 500),       # spans two clusters
        "write -z %d %d" % (cs, cs),                     # zero cluster
        "write -P 0x44 %d %d" % (8 * cs, 4 * cs),
        "discard %d %d" % (9 * cs, cs),
        "write -z -u %d %d" % (10 * cs, cs),
        "write -P 0x45 %d 777" % (10 * cs + 99),         # into a zero cluster
        "write -P 0x55 %d %d" % (size - cs - 512, cs + 512),
        "write -z %d %d" % (2 * cs + 100, 300),          # partial zero
        "flush",
        "write -P 0x66 %d %d" % (12 * cs, 7 * cs + 3),
    ]
    l2_span = cs * (cs // 8)
    if l2_span + 2 * cs < size - 2 * cs:
        c.append("write -P 0x77 %d %d" % (l2_span - cs // 2, 2 * cs))
    return c


CASES = [
    ("v3-64k", "", 8 << 20, 65536),
    ("v2-64k", "compat=0.10", 8 << 20, 65536),
    ("v3-512", "cluster_size=512", 1 << 20, 512),
    ("v2-512", "compat=0.10,cluster_size=512", 1 << 20, 512),
    ("v3-4k", "cluster_size=4096", 4 << 20, 4096),
    ("v3-2M", "cluster_size=2M", 48 << 20, 2 << 20),
    ("rc1", "refcount_bits=1", 8 << 20, 65536),
    ("rc64-512", "refcount_bits=64,cluster_size=512", 1 << 20, 512),
    ("rc2-512", "refcount_bits=2,cluster_size=512", 1 << 20, 512),
    ("lazy", "lazy_refcounts=on", 8 << 20, 65536),
    ("extl2-64k", "extended_l2=on", 8 << 20, 65536),
    ("extl2-16k", "extended_l2=on,cluster_size=16k", 8 << 20, 16384),
    ("zstd", "compression_type=zstd", 8 << 20, 65536),
    ("prealloc-meta", "preallocation=metadata", 4 << 20, 65536),
]


@pytest.mark.parametrize("opts,size,cs", [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_write_matches_qemu(run, qemu_img, qemu_io, blkimg_io, tmp_path, opts,
                            size, cs):
    img = str(tmp_path / "base.qcow2")
    argv = [qemu_img, "create", "-q", "-f", "qcow2"]
    if opts:
        argv += ["-o", opts]
    run(*argv, img, str(size), check=True)
    twin(run, qemu_img, qemu_io, blkimg_io, tmp_path, img, script(cs, size))


def test_write_refcount_table_growth(run, qemu_img, qemu_io, blkimg_io,
                                     tmp_path):
    """512-byte clusters with 64-bit refcounts: one refcount block covers
    64 clusters and the first refcount table only 2 MiB of file; writing
    4 MiB grows the table (more than once)."""
    img = str(tmp_path / "g.qcow2")
    run(qemu_img, "create", "-q", "-f", "qcow2", "-o",
        "cluster_size=512,refcount_bits=64", img, "8M", check=True)
    cmds = ["write -P %d %d 65536" % (i + 1, i * 65536 * 2) for i in range(64)]
    ours = twin(run, qemu_img, qemu_io, blkimg_io, tmp_path, img, cmds)
    assert os.path.getsize(ours) > 4 << 20


def test_write_through_backing_cow(run, qemu_img, qemu_io, blkimg_io,
                                   tmp_path):
    base = str(tmp_path / "b.qcow2")
    run(qemu_img, "create", "-q", "-f", "qcow2", base, "4M", check=True)
    apply(run, qemu_io, base, ["write -P 1 0 4M"])
    top = str(tmp_path / "top.qcow2")
    run(qemu_img, "create", "-q", "-f", "qcow2", "-b", "b.qcow2", "-F",
        "qcow2", top, "6M", cwd=str(tmp_path), check=True)
    # overlay copies must find the backing file next to them
    cmds = ["write -P 2 1000 2000", "write -P 3 65000 1000",
            "write -P 4 4194000 1000", "write -z 2M 1000", "discard 3M 64k"]
    ours = str(tmp_path / "ours.qcow2")
    theirs = str(tmp_path / "theirs.qcow2")
    shutil.copy(top, ours)
    shutil.copy(top, theirs)
    apply(run, qemu_io, theirs, cmds)
    apply(run, blkimg_io, ours, cmds)
    qemu_check_clean(run, qemu_img, ours)
    assert raw_of(run, qemu_img, ours, tmp_path) == \
        raw_of(run, qemu_img, theirs, tmp_path)
    # the base is untouched
    apply(run, qemu_io, base, ["read -P 1 0 4M"])


def test_write_keeps_snapshots(run, qemu_img, qemu_io, blkimg_io, tmp_path):
    """Clusters shared with an internal snapshot are copied on write; the
    snapshot still reads as it was and the refcounts stay exact."""
    img = str(tmp_path / "s.qcow2")
    run(qemu_img, "create", "-q", "-f", "qcow2", img, "8M", check=True)
    apply(run, qemu_io, img, ["write -P 1 0 3M", "write -c -P 5 4M 64k"])
    run(qemu_img, "snapshot", "-c", "snap1", img, check=True)
    before = raw_of(run, qemu_img, img, tmp_path)
    apply(run, blkimg_io, img, ["write -P 2 1000 100", "write -P 3 1M 2M",
                                "write -z 2M 64k", "discard 0 64k",
                                "write -P 6 4M 512"])
    qemu_check_clean(run, qemu_img, img)
    snap = raw_of(run, qemu_img, img, tmp_path, ("-l", "snapshot.name=snap1"))
    assert snap == before
    apply(run, qemu_io, img, ["read -P 0 0 64k", "read -P 1 64k 960k",
                              "read -P 3 1M 1M", "read -P 0 2M 64k",
                              "read -P 3 2112k 960k", "read -P 6 4M 512",
                              "read -P 5 4194816 65024"])


def test_write_compressed(run, qemu_img, qemu_io, blkimg_io, tmp_path):
    for ctype in ("zlib", "zstd"):
        img = str(tmp_path / ("c-%s.qcow2" % ctype))
        run(qemu_img, "create", "-q", "-f", "qcow2", "-o",
            "compression_type=" + ctype, img, "4M", check=True)
        apply(run, blkimg_io, img, ["write -c -P 7 0 64k",
                                    "write -c -P 8 64k 128k",
                                    "write -c -P 9 1M 64k",
                                    "write -P 10 1M 100"])
        qemu_check_clean(run, qemu_img, img)
        m = json.loads(run(qemu_img, "map", "--output=json", img,
                           check=True).stdout)
        assert any(e["data"] and "offset" not in e for e in m), m
        apply(run, qemu_io, img, ["read -P 7 0 64k", "read -P 8 64k 128k",
                                  "read -P 10 1M 100",
                                  "read -P 9 1048676 65436"])


def new_images_both(run, qemu_img, qemu_io, blkimg_io, tmp_path, opts, size,
                    cmds):
    """Creates a qcow2 image (-o opts) for qemu-io and one for blkimg-io,
    applies cmds with each tool; returns [qemu-io's, blkimg-io's]."""
    imgs = []
    for tool, name in ((qemu_io, "q.qcow2"), (blkimg_io, "b.qcow2")):
        img = str(tmp_path / name)
        run(qemu_img, "create", "-q", "-f", "qcow2", "-o", opts, img, size,
            check=True)
        apply(run, tool, img, cmds)
        imgs.append(img)
    return imgs


@pytest.mark.parametrize("ctype", ["zlib", "zstd"])
def test_write_compressed_file_identical(run, qemu_img, qemu_io, blkimg_io,
                                         tmp_path, ctype):
    """Compressed writes into a new image: the L2 table is allocated before
    the compressed bytes, as in QEMU, so the file is qemu-io's byte for
    byte."""
    cmds = ["write -c -P 7 0 64k", "write -c -P 8 64k 64k",
            "write -c -P 9 10M 64k", "write -c -P 10 3M 64k"]
    files = []
    for img in new_images_both(run, qemu_img, qemu_io, blkimg_io, tmp_path,
                               "compression_type=" + ctype, "64M", cmds):
        with open(img, "rb") as f:
            files.append(f.read())
    assert files[1] == files[0]


@pytest.mark.parametrize("csize", ["64k", "4k"])
def test_write_compressed_many_clusters(run, qemu_img, qemu_io, blkimg_io,
                                        tmp_path, csize):
    """One compressed write of many clusters (compressed at once, in
    slices): every cluster is stored compressed, in guest order, and QEMU
    reads what qemu-io's copy holds."""
    cmds = ["write -c -P 5 0 3M", "write -c -P 6 4M 64k",
            "write -c -P 7 8M 1M"]
    imgs = new_images_both(run, qemu_img, qemu_io, blkimg_io, tmp_path,
                           "cluster_size=" + csize, "16M", cmds)
    res = qemu_check_clean(run, qemu_img, imgs[1])
    assert res["compressed-clusters"] == res["allocated-clusters"] > 0
    assert raw_of(run, qemu_img, imgs[1], tmp_path) == \
        raw_of(run, qemu_img, imgs[0], tmp_path)
    # guest order: the host offsets in the first L2 table only grow
    with open(imgs[1], "rb") as f:
        data = f.read()
    cbits = {"64k": 16, "4k": 12}[csize]
    l1_off = int.from_bytes(data[40:48], "big")
    l2_off = int.from_bytes(data[l1_off:l1_off + 8], "big") & ((1 << 56) - 512)
    hosts = []
    for i in range(min((3 << 20) >> cbits, (1 << cbits) // 8)):
        e = int.from_bytes(data[l2_off + 8 * i:l2_off + 8 * i + 8], "big")
        assert e & (1 << 62), "cluster %d not compressed" % i
        hosts.append(e & ((1 << (62 - (cbits - 8))) - 1))
    assert hosts == sorted(hosts)


def test_write_compressed_refuses_overwrite(run, qemu_img, qemu_io,
                                           blkimg_io, tmp_path):
    """As QEMU: compressed data never overwrites an allocated cluster (EIO);
    the clusters before the refused one are written. A length that is not
    whole clusters is refused before anything is written."""
    outs, maps = [], []
    for tool, name in ((qemu_io, "q.qcow2"), (blkimg_io, "b.qcow2")):
        img = str(tmp_path / name)
        run(qemu_img, "create", "-q", "-f", "qcow2", img, "16M", check=True)
        cp = run(tool, "-f", "qcow2", "-c", "write -P 2 1M 64k",
                 "-c", "write -c -P 3 0 2M", "-c", "write -c -P 4 4M 96k",
                 img)
        outs.append([ln for ln in cp.stdout.splitlines()
                     if "failed" in ln])
        qemu_check_clean(run, qemu_img, img)
        m = json.loads(run(qemu_img, "map", "--output=json", img).stdout)
        maps.append([(e["start"], e["data"]) for e in m
                     if e["start"] < (1 << 20)])
        data = raw_of(run, qemu_img, img, tmp_path)
        assert data[:1 << 20] == b"\x03" * (1 << 20)
        assert data[1 << 20:(1 << 20) + 65536] == b"\x02" * 65536
        assert data[4 << 20:(4 << 20) + 98304] == bytes(98304)
    assert outs[1] == outs[0] == ["write failed: Input/output error",
                                  "write failed: Invalid argument"]
    assert maps[1] == maps[0]


def test_concurrent_overlapping_allocating_writes(run, qemu_img, qemu_io,
                                                  blkimg_io, tmp_path):
    """Many allocating writes in flight that share clusters: writes to
    disjoint bytes of one cluster all survive (no lost COW update), bytes
    written by overlapping requests hold one of their patterns, and
    nothing leaks."""
    img = str(tmp_path / "a.qcow2")
    run(qemu_img, "create", "-q", "-f", "qcow2", "-o", "cluster_size=4k",
        img, "4M", check=True)
    cmds = []
    # disjoint byte ranges, 3000 bytes each: most clusters get two writes
    for i in range(64):
        cmds.append("aio_write -P %d %d 3000" % (i + 1, i * 3000))
    # overlapping ranges further on
    base = 1 << 20
    for i in range(64):
        cmds.append("aio_write -P %d %d 3000" % (100 + i, base + i * 2500))
    cmds.append("aio_flush")
    apply(run, blkimg_io, img, cmds)
    qemu_check_clean(run, qemu_img, img)
    data = raw_of(run, qemu_img, img, tmp_path)
    model = bytearray(4 << 20)
    for i in range(64):
        model[i * 3000:i * 3000 + 3000] = bytes([i + 1]) * 3000
    assert data[:base] == bytes(model[:base])
    for off in range(base, base + 63 * 2500 + 3000, 100):
        rel = off - base
        allowed = {100 + i for i in range(64)
                   if i * 2500 <= rel < i * 2500 + 3000}
        assert data[off] in allowed, (off, data[off], allowed)
    assert data[base + 63 * 2500 + 3000:] == bytes(
        (4 << 20) - base - 63 * 2500 - 3000)


def test_truncate_grows_l1(run, qemu_img, qemu_io, blkimg_io, tmp_path):
    img = str(tmp_path / "t.qcow2")
    run(qemu_img, "create", "-q", "-f", "qcow2", "-o", "cluster_size=512",
        img, "64k", check=True)
    apply(run, blkimg_io, img, ["write -P 1 0 64k", "truncate 4M",
                                "write -P 2 3M 1M"])
    qemu_check_clean(run, qemu_img, img)
    info = json.loads(run(qemu_img, "info", "--output=json", img,
                          check=True).stdout)
    assert info["virtual-size"] == 4 << 20
    apply(run, qemu_io, img, ["read -P 1 0 64k", "read -P 0 64k 2M",
                              "read -P 2 3M 1M"])


@pytest.mark.parametrize("compat", ["1.1", "0.10"])
def test_concurrent_zero_and_data_writes_share_clusters(
        run, qemu_img, qemu_io, blkimg_io, tmp_path, compat):
    """Zero writes and data writes in flight on disjoint bytes of the same
    clusters (partial clusters: the driver allocates for both) all
    survive."""
    img = str(tmp_path / "z.qcow2")
    run(qemu_img, "create", "-q", "-f", "qcow2", "-o",
        "cluster_size=4k,compat=" + compat, img, "1M", check=True)
    run(qemu_io, "-c", "write -P 9 0 1M", img, check=True)
    cmds = []
    model = bytearray(b"\x09" * (1 << 20))
    for i in range(128):
        off = i * 3000
        if i % 2:
            cmds.append("aio_write -z %d 3000" % off)
            model[off:off + 3000] = bytes(3000)
        else:
            cmds.append("aio_write -P %d %d 3000" % (i + 1, off))
            model[off:off + 3000] = bytes([i + 1]) * 3000
    cmds.append("aio_flush")
    apply(run, blkimg_io, img, cmds)
    qemu_check_clean(run, qemu_img, img)
    assert raw_of(run, qemu_img, img, tmp_path) == bytes(model)


def test_small_metadata_caches_evict_cleanly(run, qemu_img, qemu_io,
                                             blkimg_io, tmp_path):
    """l2-cache-size / refcount-cache-size far below the working set:
    dirty tables are written back on eviction in the right order."""
    img = str(tmp_path / "ev.qcow2")
    run(qemu_img, "create", "-q", "-f", "qcow2", "-o", "cluster_size=512",
        img, "8M", check=True)
    ref = str(tmp_path / "ref.qcow2")
    shutil.copy(img, ref)
    cmds = ["write -P %d %d 70000" % (i + 1, i * 131072 + i * 7)
            for i in range(60)]
    argv = [blkimg_io, "--image-opts"]
    for c in cmds:
        argv += ["-c", c]
    argv.append("driver=qcow2,l2-cache-size=8k,refcount-cache-size=8k,"
                "file.filename=" + img)
    cp = run(*argv)
    assert cp.returncode == 0 and cp.stdout.count("wrote") == 60, \
        cp.stdout + cp.stderr
    apply(run, qemu_io, ref, cmds)
    qemu_check_clean(run, qemu_img, img)
    assert raw_of(run, qemu_img, img, tmp_path) == \
        raw_of(run, qemu_img, ref, tmp_path)


DIRECT_SCRIPTS = [
    ["write -P 1 0 64k"],
    ["write -P 1 100k 4k", "write -P 2 40M 1M"],
    ["aio_write -P 3 0 64k", "aio_write -P 4 64k 64k",
     "aio_write -P 5 128k 64k", "aio_flush", "write -P 6 5M 3M"],
    ["write -z 0 10M", "write -P 7 10M 64k"],
    ["write -P 8 0 20M"],
]


@pytest.mark.parametrize("opts", ["cluster_size=64k", "cluster_size=4k"])
@pytest.mark.parametrize("cmds", DIRECT_SCRIPTS,
                         ids=[" ; ".join(c) for c in DIRECT_SCRIPTS])
def test_direct_writes_file_grows_ahead_and_is_cut_back(
        run, qemu_img, qemu_io, blkimg_io, tmp_path, opts, cmds):
    """With O_DIRECT the file grows ahead of new clusters (writes into
    allocated extents run in parallel; past the end of the file they are
    serialised); at close the file is cut back: it ends where qemu-io's
    copy ends, is clean, and reads the same."""
    base = str(tmp_path / "base.qcow2")
    run(qemu_img, "create", "-q", "-f", "qcow2", "-o", opts, base, "64M",
        check=True)
    q, b = str(tmp_path / "q.qcow2"), str(tmp_path / "b.qcow2")
    shutil.copyfile(base, q)
    shutil.copyfile(base, b)
    qargv = [qemu_io, "-t", "none", "-f", "qcow2"]
    for c in cmds:
        qargv += ["-c", c]
    cp = run(*qargv, q)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    argv = [blkimg_io, "-t", "none", "-f", "qcow2"]
    for c in cmds + ["sleep 700"]:
        argv += ["-c", c]
    p = subprocess.Popen(argv + [b], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    # while it sleeps, the file reaches at least 4 MiB past its last
    # cluster in use
    during = 0
    for _ in range(100):
        time.sleep(0.05)
        during = max(during, os.path.getsize(b))
        if during >= 4 << 20:
            break
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, out + err
    assert during >= 4 << 20
    assert os.path.getsize(b) == os.path.getsize(q)
    qemu_check_clean(run, qemu_img, b)
    assert raw_of(run, qemu_img, b, tmp_path) == raw_of(run, qemu_img, q,
                                                         tmp_path)


@pytest.mark.parametrize("cache", ["writeback", "none"])
def test_freed_clusters_reused_while_open(run, qemu_img, qemu_io, blkimg_io,
                                          tmp_path, cache):
    """100 MiB written, discarded, and written elsewhere in one session:
    the second write reuses the freed clusters as QEMU's allocator does,
    so the file stays QEMU's size (it used to grow to 172 MB, against
    QEMU's 105 MB) and the maps are the same; nothing leaks."""
    cmds = ["write -P 1 0 100M", "discard 0 100M", "write -P 2 200M 100M"]
    files = {}
    for name, tool in (("theirs", qemu_io), ("ours", blkimg_io)):
        img = str(tmp_path / (name + ".qcow2"))
        run(qemu_img, "create", "-q", "-f", "qcow2", img, "1G", check=True)
        argv = [tool, "-t", cache, "-f", "qcow2"]
        for c in cmds:
            argv += ["-c", c]
        cp = run(*argv, img)
        assert cp.returncode == 0 and "failed" not in cp.stdout, cp.stdout
        files[name] = img
    sizes = {k: os.path.getsize(v) for k, v in files.items()}
    assert sizes["ours"] == sizes["theirs"], sizes
    maps = {k: run(qemu_img, "map", "--output=json", v, check=True).stdout
            for k, v in files.items()}
    assert maps["ours"] == maps["theirs"]
    qemu_check_clean(run, qemu_img, files["ours"])
    cp = run(qemu_io, "-r", "-c", "read -P 2 200M 100M", "-c",
             "read -P 0 0 100M", files["ours"])
    assert "failed" not in cp.stdout, cp.stdout
