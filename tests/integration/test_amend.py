# SPDX-License-Identifier: MIT
"""blkimg amend against qemu-img 7.2: output (progress lines included),
exit code, header cluster, qemu-img info, guest bytes, allocation and
qemu-img check on identical qcow2 images (v3 with a backing file and zero
clusters, v3 without backing, v2)."""
import pytest

from ops_helpers import (Content, check_ok, copy_sparse, guest_bytes,
                         info_lines, layout, pristine_view, qio, run_both,
                         same_file, sh, twin_copy)

# Long (hundreds of qemu-img runs): the normal build runs it, the sanitizer
# build skips it (`slow`) to keep `make check` short.
pytestmark = [pytest.mark.qemu, pytest.mark.slow]

MiB = 1024 * 1024


def build(qemu_img, d):
    sh(qemu_img, "create", "-q", "-f", "qcow2", "base.qcow2", "4M", cwd=d)
    qio("base.qcow2", "write -P 1 0 4M", cwd=d)
    # backed v3: data, zero clusters (plain and preallocated), holes
    sh(qemu_img, "create", "-q", "-f", "qcow2", "-b", "base.qcow2", "-F",
       "qcow2", "a.qcow2", cwd=d)
    qio("a.qcow2", "write -P 2 0 1M", "write -z 1M 1M", "write -P 3 3M 64k",
        "write -z 3M 64k", "write -P 4 3200k 1000", cwd=d)
    # no backing file
    sh(qemu_img, "create", "-q", "-f", "qcow2", "n.qcow2", "4M", cwd=d)
    qio("n.qcow2", "write -P 2 0 1M", "write -z 1M 1M", cwd=d)
    # v2 with lazy refcounts impossible; plain v2 image
    sh(qemu_img, "create", "-q", "-f", "qcow2", "-o", "compat=0.10",
       "v2.qcow2", "4M", cwd=d)
    qio("v2.qcow2", "write -P 5 64k 1M", cwd=d)
    # v3 with lazy refcounts, several L2 tables of zeroes
    # (4 KiB clusters: an L2 table per 2 MiB, progress in many steps)
    sh(qemu_img, "create", "-q", "-f", "qcow2", "-o",
       "lazy_refcounts=on,cluster_size=4k", "lazy.qcow2", "64M", cwd=d)
    qio("lazy.qcow2", "write -z 0 20M", "write -P 6 20M 64k",
        "write -z 30M 10M", cwd=d)
    sh(qemu_img, "create", "-q", "-f", "raw", "r.raw", "1M", cwd=d)


@pytest.fixture
def images(qemu_img, prebuilt):
    """The directory in which build() made the images, once per worker:
    tests copy the files they need (twin) and never touch these."""
    return prebuilt("amend", lambda d: build(qemu_img, d))


# the images with the files they need beside them
CHAINS = {"a.qcow2": ["a.qcow2", "base.qcow2"]}


def twin(images, tmp_path, img=None):
    """q/ (for qemu-img) and b/ (for blkimg): copies of img and its backing
    file, or (img None) of every image."""
    return twin_copy(images, tmp_path,
                     None if img is None else CHAINS.get(img, [img]))


IMAGES = ["a.qcow2", "n.qcow2", "v2.qcow2", "lazy.qcow2"]

