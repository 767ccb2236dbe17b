# SPDX-License-Identifier: MIT
"""Creation and resizing through the file driver, against QEMU 7.2 on the
same storage: the first block of a new (or grown-from-empty) image is
allocated (seed 003), preallocation off/falloc/full leave what QEMU leaves
(qemu-img map --output=json, sizes, contents), growing from empty works on an
O_DIRECT descriptor on 4096-byte-sector storage, and block devices refuse
what QEMU refuses with its words."""
import json
import os
import subprocess

import pytest

import storage
from storage import (bi_helper, file_storage, storage_disk,  # noqa: F401
                     storage_ext4_4k, storage_loop_4k, storage_ramfs,
                     storage_xfs_4k)

MiB = 1024 * 1024
pytestmark = [pytest.mark.root, pytest.mark.qemu]


def run(*argv, check=True):
    cp = subprocess.run([str(a) for a in argv], capture_output=True,
                        text=True)
    if check:
        assert cp.returncode == 0, (argv, cp.stdout, cp.stderr)
    return cp


def qmap(path):
    return json.loads(run("qemu-img", "map", "--output=json", "-f", "raw",
                          path).stdout)


def first_extent(m):
    e = m[0]
    return e["start"], e["length"], e["data"], e["zero"]


@pytest.mark.parametrize("prealloc", ["off", "falloc", "full"])
@pytest.mark.parametrize("size", [16 * MiB, 3072, 512, 0])
def test_create_matches_qemu(file_storage, bi_helper, prealloc, size):
    st = file_storage
    ours, theirs = st.path("ours.img"), st.path("theirs.img")
    run(bi_helper, "create", ours, size, prealloc)
    run("qemu-img", "create", "-q", "-f", "raw", "-o",
        "preallocation=" + prealloc, theirs, size)
    assert os.path.getsize(ours) == os.path.getsize(theirs) == size
    assert qmap(ours) == qmap(theirs)
    with open(ours, "rb") as f:
        assert f.read() == b"\0" * size


def test_create_allocates_first_block(file_storage, bi_helper):
    """seed 003: the map of a new 1 GiB image starts with a data block."""
    st = file_storage
    path = st.path("new.img")
    run(bi_helper, "create", path, "1G", "off")
    m = qmap(path)
    assert first_extent(m) == (0, 4096, True, False), m
    assert m[1]["start"] == 4096 and m[1]["zero"] and not m[1]["data"], m
    # And O_DIRECT detection on it is exact even without the kernel's
    # statement (probing, which a hole would fool).
    d = json.loads(subprocess.run(
        [bi_helper, "-f", "raw", "-t", "none", path, "limits"],
        capture_output=True, text=True, check=True,
        env=dict(os.environ, BLKIMG_LIMITS_SKIP="statx,xfs")).stdout)
    if st.kind == "tmpfs":
        assert d["request-alignment-source"] == "fallback", d
    else:
        assert d["request-alignment-source"] in ("probe", "XFS_IOC_DIOINFO")
        assert d["request-alignment"] == storage.sector_sizes(st)[0], d


def test_create_small_image_first_block_is_power_of_two(storage_disk,
                                                        bi_helper):
    path = storage_disk.path("small.img")
    run(bi_helper, "create", path, 3072, "off")
    m = qmap(path)
    # 2048 written (largest power of two <= 3072); ext4 allocates one
    # 4096-byte block for it, so the first 3072 bytes are data.
    assert m[0]["data"] and m[0]["start"] == 0, m


def test_create_keeps_existing_image_when_locked(storage_disk, bi_helper,
                                                 qemu_io):
    """Create takes the lock before truncating: an image held by qemu-io
    survives a mistaken create over it, and the error is QEMU's."""
    path = storage_disk.path("busy.qcow2")
    run("qemu-img", "create", "-q", "-f", "qcow2", path, "1M")
    before = open(path, "rb").read()
    holder = subprocess.Popen([qemu_io, "-f", "qcow2", path],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE)
    try:
        storage_wait_locked(path)
        cp = run(bi_helper, "create", path, "2M", "off", check=False)
        q = run("qemu-img", "create", "-q", "-f", "raw", path, "2M",
                check=False)
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
    assert cp.returncode == 1
    assert q.returncode == 1
    assert open(path, "rb").read() == before
    # qemu-img: "<file>: Failed to get "write" lock\nIs another ..."
    assert cp.stderr.split(": ", 1)[1] == q.stderr.split(": ", 1)[1], \
        (cp.stderr, q.stderr)


