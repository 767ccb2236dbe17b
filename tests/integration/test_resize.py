# SPDX-License-Identifier: MIT
"""blkimg resize against qemu-img 7.2: messages, exit codes and the
resulting image (size, bytes, allocation; qcow2 checked and compared)."""
import os
import re
import shutil
import subprocess

import pytest

from ops_helpers import copy_sparse, layout, same_file, twin_copy
from test_convert_helpers import MiB, blocks, data_map, make_raw, read, run2

# Long (hundreds of qemu-img runs): the normal build runs it, the sanitizer
# build skips it (`slow`) to keep `make check` short.
pytestmark = [pytest.mark.qemu, pytest.mark.slow]

RAW_CASES = [
    "IMG 20M",
    "IMG -5M",
    "IMG xyz",
    "IMG",
    "--shrink IMG -5M",
    "--shrink -f raw IMG -5M",
    "--preallocation=full -f raw IMG 10M",
    "--preallocation=foo IMG +1M",
    "--preallocation=falloc -f raw IMG +1M",
    "--preallocation=full -f raw IMG +3M",
    "--preallocation=off -f raw IMG +3M",
    "-f raw IMG -- -100M",
    "-f raw IMG 0",
    "-q -f raw IMG 12M",
    "-q -f raw IMG 2M",
    "-f qcow2 IMG 12M",
    "-f raw IMG +1.5M",
    "-f raw IMG 1E",
    "-f raw MISSING 1G",
    "-f raw IMG 10000001",
    "-f raw IMG 2G",
    "-f raw IMG +0",
    "-f raw IMG 10M",
    "-x -f raw IMG 10M",
    "-f raw IMG 10M 11M",
    "resize",
]


def _argv(case, img, tmp_path):
    out = ["resize"]
    for a in case.split():
        if a == "resize":
            continue
        out.append(img if a == "IMG" else
                   str(tmp_path / "missing") if a == "MISSING" else a)
    return out


def same_bytes(qemu_img, a, b):
    """Byte equality; large sparse files through qemu-img compare, which
    skips holes instead of reading gigabytes of zeroes."""
    if os.path.getsize(a) <= 64 * MiB:
        return same_file(a, b)
    cp = subprocess.run([qemu_img, "compare", "-q", "-f", "raw", "-F", "raw",
                         str(a), str(b)])
    return cp.returncode == 0


@pytest.mark.parametrize("case", RAW_CASES)
def test_resize_raw_matches_qemu(qemu_img, blkimg, tmp_path, case):
    src = make_raw(tmp_path / "src.raw", size=10 * MiB, seed=21)
    q = tmp_path / "q.raw"
    b = tmp_path / "b.raw"
    shutil.copy(src, q)
    shutil.copy(src, b)
    rq = run2(qemu_img, _argv(case, str(q), tmp_path))
    rb = run2(blkimg, _argv(case, str(b), tmp_path))
    rb = (rb[0], rb[1], rb[2].replace(str(b), str(q)))
    assert rb == rq
    assert os.path.getsize(b) == os.path.getsize(q)
    assert same_bytes(qemu_img, b, q)
    if "preallocation=full" in case or "preallocation=falloc" in case:
        assert blocks(b) == blocks(q)


def test_resize_real_stack(qemu_img, blkimg, tmp_path):
    img = tmp_path / "i.raw"
    with open(img, "wb") as f:
        f.write(b"\x5a" * 4096)
    assert run2(blkimg, ["resize", "-f", "raw", img, "2G"]) == \
        (0, b"Image resized.\n", "")
    assert os.path.getsize(img) == 2 << 30
    with open(img, "rb") as f:
        assert f.read(4096) == b"\x5a" * 4096


@pytest.mark.parametrize("case", ["IMG 20M", "IMG +7M", "IMG -5M",
                                  "--shrink IMG -5M",
                                  "--shrink -f qcow2 IMG 5M",
                                  "--shrink -f qcow2 IMG 3000k",
                                  "-f qcow2 IMG 1T",
                                  "-f qcow2 IMG 0"])