OPTIONS = [
    ["-o", "compat=0.10"],  # real stack
    ["-p", "-o", "compat=0.10"],
    ["-p", "-o", "compat=v2"],
    ["-o", "compat=1.1", "-p"],
    ["-o", "compat=v3,lazy_refcounts=on"],
    ["-p", "-o", "lazy_refcounts=on"],
    ["-o", "lazy_refcounts=off"],
    ["-o", "lazy_refcounts=off,compat=0.10"],
    ["-o", "compat=0.10,lazy_refcounts=on"],
    ["-o", "compat=1.1", "-o", "lazy_refcounts=on"],
    ["-o", "size=8M"],
    ["-q", "-p", "-o", "size=128M"],
    ["-o", "refcount_bits=16"],
    ["-o", "compat=0.10,refcount_bits=8"],
    ["-o", "refcount_bits=3"],
    ["-o", "refcount_bits=abc"],
    ["-o", "compat=2"],
    ["-o", "compat"],
    ["-o", "lazy_refcounts=x"],
    ["-o", "size=abc"],
    ["-o", "size=2M,,"],
    ["-o", ",,"],
    ["-o", ""],
    ["-o", "foo=bar", "-p"],
    ["-o", "cluster_size=4k"],
    ["-o", "extended_l2=on"],
    ["-o", "nocow=on"],
    ["-o", "backing_file=x"],
    ["-o", "backing_fmt=raw"],
    ["-o", "data_file=x"],
    ["-o", "data_file_raw=on"],
    ["-o", "encrypt.state=active"],
    ["-o", "help"],
    ["-f", "qcow2", "-o", "help"],
    ["-t", "bad", "-o", "size=4M"],
    ["-p"],
    ["-x", "-o", "size=4M"],
    ["-o", "size=4M", "-f", "raw"],
]


def _ids(c):
    return " ".join(c) or "none"


def _compare(qemu_img, q, b, img, tmp_path):
    """Returns what the guest reads from blkimg's image."""
    assert info_lines(qemu_img, b / img) == info_lines(qemu_img, q / img)
    view = guest_bytes(qemu_img, b / img, tmp_path)
    assert view == guest_bytes(qemu_img, q / img, tmp_path)
    assert layout(qemu_img, b / img) == layout(qemu_img, q / img)
    rc, out = check_ok(qemu_img, b / img)
    assert rc == 0, out
    # the header cluster as qemu-img writes it (fields, extensions)
    with open(q / img, "rb") as f:
        hq = f.read(4096)
    with open(b / img, "rb") as f:
        assert f.read(4096) == hq
    return view


@pytest.mark.parametrize("img", IMAGES)
@pytest.mark.parametrize("opts", OPTIONS, ids=_ids)
def test_amend_matches_qemu(qemu_img, blkimg, images, tmp_path, opts, img):
    q, b = twin(images, tmp_path, img)
    before = pristine_view(qemu_img, q / img, tmp_path)
    rq, rb = run_both(qemu_img, blkimg, ["amend"] + opts + [img], q, b)
    assert rb == rq
    view = _compare(qemu_img, q, b, img, tmp_path)
    # amend never changes what the guest reads (size changes aside)
    if not any(o.startswith("size=") for o in opts):
        assert view == before


@pytest.mark.parametrize("args", [
    ["amend", "-o", "size=2M", "r.raw"],
    ["amend", "-f", "raw", "-o", "size=2M", "r.raw"],
    ["amend", "-f", "raw", "-o", "help"],
    ["amend", "-o", "compat=1.1", "a.qcow2", "n.qcow2"],
    ["amend", "-o", "compat=1.1", "missing.qcow2"],
    ["amend", "-o", "compat=1.1"],
    ["amend", "a.qcow2"],
], ids=_ids)
def test_amend_errors_match_qemu(qemu_img, blkimg, images, tmp_path, args):
    q, b = twin(images, tmp_path)
    rq, rb = run_both(qemu_img, blkimg, args, q, b)
    assert rb == rq
    assert rq[0] != 0 or "help" in args


def test_amend_round_trip(qemu_img, blkimg, images, tmp_path):
    """Down to 0.10 and back up with blkimg alone: same bytes as qemu-img
    doing the same, every step passes check."""
    q, b = twin(images, tmp_path, "a.qcow2")
    for o in ("compat=0.10", "compat=1.1", "lazy_refcounts=on",
              "compat=0.10,lazy_refcounts=off", "compat=1.1"):
        rq, rb = run_both(qemu_img, blkimg, ["amend", "-o", o, "a.qcow2"],
                          q, b)
        assert rb == rq == (0, b"", "")
        _compare(qemu_img, q, b, "a.qcow2", tmp_path)


