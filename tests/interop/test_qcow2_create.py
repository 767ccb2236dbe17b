# SPDX-License-Identifier: MIT
"""blkimg create -f qcow2 against qemu-img create: the same file, byte for
byte, the same "Formatting" line and the same errors."""
import os
import subprocess

import pytest

pytestmark = pytest.mark.qemu

SAME_BYTES = [
    "", "compat=0.10", "cluster_size=512", "cluster_size=4096",
    "cluster_size=8192", "cluster_size=2M", "refcount_bits=1",
    "refcount_bits=64", "lazy_refcounts=on", "extended_l2=on",
    "compression_type=zstd", "preallocation=metadata",
    "data_file=DATA", "data_file=DATA,data_file_raw=on",
    "extended_l2=on,preallocation=metadata,backing_file=BASE,"
    "backing_fmt=qcow2",
    "backing_file=BASE,backing_fmt=qcow2",
    "compat=0.10,backing_file=BASE,backing_fmt=qcow2",
    "cluster_size=1024,backing_file=BASE,backing_fmt=qcow2",
]


def create_both(run, qemu_img, blkimg, tmp_path, opts, size="100M"):
    outs = []
    for tool, sub in ((qemu_img, "q"), (blkimg, "b")):
        d = tmp_path / sub
        d.mkdir(exist_ok=True)
        run(qemu_img, "create", "-q", "-f", "qcow2", str(d / "base.qcow2"),
            "64M", check=True)
        o = opts.replace("DATA", "img.data").replace("BASE", "base.qcow2")
        argv = [tool, "create", "-f", "qcow2"]
        if o:
            argv += ["-o", o]
        cp = run(*argv, "img.qcow2", size, cwd=str(d))
        outs.append((cp, d))
    return outs


@pytest.mark.parametrize("opts", SAME_BYTES)
def test_create_identical(run, qemu_img, blkimg, tmp_path, opts):
    (q, qd), (b, bd) = create_both(run, qemu_img, blkimg, tmp_path, opts)
    assert q.returncode == 0 and b.returncode == 0, b.stderr
    assert b.stdout == q.stdout
    with open(qd / "img.qcow2", "rb") as f1, open(bd / "img.qcow2",
                                                  "rb") as f2:
        assert f1.read() == f2.read()
    if "DATA" in opts:
        assert os.path.getsize(qd / "img.data") == os.path.getsize(
            bd / "img.data")
    # QEMU looks for a data file relative to its working directory
    cp = run(qemu_img, "check", "img.qcow2", cwd=str(bd))
    assert cp.returncode == 0, cp.stdout + cp.stderr


@pytest.mark.parametrize("opts", ["preallocation=falloc",
                                  "preallocation=full",
                                  "cluster_size=512,preallocation=metadata"])
def test_create_preallocated_clean(run, qemu_img, blkimg, tmp_path, opts):
    (q, qd), (b, bd) = create_both(run, qemu_img, blkimg, tmp_path, opts,
                                   "5M")
    assert b.returncode == 0, b.stderr
    assert b.stdout == q.stdout
    cp = run(qemu_img, "check", str(bd / "img.qcow2"))
    assert cp.returncode == 0, cp.stdout + cp.stderr
    cp = run(qemu_img, "compare", str(qd / "img.qcow2"),
             str(bd / "img.qcow2"))
    assert cp.returncode == 0, cp.stdout


# Preallocated creates, laid out as QEMU lays them out (an empty image grown
# with the preallocation mode): several L2 tables, a second refcount block,
# partial last clusters and subclusters, external data files.
PREALLOC_SAME = [
    ("preallocation=metadata", "600M"),
    ("preallocation=metadata", "3G"),
    ("preallocation=falloc", "1000001"),
    ("preallocation=full", "7777777"),
    ("preallocation=falloc,cluster_size=4k", "40M"),
    ("preallocation=metadata,cluster_size=4k,refcount_bits=1", "40M"),
    ("preallocation=full,cluster_size=2M", "5M"),
    ("preallocation=metadata,compat=0.10", "1000001"),
    ("preallocation=falloc,lazy_refcounts=on", "3M"),
    ("preallocation=metadata,extended_l2=on", "1000000"),
    ("preallocation=falloc,extended_l2=on", "100000"),
    ("preallocation=falloc,extended_l2=on,backing_file=BASE,"
     "backing_fmt=qcow2", "1050000"),
    ("preallocation=metadata,data_file=DATA", "1050000"),
    ("preallocation=full,data_file=DATA,data_file_raw=on", "7777777"),
    ("preallocation=metadata,extended_l2=on,data_file=DATA", "100000"),
    ("data_file=DATA,data_file_raw=on", "1000000"),
]


def same_file(a, b):
    """Byte for byte (cmp: the files may be large and sparse)."""
    return subprocess.run(["cmp", "-s", str(a), str(b)]).returncode == 0


@pytest.mark.parametrize("opts,size", PREALLOC_SAME,
                         ids=["%s-%s" % c for c in PREALLOC_SAME])
def test_create_preallocated_identical(run, qemu_img, blkimg, tmp_path, opts,
                                       size):
    (q, qd), (b, bd) = create_both(run, qemu_img, blkimg, tmp_path, opts,
                                   size)
    assert q.returncode == 0 and b.returncode == 0, b.stderr
    assert b.stdout == q.stdout
    assert same_file(qd / "img.qcow2", bd / "img.qcow2")
    if "DATA" in opts:
        assert same_file(qd / "img.data", bd / "img.data")
    cp = run(qemu_img, "check", "img.qcow2", cwd=str(bd))
    assert cp.returncode == 0, cp.stdout + cp.stderr


@pytest.mark.root
@pytest.mark.parametrize("mode", ["falloc", "full"])
def test_create_preallocation_no_space(run, qemu_img, blkimg, small_tmpfs,
                                       mode):
    """Out of space while preallocating: qemu-img's message, exit code 1,
    and the half-made image removed, as qemu-img removes it."""
    mnt = small_tmpfs("8M")
    res = []
    for tool in (qemu_img, blkimg):
        cp = run(tool, "create", "-q", "-f", "qcow2", "-o",
                 "preallocation=" + mode, "x.qcow2", "64M", cwd=str(mnt))
        res.append((cp.returncode, cp.stdout,
                    cp.stderr.replace("blkimg:", "qemu-img:"),
                    sorted(os.listdir(mnt))))
    assert res[1] == res[0]
    assert res[0][0] == 1 and res[0][3] == []
    assert "No space left on device" in res[0][2]


ERRORS = [
    "cluster_size=1000", "refcount_bits=3", "compat=0.10,refcount_bits=8",
    "compat=0.10,lazy_refcounts=on", "compat=0.10,extended_l2=on",
    "extended_l2=on,cluster_size=4k", "compat=0.10,compression_type=zstd",
    "compat=0.10,data_file=x.raw", "data_file_raw=on",
    "compression_type=lz4", "compat=2.0", "lazy_refcounts=maybe",
    "data_file=x.raw,data_file_raw=on,backing_file=BASE,backing_fmt=qcow2",
    "backing_file=BASE,preallocation=metadata,backing_fmt=qcow2", "foo=bar",
]


@pytest.mark.parametrize("opts", ERRORS)
def test_create_errors(run, qemu_img, blkimg, tmp_path, opts):
    (q, qd), (b, bd) = create_both(run, qemu_img, blkimg, tmp_path, opts,
                                   "1M")
    assert q.returncode == 1 and b.returncode == 1
    assert b.stdout == q.stdout
    assert b.stderr.replace("blkimg:", "qemu-img:") == q.stderr