def test_resize_qcow2(qemu_img, blkimg, prebuilt, tmp_path, case):
    def build(d):
        subprocess.run([qemu_img, "create", "-f", "qcow2", d / "base.qcow2",
                        "10M"], check=True, capture_output=True)
        subprocess.run(["qemu-io", "-c", "write -P 1 0 9M",
                        d / "base.qcow2"], check=True, capture_output=True)
    base = prebuilt("resize-qcow2", build) / "base.qcow2"
    q = tmp_path / "q.qcow2"
    b = tmp_path / "b.qcow2"
    shutil.copy(base, q)
    shutil.copy(base, b)
    rq = run2(qemu_img, _argv(case, str(q), tmp_path))
    rb = run2(blkimg, _argv(case, str(b), tmp_path))
    assert rb == rq
    cp = subprocess.run([qemu_img, "check", b], capture_output=True,
                        text=True)
    assert cp.returncode == 0, cp.stdout
    cp = subprocess.run([qemu_img, "compare", "-s", q, b],
                        capture_output=True, text=True)
    assert cp.stdout == "Images are identical.\n"


# ---- qcow2 growth with preallocation, shrink across L2 tables, backing
# files, external data files and snapshots: the same image as qemu-img's
# (bytes of the image file and its data file, map, file size), check clean

QIO = shutil.which("qemu-io") or "qemu-io"


def _sh(*cmd, cwd=None):
    subprocess.run([str(c) for c in cmd], check=True, capture_output=True,
                   cwd=cwd)


def _make_base(qemu_img, d):
    _sh(qemu_img, "create", "-q", "-f", "qcow2", "base.qcow2", "64M", cwd=d)
    _sh(QIO, "-c", "write -P 9 0 64M", "base.qcow2", cwd=d)


@pytest.fixture
def twin_qcow2(qemu_img, prebuilt, tmp_path):
    """twin_qcow2(create, size, io, snaps=()) -> (q, b): img.qcow2 made with
    qemu-img and qemu-io once, copied into q/ and b/; with a backing file
    (-b in create), base.qcow2 (64M of 0x09, built once per worker)
    beside it."""
    def twin_(create, size, io, snaps=()):
        dd = tmp_path / "src"
        dd.mkdir()
        if "-b" in create:
            base = prebuilt("resize-base", lambda d: _make_base(qemu_img, d))
            copy_sparse(base / "base.qcow2", dd / "base.qcow2")
        _sh(qemu_img, "create", "-q", "-f", "qcow2", *create, "img.qcow2",
            size, cwd=dd)
        for c in io:
            _sh(QIO, "-c", c, "img.qcow2", cwd=dd)
        for name, cmds in snaps:
            _sh(qemu_img, "snapshot", "-c", name, "img.qcow2", cwd=dd)
            for c in cmds:
                _sh(QIO, "-c", c, "img.qcow2", cwd=dd)
        return twin_copy(dd, tmp_path)
    return twin_


def _qmap(qemu_img, img):
    cp = subprocess.run([qemu_img, "map", "-U", "--output=json", img.name],
                        capture_output=True, text=True, check=True,
                        cwd=img.parent)
    return [re.sub(r'"filename": "[^"]*"', "", line)
            for line in cp.stdout.splitlines()]


def _check_clean(qemu_img, img):
    # in the image's directory: qemu-img opens a relative data file name
    # from the working directory
    cp = subprocess.run([qemu_img, "check", img.name], capture_output=True,
                        text=True, cwd=img.parent)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    assert "No errors were found" in cp.stdout


def _resize_both(qemu_img, blkimg, q, b, args):
    """resize [options] img.qcow2 SIZE (args: the options, then SIZE)."""
    argv = ["resize"] + args[:-1] + ["img.qcow2", args[-1]]
    return run2(qemu_img, argv, cwd=q), run2(blkimg, argv, cwd=b)


def _header_cluster_same(q, b):
    """Whole image files equal."""
    return same_file(q / "img.qcow2", b / "img.qcow2")