# ---- refcount width changes, zero clusters in snapshots, v2 snapshots
# without extra data

import itertools  # noqa: E402
import os  # noqa: E402
import shutil  # noqa: E402
import struct  # noqa: E402
import subprocess  # noqa: E402


def make_base(qemu_img, d):
    sh(qemu_img, "create", "-q", "-f", "qcow2", "base.qcow2", "64M", cwd=d)
    qio("base.qcow2", "write -P 9 0 64M", cwd=d)


def make(qemu_img, d, base, create, size, io, snaps=()):
    """i.qcow2 in d; base.qcow2 (64M of 0x09, copied from the directory
    base) beside it when i.qcow2 is created with a backing file."""
    if "-b" in create:
        copy_sparse(base / "base.qcow2", d / "base.qcow2")
    sh(qemu_img, "create", "-q", "-f", "qcow2", *create, "i.qcow2", size,
       cwd=d)
    for c in io:
        qio("i.qcow2", c, cwd=d)
    for name, cmds in snaps:
        sh(qemu_img, "snapshot", "-c", name, "i.qcow2", cwd=d)
        for c in cmds:
            qio("i.qcow2", c, cwd=d)


@pytest.fixture
def twin2(qemu_img, prebuilt, tmp_path):
    """twin2(create, size, io, snaps) -> (q, b): make()'s images built once
    and copied (the snapshot dates the same)."""
    base = prebuilt("amend-base", lambda d: make_base(qemu_img, d))

    def twin2_(*a, **kw):
        src = tmp_path / "src"
        src.mkdir()
        make(qemu_img, src, base, *a, **kw)
        return twin_copy(src, tmp_path)
    return twin2_


_snap_views = itertools.count()


def snapshot_views(qemu_img, d, tmp_path):
    """Every snapshot's guest bytes (qemu-img convert -l) and the image
    after qemu-img snapshot -a on a copy."""
    cp = subprocess.run([qemu_img, "snapshot", "-l", "i.qcow2"], cwd=d,
                        capture_output=True, text=True, check=True)
    names = [l.split()[1] for l in cp.stdout.splitlines()[2:]]
    out = {}
    for name in names:
        raw = tmp_path / ("s-%d.raw" % next(_snap_views))
        sh(qemu_img, "convert", "-l", "snapshot.name=" + name, "-O", "raw",
           "i.qcow2", raw, cwd=d)
        out[name] = Content(raw)
        shutil.copy(d / "i.qcow2", d / "a.qcow2")
        sh(qemu_img, "snapshot", "-a", name, "a.qcow2", cwd=d)
        rc, msg = check_ok(qemu_img, d / "a.qcow2")
        assert rc == 0, msg
        out[name + "-applied"] = guest_bytes(qemu_img, d / "a.qcow2",
                                             tmp_path)
        os.unlink(d / "a.qcow2")
    return out


