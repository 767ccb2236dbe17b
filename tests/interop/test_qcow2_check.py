# SPDX-License-Identifier: MIT
"""blkimg check against qemu-img check: same output, exit codes and
repairs on clean, leaking and corrupted qcow2 images."""
import os
import shutil
import struct

import pytest

pytestmark = pytest.mark.qemu

REFBLOCK = 0x20000  # default layout of a 64 KiB-cluster image
L2 = 0x40000


def make(run, qemu_img, qemu_io, path, *cmds, opts=None):
    argv = [qemu_img, "create", "-q", "-f", "qcow2"]
    if opts:
        argv += ["-o", opts]
    run(*argv, path, "1M", check=True)
    if cmds:
        argv = [qemu_io]
        for c in cmds:
            argv += ["-c", c]
        run(*argv, path, check=True)


def poke(path, off, fmt, value):
    with open(path, "r+b") as f:
        f.seek(off)
        f.write(struct.pack(fmt, value))


def compare(run, qemu_img, blkimg, src, tmp_path, *args):
    """Runs both tools on identical copies; compares stdout, stderr, exit
    code and the repaired files."""
    a = str(tmp_path / "theirs.qcow2")
    b = str(tmp_path / "ours.qcow2")
    shutil.copy(src, a)
    shutil.copy(src, b)
    # same name length and directory so that messages compare equal
    q = run(qemu_img, "check", *args, os.path.basename(a), cwd=str(tmp_path))
    o = run(blkimg, "check", *args, os.path.basename(b), cwd=str(tmp_path))
    assert o.returncode == q.returncode, o.stdout + o.stderr
    assert o.stdout.replace("ours", "theirs") == q.stdout
    assert o.stderr.replace("blkimg:", "qemu-img:") == q.stderr
    with open(a, "rb") as fa, open(b, "rb") as fb:
        assert fa.read() == fb.read(), "repaired images differ"
    return o


@pytest.mark.parametrize("args", [[], ["--output=json"]],
                         ids=["human", "json"])
def test_check_clean(run, qemu_img, qemu_io, blkimg, tmp_path, args):
    img = str(tmp_path / "c.qcow2")
    make(run, qemu_img, qemu_io, img, "write 0 64k", "write 256k 64k",
         "write -c 512k 64k", "write -z 768k 64k")
    o = compare(run, qemu_img, blkimg, img, tmp_path, *args)
    assert o.returncode == 0


@pytest.mark.parametrize("args", [[], ["--output=json"], ["-r", "leaks"],
                                  ["-r", "all"],
                                  ["-r", "leaks", "--output=json"]])
def test_check_leak(run, qemu_img, qemu_io, blkimg, tmp_path, args):
    img = str(tmp_path / "l.qcow2")
    make(run, qemu_img, qemu_io, img, "write 0 64k")
    poke(img, REFBLOCK + 2 * 5, ">H", 2)  # data cluster 5: refcount 2
    o = compare(run, qemu_img, blkimg, img, tmp_path, *args)
    assert o.returncode == (0 if "-r" in args else 2)


@pytest.mark.parametrize("args", [[], ["--output=json"], ["-r", "leaks"],
                                  ["-r", "all"], ["-r", "all",
                                                  "--output=json"]])
def test_check_corruption(run, qemu_img, qemu_io, blkimg, tmp_path, args):
    """Two L2 entries share a cluster whose refcount is 1."""
    img = str(tmp_path / "k.qcow2")
    make(run, qemu_img, qemu_io, img, "write 0 64k")
    poke(img, L2 + 8, ">Q", 0x8000000000050000)
    o = compare(run, qemu_img, blkimg, img, tmp_path, *args)
    assert o.returncode == (0 if "all" in args else 2)


def test_check_only_leaks_exit_3(run, qemu_img, qemu_io, blkimg, tmp_path):
    img = str(tmp_path / "e.qcow2")
    make(run, qemu_img, qemu_io, img, "write 0 64k")
    # a cluster past the data with refcount 1 and no reference
    with open(img, "r+b") as f:
        f.seek(0, 2)
        f.write(b"\0" * 65536)
    poke(img, REFBLOCK + 2 * 6, ">H", 1)
    o = compare(run, qemu_img, blkimg, img, tmp_path)
    assert o.returncode == 3
    o = compare(run, qemu_img, blkimg, img, tmp_path, "-r", "leaks")
    assert o.returncode == 0


def test_check_blkimg_written_is_clean(run, qemu_img, blkimg, blkimg_io,
                                       tmp_path):
    img = str(tmp_path / "w.qcow2")
    run(blkimg, "create", "-q", "-f", "qcow2", "-o", "cluster_size=4k", img,
        "8M", check=True)
    run(blkimg_io, "-c", "write -P 1 0 3M", "-c", "write -z 1M 64k", "-c",
        "discard 2M 128k", "-c", "write -c 4M 4k", img, check=True)
    o = compare(run, qemu_img, blkimg, img, tmp_path)
    assert o.returncode == 0
    assert "No errors were found on the image." in o.stdout