PREALLOC_CASES = [
    # (create options, size, qemu-io commands, resize arguments)
    ([], "10M", ["write -P 1 0 9M"], ["--preallocation=metadata", "30M"]),
    ([], "10M", ["write -P 1 0 9M"], ["--preallocation=falloc", "30M"]),
    ([], "10M", ["write -P 1 0 9M"], ["--preallocation=full", "30M"]),
    ([], "10M", ["write -P 1 0 9M"], ["--preallocation=off", "30M"]),
    ([], "10M", ["write -P 1 0 9M"], ["--preallocation=metadata", "3G"]),
    ([], "10M", ["write -P 1 0 9M"], ["--preallocation=falloc", "+600M"]),
    # unaligned new end: the rest of the last cluster as QEMU leaves it
    ([], "10M", ["write -P 1 0 9M"], ["--preallocation=metadata", "10241k"]),
    ([], "10M", ["write -P 1 0 9M"], ["--preallocation=metadata", "20001k"]),
    ([], "10M", ["write -P 1 0 9M"], ["--preallocation=falloc", "10241k"]),
    # unaligned old end: its partial cluster carried over
    ([], "10241k", ["write -P 1 0 10241k"],
     ["--preallocation=metadata", "30M"]),
    ([], "10241k", ["write -P 1 0 10241k"], ["--preallocation=falloc", "30M"]),
    ([], "10241k", ["write -P 1 0 1k"], ["--preallocation=full", "10242k"]),
    (["-o", "extended_l2=on"], "10M", ["write -P 1 0 9M"],
     ["--preallocation=metadata", "100M"]),
    (["-o", "extended_l2=on"], "10M", ["write -P 1 0 9M"],
     ["--preallocation=falloc", "100M"]),
    (["-o", "extended_l2=on"], "10241k", ["write -P 1 0 10241k"],
     ["--preallocation=falloc", "100M"]),
    (["-o", "compat=0.10"], "10M", ["write -P 1 0 9M"],
     ["--preallocation=falloc", "100M"]),
    (["-o", "cluster_size=2M"], "10M", ["write -P 1 0 9M"],
     ["--preallocation=metadata", "100M"]),
    # 512-byte clusters: the refcount table grows past one cluster at 8 MiB
    (["-o", "cluster_size=512"], "10M", ["write -P 1 0 9M"],
     ["--preallocation=falloc", "40M"]),
    (["-o", "cluster_size=512"], "10M", ["write -P 1 0 9M"],
     ["--preallocation=metadata", "40M"]),
    (["-o", "refcount_bits=1"], "10M", ["write -P 1 0 9M"],
     ["--preallocation=falloc", "100M"]),
    # a backing file reaching past the old end must not show through
    (["-b", "base.qcow2", "-F", "qcow2"], "10M", ["write -P 1 0 9M"],
     ["100M"]),
    (["-b", "base.qcow2", "-F", "qcow2"], "10M", ["write -P 1 0 9M"],
     ["--preallocation=metadata", "100M"]),
    (["-b", "base.qcow2", "-F", "qcow2"], "10M", ["write -P 1 0 9M"],
     ["--preallocation=falloc", "100M"]),
    (["-b", "base.qcow2", "-F", "qcow2"], "10241k", ["write -P 1 0 10241k"],
     ["30M"]),
    (["-b", "base.qcow2", "-F", "qcow2", "-o", "extended_l2=on"], "10M",
     ["write -P 1 0 9M"], ["--preallocation=metadata", "100M"]),
    (["-b", "base.qcow2", "-F", "qcow2", "-o", "compat=0.10"], "10M",
     ["write -P 1 0 9M"], ["100M"]),
    # shrink: L2 tables past the end freed, the file cut as QEMU does
    ([], "3G", ["write -P 1 0 1M", "write -P 2 1500M 2M",
                "write -P 3 2900M 1M"], ["--shrink", "100M"]),
    ([], "3G", ["write -P 1 0 1M", "write -P 2 1500M 2M",
                "write -P 3 2900M 1M"], ["--shrink", "1600M"]),
    ([], "10M", ["write -P 1 0 9M"], ["--shrink", "3000k"]),
    # errors
    ([], "10M", ["write -P 1 0 9M"], ["--preallocation=metadata", "5M"]),
    ([], "10M", ["write -P 1 0 9M"],
     ["--preallocation=falloc", "--shrink", "5M"]),
    ([], "10M", ["write -P 1 0 9M"], ["--preallocation=full", "10M"]),
    ([], "10M", ["write -P 1 0 9M"], ["--preallocation=bogus", "20M"]),
    ([], "10M", ["write -P 1 0 9M"], ["--preallocation=metadata",
                                      "10485761"]),
    ([], "10M", ["write -P 1 0 9M"], ["10485761"]),
]


def _pid(c):
    return " ".join(c[0] + [c[1]] + c[3])