REFCOUNT_CASES = [
    # (create options, qemu-io commands, snapshots, amend arguments)
    ([], ["write -P 1 0 9M", "write -z 20M 1M"], [],
     ["-o", "refcount_bits=1"]),
    ([], ["write -P 1 0 9M"], [], ["-p", "-o", "refcount_bits=2"]),
    ([], ["write -P 1 0 9M"], [], ["-o", "refcount_bits=4"]),
    ([], ["write -P 1 0 9M"], [], ["-p", "-o", "refcount_bits=8"]),
    ([], ["write -P 1 0 9M"], [], ["-o", "refcount_bits=32"]),
    ([], ["write -P 1 0 9M"], [], ["-p", "-o", "refcount_bits=64"]),
    # many refcount blocks, far apart (4k clusters: 64 MiB needs 8 blocks
    # of 16-bit entries, 32 of 64-bit ones)
    (["-o", "cluster_size=4k"], ["write -P 1 0 64M",
                                 "write -P 3 700M 32M"], [],
     ["-p", "-o", "refcount_bits=64"]),
    (["-o", "cluster_size=4k,refcount_bits=64"],
     ["write -P 1 0 64M", "write -P 3 700M 32M"], [],
     ["-p", "-o", "refcount_bits=1"]),
    # snapshots: refcounts of 2 fit 2 bits, not 1
    ([], ["write -P 1 0 9M"], [("s1", ["write -P 2 0 1M"])],
     ["-o", "refcount_bits=2"]),
    ([], ["write -P 1 0 9M"], [("s1", ["write -P 2 0 1M"])],
     ["-o", "refcount_bits=1"]),
    # combined with compat changes (one progress over both operations)
    (["-o", "compat=0.10"], ["write -P 1 0 9M"], [],
     ["-p", "-o", "compat=1.1,refcount_bits=4"]),
    (["-o", "refcount_bits=8"], ["write -P 1 0 9M", "write -z 10M 1M"], [],
     ["-p", "-o", "compat=0.10,refcount_bits=16"]),
    (["-o", "refcount_bits=8"], ["write -P 1 0 9M"], [],
     ["-o", "compat=0.10"]),
]


@pytest.mark.parametrize("case", REFCOUNT_CASES,
                         ids=lambda c: " ".join(c[0] + c[3]))
def test_amend_refcount_bits(qemu_img, blkimg, tmp_path, twin2, case):
    create, io, snaps, args = case
    size = "1G" if "cluster_size=4k" in " ".join(create) else "64M"
    q, b = twin2(create, size, io, snaps)
    rq, rb = run_both(qemu_img, blkimg, ["amend"] + args + ["i.qcow2"], q, b)
    assert rb == rq
    # the same image, byte for byte
    assert same_file(q / "i.qcow2", b / "i.qcow2")
    rc, out = check_ok(qemu_img, b / "i.qcow2")
    assert rc == 0, out
    assert info_lines(qemu_img, b / "i.qcow2") == \
        info_lines(qemu_img, q / "i.qcow2")


ZERO_SNAP_IO = ["write -P 1 0 2M", "write -z 2M 1M", "write -z 4M 64k"]
# zero writes after the snapshots over clusters they do not share
ZERO_SNAPS = [("s1", ["write -P 2 1M 1M", "write -z 8M 128k",
                      "write -z 16M 64k"]),
              ("s2", ["write -P 3 8M 64k", "write -z 24M 64k"])]
# "write -z 0 64k" after s1 keeps the cluster s1 shares (zero flag on a
# preallocated cluster): qemu-img 7.2 zeroes it in place and s1 loses its
# bytes there; blkimg drops the active table's reference instead
SHARED_SNAPS = [("s1", ["write -P 2 1M 1M", "write -z 0 64k",
                        "write -z 8M 128k"]),
                ("s2", ["write -P 3 8M 64k", "write -z 1M 64k"])]


