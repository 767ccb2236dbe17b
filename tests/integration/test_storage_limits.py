# SPDX-License-Identifier: MIT
"""Direct-I/O limits of the file driver on real storage.

Expected values come from the kernel's own description of each device
(/sys/.../queue: logical_block_size, dma_alignment, max_sectors_kb), never
from our code: the disk under /tmp (512-byte sectors), a 4096-byte-sector
loop device with ext4 and with xfs, the loop device itself, tmpfs (O_DIRECT
without alignment rules: only the fallback is safe) and ramfs (no O_DIRECT).
Images whose block 0 is a hole must still be detected exactly (seed 003).
"""
import json
import os
import subprocess

import pytest

import storage
from storage import (any_storage, bi_helper, file_storage,  # noqa: F401
                     storage_disk, storage_ext4_4k, storage_loop_4k,
                     storage_ramfs, storage_tmpfs, storage_xfs_4k)

PAGE = os.sysconf("SC_PAGE_SIZE")
FALLBACK = max(4096, PAGE)
MiB = 1024 * 1024

pytestmark = [pytest.mark.root]


def queue_dir(st):
    """/sys queue directory of the block device under storage st."""
    if st.device:
        return "/sys/block/%s/queue" % os.path.basename(
            os.path.realpath(st.device))
    s = os.stat(st.dir)
    base = "/sys/dev/block/%d:%d" % (os.major(s.st_dev), os.minor(s.st_dev))
    q = base + "/queue"
    return q if os.path.isdir(q) else base + "/../queue"


def queue_value(st, name):
    with open(os.path.join(queue_dir(st), name)) as f:
        return int(f.read())


def fs_type(st):
    if st.is_block_device:
        return "block device"
    cp = subprocess.run(["findmnt", "-n", "-o", "FSTYPE", "--target", st.dir],
                        capture_output=True, text=True, check=True)
    return cp.stdout.strip()


def limits(helper, path, cache="none", env=None, fmt="raw", extra=()):
    e = dict(os.environ)
    if env:
        e.update(env)
    cp = subprocess.run([helper, *extra, "-f", fmt, "-t", cache, path,
                         "limits"], capture_output=True, text=True, env=e)
    assert cp.returncode == 0, cp.stderr
    return json.loads(cp.stdout)


def make_image(st, name="img", size=MiB, allocate_first=True):
    """An image on st: block 0 written (as qemu-img create leaves it) or a
    hole. For the block device: the device itself."""
    path = st.path(name)
    if st.is_block_device:
        return path
    with open(path, "wb") as f:
        f.truncate(size)
        if allocate_first:
            f.write(b"\0" * 4096)
    return path


def expected_direct(st):
    """(request alignment, source, min mem alignment, source) the kernel
    states for O_DIRECT on st."""
    if st.kind == "tmpfs":
        # tmpfs states nothing and accepts any O_DIRECT read: fallback.
        return FALLBACK, "fallback", FALLBACK, "fallback"
    return (queue_value(st, "logical_block_size"), "statx",
            queue_value(st, "dma_alignment") + 1, "statx")


def test_direct_limits_match_the_kernel(any_storage, bi_helper):
    st = any_storage
    d = limits(bi_helper, make_image(st))
    req, req_src, mem, mem_src = expected_direct(st)
    assert d["request-alignment"] == req, d
    assert d["request-alignment-source"] == req_src, d
    assert d["min-mem-alignment"] == mem, d
    assert d["mem-alignment-source"] == mem_src, d
    assert d["opt-mem-alignment"] == max(mem, PAGE), d
    assert d["max-iov"] == os.sysconf("SC_IOV_MAX"), d
    assert d["page-size"] == PAGE
    assert d["filesystem"] == fs_type(st), d
    assert d["is-block-device"] == st.is_block_device
    logical, physical = storage.sector_sizes(st)
    assert (d["logical-sector-size"], d["physical-sector-size"]) == \
        (logical, physical), d
    if st.is_block_device:
        assert d["max-transfer"] == queue_value(st, "max_sectors_kb") * 1024
        assert d["size"] == storage.LOOP_SIZE
    else:
        assert d["max-transfer"] == 0


def test_buffered_limits_need_no_alignment(any_storage, bi_helper):
    for cache in ("writeback", "writethrough", "unsafe"):
        d = limits(bi_helper, make_image(any_storage), cache=cache)
        assert d["request-alignment"] == 1, (cache, d)
        assert d["min-mem-alignment"] == 1, (cache, d)
        assert d["opt-mem-alignment"] == PAGE, (cache, d)
        assert d["request-alignment-source"] == "buffered"
        assert d["mem-alignment-source"] == "buffered"


def test_directsync_is_direct(storage_ext4_4k, bi_helper):
    d = limits(bi_helper, make_image(storage_ext4_4k), cache="directsync")
    assert d["request-alignment"] == 4096, d


@pytest.mark.parametrize("kind", ["disk", "ext4-4k", "xfs-4k"])
def test_hole_at_block_zero_is_detected_exactly(kind, bi_helper):
    """Block 0 unallocated: O_DIRECT reads of any size succeed there, but
    the kernel's statement still gives the exact value."""
    with storage.make(kind) as st:
        path = make_image(st, allocate_first=False)
        # Really a hole (else the test proves nothing).
        assert os.stat(path).st_blocks == 0
        d = limits(bi_helper, path)
        assert d["request-alignment"] == queue_value(st,
                                                     "logical_block_size"), d
        assert d["request-alignment-source"] == "statx"
        assert d["min-mem-alignment"] == queue_value(st, "dma_alignment") + 1