@pytest.mark.parametrize("case", PREALLOC_CASES, ids=_pid)
def test_resize_qcow2_prealloc(qemu_img, blkimg, twin_qcow2, case):
    create, size, io, args = case
    q, b = twin_qcow2(create, size, io)
    rq, rb = _resize_both(qemu_img, blkimg, q, b, args)
    assert rb == rq
    qi, bi = q / "img.qcow2", b / "img.qcow2"
    # metadata preallocation needing new refcount blocks: QEMU puts them
    # after the run they describe, blkimg before it (same map otherwise)
    exact = not (args[0] == "--preallocation=metadata" and
                 ("cluster_size=512" in create or args[-1] == "3G"))
    if exact:
        assert os.path.getsize(bi) == os.path.getsize(qi)
    _check_clean(qemu_img, bi)
    cp = subprocess.run([qemu_img, "compare", qi, bi], capture_output=True,
                        text=True)
    assert cp.stdout == "Images are identical.\n", cp.stdout
    if exact:
        assert _qmap(qemu_img, bi) == _qmap(qemu_img, qi)
        assert _header_cluster_same(q, b)
    else:
        # which clusters are holes in the file differs with the layout
        assert layout(qemu_img, bi, file_holes=True) == \
            layout(qemu_img, qi, file_holes=True)
    if any(a.startswith("--preallocation=f") for a in args) and rq[0] == 0:
        # the data clusters are allocated in the file as QEMU's
        assert data_map(bi) == data_map(qi)


@pytest.mark.parametrize("args", [["--preallocation=off", "30M"],
                                  ["--preallocation=metadata", "30M"],
                                  ["--preallocation=falloc", "30M"],
                                  ["--preallocation=full", "30M"],
                                  ["--shrink", "5M"]], ids=" ".join)
@pytest.mark.parametrize("raw", [False, True], ids=["data", "data-raw"])
def test_resize_qcow2_data_file(qemu_img, blkimg, twin_qcow2, args, raw):
    """External data file: mapped at the guest offsets, the data file grown
    (with the preallocation) or cut as qemu-img does."""
    opt = "data_file=img.data" + (",data_file_raw=on" if raw else "")
    q, b = twin_qcow2(["-o", opt], "10M", ["write -P 1 0 9M"])
    rq, rb = _resize_both(qemu_img, blkimg, q, b, args)
    assert rb == rq == (0, b"Image resized.\n", "")
    for name in ("img.qcow2", "img.data"):
        assert os.path.getsize(b / name) == os.path.getsize(q / name)
        assert same_file(b / name, q / name)
    assert data_map(b / "img.data") == data_map(q / "img.data")
    _check_clean(qemu_img, b / "img.qcow2")
    assert _qmap(qemu_img, b / "img.qcow2") == _qmap(qemu_img, q / "img.qcow2")


@pytest.mark.parametrize("args", [["20M"], ["--shrink", "5M"],
                                  ["--preallocation=falloc", "20M"],
                                  ["--preallocation=metadata", "20M"]],
                         ids=" ".join)
def test_resize_qcow2_snapshots(qemu_img, blkimg, twin_qcow2, args):
    """v3 images with internal snapshots resize (the snapshots keep their
    size and contents); v2 ones are refused as by qemu-img."""
    snaps = [("s1", ["write -P 2 4M 6M", "write -z 0 64k"])]
    q, b = twin_qcow2([], "10M", ["write -P 1 0 9M"], snaps)
    rq, rb = _resize_both(qemu_img, blkimg, q, b, args)
    assert rb == rq == (0, b"Image resized.\n", "")
    # (built separately, the snapshot tables would differ in their dates)
    assert os.path.getsize(b / "img.qcow2") == os.path.getsize(q / "img.qcow2")
    assert _qmap(qemu_img, b / "img.qcow2") == _qmap(qemu_img, q / "img.qcow2")
    _check_clean(qemu_img, b / "img.qcow2")
    for d in (q, b):
        _sh(qemu_img, "convert", "-l", "snapshot.name=s1", "-O", "raw",
            "img.qcow2", "s1.raw", cwd=d)
        _sh(qemu_img, "snapshot", "-a", "s1", "img.qcow2", cwd=d)
    assert read(b / "s1.raw") == read(q / "s1.raw")
    s1 = read(b / "s1.raw")[:9 << 20]
    assert s1 == b"\x01" * len(s1)
    _check_clean(qemu_img, b / "img.qcow2")
    cp = subprocess.run([qemu_img, "compare", q / "img.qcow2",
                         b / "img.qcow2"], capture_output=True, text=True)
    assert cp.stdout == "Images are identical.\n"


def test_resize_qcow2_v2_snapshots_refused(qemu_img, blkimg, twin_qcow2):
    q, b = twin_qcow2(["-o", "compat=0.10"], "10M", ["write -P 1 0 1M"],
                      [("s1", [])])
    rq, rb = _resize_both(qemu_img, blkimg, q, b, ["20M"])
    assert rb == rq
    assert rq[0] == 1 and "Can't resize a v2 image which has snapshots" in rq[2]
    _check_clean(qemu_img, b / "img.qcow2")
    assert _qmap(qemu_img, b / "img.qcow2") == _qmap(qemu_img, q / "img.qcow2")