def test_check_raw_unsupported(run, qemu_img, blkimg, tmp_path):
    img = str(tmp_path / "r.raw")
    with open(img, "wb") as f:
        f.truncate(1 << 20)
    q = run(qemu_img, "check", "-f", "raw", img)
    o = run(blkimg, "check", "-f", "raw", img)
    assert q.returncode == 63 and o.returncode == 63
    assert o.stderr.replace("blkimg:", "qemu-img:") == q.stderr


def test_check_bad_repair_option(run, qemu_img, blkimg, tmp_path):
    img = str(tmp_path / "b.qcow2")
    run(qemu_img, "create", "-q", "-f", "qcow2", img, "1M", check=True)
    q = run(qemu_img, "check", "-r", "some", img)
    o = run(blkimg, "check", "-r", "some", img)
    assert o.returncode == q.returncode == 1
    assert o.stderr.replace("blkimg", "qemu-img") == q.stderr


def test_check_rebuilds_refcounts(run, qemu_img, qemu_io, blkimg, tmp_path):
    """Referenced clusters with refcount 0: -r all rebuilds the refcount
    structure as qemu-img does; the data stays readable."""
    img = str(tmp_path / "rb.qcow2")
    make(run, qemu_img, qemu_io, img, "write -P 1 0 512k",
         "write -c -P 2 768k 64k")
    poke(img, REFBLOCK + 2 * 4, ">H", 0)  # the L2 table
    poke(img, REFBLOCK + 2 * 8, ">H", 0)  # a data cluster
    o = run(blkimg, "check", img)
    assert o.returncode == 2, o.stdout + o.stderr
    o = run(blkimg, "check", "-r", "all", img)
    assert o.returncode == 0, o.stdout + o.stderr
    assert "Rebuilding refcount structure" in o.stderr
    assert "    2 corruptions" in o.stdout
    q = run(qemu_img, "check", img)
    assert q.returncode == 0, q.stdout + q.stderr
    cp = run(qemu_io, "-r", "-c", "read -P 1 0 512k", "-c",
             "read -P 2 768k 64k", img)
    assert cp.returncode == 0 and "failed" not in cp.stdout, cp.stdout


def test_dirty_image_repaired_on_write_open(run, qemu_img, qemu_io, blkimg_io,
                                            tmp_path):
    """A dirty lazy-refcounts image (refcounts missing, as after a crash
    in QEMU) is repaired when opened read-write, then marked clean."""
    img = str(tmp_path / "dy.qcow2")
    make(run, qemu_img, qemu_io, img, "write -P 1 0 512k",
         opts="lazy_refcounts=on")
    poke(img, 72, ">Q", 1)  # dirty bit
    for c in range(5, 13):
        poke(img, REFBLOCK + 2 * c, ">H", 0)
    cp = run(blkimg_io, "-c", "write -P 2 768k 64k", img)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    q = run(qemu_img, "check", "--output=json", img)
    assert q.returncode == 0, q.stdout + q.stderr
    info = run(qemu_img, "info", "--output=json", img, check=True).stdout
    assert '"dirty-flag": false' in info
    cp = run(qemu_io, "-r", "-c", "read -P 1 0 512k", "-c",
             "read -P 2 768k 64k", img)
    assert cp.returncode == 0 and "failed" not in cp.stdout, cp.stdout


def test_bitmaps_listed_and_accounted(run, qemu_img, blkimg, tmp_path):
    """Persistent bitmaps: info lists them as qemu-img does, check counts
    their clusters (no false leaks, so -r leaks cannot destroy them)."""
    img = str(tmp_path / "bm.qcow2")
    run(qemu_img, "create", "-q", "-f", "qcow2", img, "4M", check=True)
    run(qemu_img, "bitmap", "--add", img, "b0", check=True)
    run(qemu_img, "bitmap", "--add", "-g", "128k", "--disable", img,
        "b\"1", check=True)
    for args in (["info"], ["info", "--output=json"]):
        q = run(qemu_img, *args, img, check=True)
        b = run(blkimg, *args, img, check=True)
        assert b.stdout == q.stdout
    o = compare(run, qemu_img, blkimg, img, tmp_path)
    assert o.returncode == 0
    # a repair run leaves the bitmaps valid (QEMU itself rewrites the
    # bitmap directory when it closes, so the files are not compared)
    o = run(blkimg, "check", "-r", "leaks", img)
    assert o.returncode == 0 and "Leaked" not in o.stderr, o.stderr
    q = run(qemu_img, "check", img)
    assert q.returncode == 0 and not q.stderr, q.stderr
    assert run(blkimg, "info", img).stdout == run(qemu_img, "info",
                                                  img).stdout