@pytest.mark.parametrize("kind", ["disk", "ext4-4k"])
def test_probing_is_not_fooled_by_holes(kind, bi_helper):
    """Without the kernel's statement, probing a hole would accept 1 byte:
    that is no answer and must fall back to max(4096, page) (never 1). With
    block 0 allocated (as our create does) the probe finds the exact
    sector size."""
    skip = {"BLKIMG_LIMITS_SKIP": "statx,xfs"}
    with storage.make(kind) as st:
        logical = queue_value(st, "logical_block_size")
        hole = make_image(st, "hole", allocate_first=False)
        d = limits(bi_helper, hole, env=skip)
        assert d["request-alignment"] == FALLBACK, d
        assert d["request-alignment-source"] == "fallback", d
        assert d["min-mem-alignment"] == FALLBACK, d
        assert d["mem-alignment-source"] == "fallback", d

        data = make_image(st, "data", allocate_first=True)
        d = limits(bi_helper, data, env=skip)
        assert d["request-alignment"] == logical, d
        assert d["request-alignment-source"] == "probe", d
        assert d["min-mem-alignment"] == queue_value(st, "dma_alignment") + 1
        assert d["mem-alignment-source"] == "probe", d


def test_xfs_dioinfo_source(storage_xfs_4k, bi_helper):
    """statx ignored: XFS_IOC_DIOINFO gives the request alignment even for a
    hole at block 0; the buffer alignment comes from probing."""
    path = make_image(storage_xfs_4k, allocate_first=True)
    d = limits(bi_helper, path, env={"BLKIMG_LIMITS_SKIP": "statx"})
    assert d["request-alignment"] == 4096, d
    assert d["request-alignment-source"] == "XFS_IOC_DIOINFO", d
    assert d["min-mem-alignment"] == \
        queue_value(storage_xfs_4k, "dma_alignment") + 1, d
    assert d["mem-alignment-source"] == "probe", d
    hole = make_image(storage_xfs_4k, "hole", allocate_first=False)
    d = limits(bi_helper, hole, env={"BLKIMG_LIMITS_SKIP": "statx"})
    assert d["request-alignment"] == 4096, d
    assert d["request-alignment-source"] == "XFS_IOC_DIOINFO", d


def test_blkssz_source(storage_loop_4k, bi_helper):
    st = storage_loop_4k
    d = limits(bi_helper, st.device, env={"BLKIMG_LIMITS_SKIP": "statx"})
    assert d["request-alignment"] == 4096, d
    assert d["request-alignment-source"] == "BLKSSZGET", d
    assert d["min-mem-alignment"] == queue_value(st, "dma_alignment") + 1, d
    assert d["mem-alignment-source"] == "BLKSSZGET", d
    # Nothing stated at all: a block device has no holes, probing is exact.
    d = limits(bi_helper, st.device,
               env={"BLKIMG_LIMITS_SKIP": "statx,blkssz"})
    assert d["request-alignment"] == 4096, d
    assert d["request-alignment-source"] == "probe", d


def test_o_direct_refused_with_one_clear_line(storage_ramfs, bi_helper,
                                              qemu_io):
    path = make_image(storage_ramfs)
    cp = subprocess.run([bi_helper, "-t", "none", path, "limits"],
                        capture_output=True, text=True)
    assert cp.returncode == 1
    msg = cp.stderr
    assert msg.count("\n") == 1, msg
    assert "'%s'" % path in msg
    assert "filesystem does not support O_DIRECT" in msg
    assert "Invalid argument" in msg
    assert "cache=writeback" in msg
    # QEMU refuses it too, with the same exit code.
    q = subprocess.run([qemu_io, "-f", "raw", "-t", "none", "-c", "read 0 512",
                        path], capture_output=True, text=True)
    assert q.returncode == cp.returncode
    assert "filesystem does not support O_DIRECT" in q.stderr
    # Buffered opens work there.
    d = limits(bi_helper, path, cache="writeback")
    assert d["request-alignment"] == 1
    assert d["filesystem"] == "ramfs"


def test_missing_file_error(storage_disk, bi_helper):
    path = storage_disk.path("missing.img")
    cp = subprocess.run([bi_helper, "-t", "none", path, "limits"],
                        capture_output=True, text=True)
    assert cp.returncode == 1
    assert cp.stderr == ("helper: Could not open '%s': Could not open '%s': "
                         "No such file or directory\n" % (path, path))


def test_directory_error_matches_qemu(storage_disk, bi_helper, qemu_img):
    d = storage_disk.dir
    cp = subprocess.run([bi_helper, "-r", d, "limits"], capture_output=True,
                        text=True)
    q = subprocess.run([qemu_img, "info", d], capture_output=True, text=True)
    assert cp.returncode == q.returncode == 1
    want = "Could not open '%s': 'file' driver requires '%s' to be a " \
        "regular file\n" % (d, d)
    assert cp.stderr == "helper: " + want
    assert q.stderr == "qemu-img: " + want