def storage_wait_locked(path, timeout=10.0):
    """Waits until qemu-io holds all its qcow2 read-write lock bytes."""
    import time
    want = (100, 101, 103, 201, 203)
    deadline = time.time() + timeout
    while time.time() < deadline:
        got = set()
        for start, end in storage.ofd_locks(path):
            got.update(b for b in want if start <= b <= end)
        if got == set(want):
            return
        time.sleep(0.05)
    pytest.fail("qemu-io did not lock %s" % path)


@pytest.mark.parametrize("cache", ["none", "writeback"])
def test_grow_from_empty_allocates_first_block(storage_ext4_4k, bi_helper,
                                               cache):
    """Max Reitz's review point: growing an empty image opened with O_DIRECT
    must allocate the first block too (aligned buffer, power-of-two size),
    on 4096-byte-sector storage. QEMU 7.2's qemu-io agrees."""
    st = storage_ext4_4k
    ours, theirs = st.path("ours.img"), st.path("theirs.img")
    for p in (ours, theirs):
        open(p, "wb").close()
    run(bi_helper, "-t", cache, "-f", "raw", ours, "truncate", "1M", "off")
    run("qemu-io", "-f", "raw", "-t", cache, "-c", "truncate 1M", theirs)
    assert os.path.getsize(ours) == MiB
    assert qmap(ours) == qmap(theirs)
    assert first_extent(qmap(ours)) == (0, 4096, True, False)