@pytest.mark.parametrize("shared", [False, True], ids=["", "shared"])
@pytest.mark.parametrize("backed", [False, True], ids=["plain", "backed"])
@pytest.mark.parametrize("progress", [False, True], ids=["", "-p"])
def test_amend_downgrade_zero_clusters_in_snapshots(qemu_img, blkimg,
                                                    tmp_path, twin2, backed,
                                                    progress, shared):
    """compat=0.10 expands the zero clusters of every snapshot too; every
    snapshot reads the same afterwards."""
    create = ["-b", "base.qcow2", "-F", "qcow2"] if backed else []
    q, b = twin2(create, "64M", ZERO_SNAP_IO,
                 SHARED_SNAPS if shared else ZERO_SNAPS)
    before = snapshot_views(qemu_img, b, tmp_path)
    active = guest_bytes(qemu_img, b / "i.qcow2", tmp_path)
    args = ["amend"] + (["-p"] if progress else []) + \
        ["-o", "compat=0.10", "i.qcow2"]
    rq, rb = run_both(qemu_img, blkimg, args, q, b)
    assert rb == rq
    assert rq[0] == 0
    rc, out = check_ok(qemu_img, b / "i.qcow2")
    assert rc == 0, out
    assert info_lines(qemu_img, b / "i.qcow2") == \
        info_lines(qemu_img, q / "i.qcow2")
    assert guest_bytes(qemu_img, b / "i.qcow2", tmp_path) == active
    assert guest_bytes(qemu_img, q / "i.qcow2", tmp_path) == active
    assert snapshot_views(qemu_img, b, tmp_path) == before
    if not shared:
        assert layout(qemu_img, b / "i.qcow2") == \
            layout(qemu_img, q / "i.qcow2")
        assert snapshot_views(qemu_img, q, tmp_path) == before
    with open(b / "i.qcow2", "rb") as f:
        assert struct.unpack(">I", f.read(8)[4:])[0] == 2


def strip_snapshot_extra(path):
    """Rewrites the snapshot table in place without extra data, as old
    QEMU versions wrote v2 images."""
    with open(path, "r+b") as f:
        h = f.read(72)
        nb, off = struct.unpack(">IQ", h[60:72])
        pos, ents = off, []
        for _ in range(nb):
            f.seek(pos)
            e = struct.unpack(">QIHHIIQII", f.read(40))
            f.seek(pos + 40 + e[8])
            ids, name = f.read(e[2]), f.read(e[3])
            ents.append(e[:8] + (ids, name))
            pos = (pos + 40 + e[8] + e[2] + e[3] + 7) & ~7
        out = b""
        for e in ents:
            rec = struct.pack(">QIHHIIQII", *e[:8], 0) + e[8] + e[9]
            out += rec + b"\0" * (-len(rec) % 8)
        f.seek(off)
        f.write(out + b"\0" * (pos - off - len(out)))


@pytest.mark.parametrize("args", [["-o", "compat=1.1"],
                                  ["-p", "-o", "compat=1.1"],
                                  ["-o", "compat=1.1,lazy_refcounts=on"],
                                  ["-o", "compat=1.1,refcount_bits=8"]],
                         ids=_ids)
def test_amend_upgrade_snapshots_without_extra(qemu_img, blkimg, tmp_path,
                                               twin2, args):
    """compat=1.1 on a v2 image whose snapshots lack the v3 extra data:
    the snapshot table is written anew, as qemu-img does."""
    q, b = twin2(["-o", "compat=0.10"], "64M",
                 ["write -P 1 0 2M"],
                 [("s1", ["write -P 2 1M 2M"]),
                  ("snap-two", ["write -P 3 0 64k"])])
    for d in (q, b):
        strip_snapshot_extra(d / "i.qcow2")
    before = snapshot_views(qemu_img, b, tmp_path)
    rq, rb = run_both(qemu_img, blkimg, ["amend"] + args + ["i.qcow2"], q, b)
    assert rb == rq
    assert rq[0] == 0
    rc, out = check_ok(qemu_img, b / "i.qcow2")
    assert rc == 0, out
    assert info_lines(qemu_img, b / "i.qcow2") == \
        info_lines(qemu_img, q / "i.qcow2")
    assert layout(qemu_img, b / "i.qcow2") == layout(qemu_img, q / "i.qcow2")
    views = snapshot_views(qemu_img, b, tmp_path)
    assert views == before
    assert views == snapshot_views(qemu_img, q, tmp_path)
    # the header cluster and the new snapshot table's entries as qemu-img's
    with open(q / "i.qcow2", "rb") as f:
        hq = f.read(65536)
    with open(b / "i.qcow2", "rb") as f:
        assert f.read(65536) == hq