@pytest.mark.parametrize("prealloc", ["off", "falloc", "full"])
def test_grow_keeps_data_and_preallocates(storage_xfs_4k, bi_helper,
                                          prealloc):
    """Growing from an unaligned size on O_DIRECT: old bytes intact, new
    bytes zero, allocation as QEMU leaves it."""
    st = storage_xfs_4k
    ours, theirs = st.path("ours.img"), st.path("theirs.img")
    payload = bytes((i * 13 + 1) & 0xFF for i in range(5000))
    for p in (ours, theirs):
        with open(p, "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())  # no delayed allocation left to race
    run(bi_helper, "-t", "none", "-f", "file", ours, "truncate", "100000",
        prealloc)
    run("qemu-img", "resize", "-q", "-f", "raw", "--preallocation=" + prealloc,
        theirs, "100000")
    # Map first: reading unwritten extents through the page cache makes
    # xfs report them as data.
    assert qmap(ours) == qmap(theirs)
    with open(ours, "rb") as f:
        data = f.read()
    assert len(data) == 100000
    assert data == payload + b"\0" * (100000 - 5000)


def test_shrink(storage_disk, bi_helper):
    path = storage_disk.path("s.img")
    with open(path, "wb") as f:
        f.write(b"\x42" * MiB)
    run(bi_helper, "-f", "file", path, "truncate", "4096", "off")
    assert open(path, "rb").read() == b"\x42" * 4096


def test_metadata_preallocation_refused(storage_disk, bi_helper):
    path = storage_disk.path("m.img")
    cp = run(bi_helper, "create", path, "1M", "metadata", check=False)
    q = run("qemu-img", "create", "-q", "-f", "raw", "-o",
            "preallocation=metadata", storage_disk.path("q.img"), "1M",
            check=False)
    assert cp.returncode == q.returncode == 1
    assert cp.stderr.endswith(": Unsupported preallocation mode: metadata\n")
    assert q.stderr.endswith(": Unsupported preallocation mode: metadata\n")


def test_block_device_resize_refused(storage_loop_4k, bi_helper):
    dev = storage_loop_4k.device
    cp = run(bi_helper, "-f", "raw", dev, "truncate", "1M", "off",
             check=False)
    q = run("qemu-img", "resize", "-f", "raw", "--shrink", dev, "1M",
            check=False)
    assert cp.returncode == q.returncode == 1
    assert cp.stderr.endswith("Cannot resize device files\n"), cp.stderr
    assert q.stderr == "qemu-img: Cannot resize device files\n"


def test_block_device_create(storage_loop_4k, bi_helper):
    """Create on a device: size checked, first 512 bytes cleared (as QEMU
    does to erase an old header), nothing else touched."""
    dev = storage_loop_4k.device
    with open(dev, "r+b") as f:
        f.write(b"\x99" * 8192)
        f.flush()
        os.fsync(f.fileno())
    cp = run(bi_helper, "create", dev, "2G", "off", check=False)
    q = run("qemu-img", "create", "-q", "-f", "raw", dev, "2G", check=False)
    assert cp.returncode == q.returncode == 1
    assert cp.stderr.endswith("Cannot grow device files\n"), cp.stderr
    assert q.stderr.endswith("Cannot grow device files\n"), q.stderr
    run(bi_helper, "create", dev, "1M", "off")
    with open(dev, "rb") as f:
        head = f.read(8192)
    assert head == b"\0" * 512 + b"\x99" * (8192 - 512)


@pytest.mark.parametrize("opts", [[], ["-o", "preallocation=falloc"],
                                  ["-o", "preallocation=full"]])
def test_blkimg_create_map_matches_qemu_img(file_storage, blkimg, opts):
    """The tool end to end: `blkimg create -f raw` leaves the map
    `qemu-img create -f raw` leaves (first block allocated)."""
    st = file_storage
    ours, theirs = st.path("ours.img"), st.path("theirs.img")
    a = run(blkimg, "create", "-f", "raw", *opts, ours, "64M")
    b = run("qemu-img", "create", "-f", "raw", *opts, theirs, "64M")
    assert a.stdout.replace(ours, "X") == b.stdout.replace(theirs, "X")
    assert qmap(ours) == qmap(theirs)
    if not opts:
        assert first_extent(qmap(ours)) == (0, 4096, True, False)


def test_blkimg_io_o_direct_refused(storage_ramfs, blkimg_io):
    path = storage_ramfs.path("x.img")
    with open(path, "wb") as f:
        f.truncate(MiB)
    a = run(blkimg_io, "-f", "raw", "-t", "none", "-c", "read 0 512", path,
            check=False)
    b = run("qemu-io", "-f", "raw", "-t", "none", "-c", "read 0 512", path,
            check=False)
    assert a.returncode == b.returncode == 1
    assert a.stdout == b.stdout == ""
    assert a.stderr.count("\n") == 1, a.stderr
    assert "filesystem does not support O_DIRECT: Invalid argument" in \
        a.stderr


def xfs_extsize(path):
    cp = run("xfs_io", "-c", "extsize", path)
    return int(cp.stdout.split("]")[0].lstrip("["))


@pytest.mark.parametrize("opts,want", [(None, 1 << 20),
                                       ("extent_size_hint=64k", 65536),
                                       ("extent_size_hint=0", 0)])
def test_create_extent_size_hint_on_xfs(storage_xfs_4k, bi_helper, opts,
                                        want):
    """QEMU 7.2 gives new files an extent size hint (1 MiB by default) on
    xfs, against fragmentation of sparse images: so do we."""
    ours, theirs = storage_xfs_4k.path("o.img"), storage_xfs_4k.path("t.img")
    run(bi_helper, "create", ours, "16M", "off", *([opts] if opts else []))
    run("qemu-img", "create", "-q", "-f", "raw",
        *(["-o", opts] if opts else []), theirs, "16M")
    assert xfs_extsize(ours) == xfs_extsize(theirs) == want


@pytest.mark.parametrize("size", [1, 256, 511, 513, 100000])
def test_create_rounds_to_sectors(storage_disk, bi_helper, size):
    ours, theirs = storage_disk.path("o.img"), storage_disk.path("t.img")
    run(bi_helper, "create", ours, size, "off")
    run("qemu-img", "create", "-q", "-f", "raw", theirs, size)
    assert os.path.getsize(ours) == os.path.getsize(theirs) == \
        (size + 511) // 512 * 512
    assert qmap(ours) == qmap(theirs)
