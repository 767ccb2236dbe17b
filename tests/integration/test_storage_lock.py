# SPDX-License-Identifier: MIT
"""Image locking against QEMU 7.2's own tools, both ways.

QEMU's file-posix locks (OFD byte-range locks on bytes 100+bit for each
permission held and 200+bit for each permission not shared) are what keeps
two programs from writing one image. A raw image shares everything in QEMU
(two read-write qemu-io on one raw file coexist); a qcow2 image shares no
write and no resize. The tests hold the image with one side and open it with
the other, checking exit codes and QEMU's two-line message."""
import os
import subprocess
import time

import pytest

from storage import bi_helper, storage_disk, storage_xfs_4k  # noqa: F401
from storage import ofd_locks

pytestmark = [pytest.mark.qemu]

HINT = "Is another process using the image [%s]?"


def run(*argv):
    return subprocess.run([str(a) for a in argv], capture_output=True,
                          text=True)


def locked_bytes(path):
    """Byte ranges of path covered by OFD locks, from /proc/locks."""
    return ofd_locks(path)


def wait_locked(path, *byte_list, timeout=10.0):
    """Waits until OFD locks cover every given byte of path (a holder
    takes its bytes one by one: wait for all of them)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        ranges = locked_bytes(path)
        if all(any(a <= b <= e for a, e in ranges) for b in byte_list):
            return
        time.sleep(0.05)
    pytest.fail("bytes %s of %s not locked" % (byte_list, path))


# The bytes each kind of holder ends up locking (QEMU 7.2).
QCOW2_RW = (100, 101, 103, 201, 203)
RAW_RW = (100, 101)


class QemuIoHolder:
    """qemu-io kept open in interactive mode (commands from a pipe)."""

    def __init__(self, path, fmt, *opts):
        self.p = subprocess.Popen(["qemu-io", *opts, "-f", fmt, path],
                                  stdin=subprocess.PIPE,
                                  stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE)
        wait_locked(path, *(QCOW2_RW if fmt == "qcow2" else RAW_RW))

    def close(self):
        self.p.stdin.close()
        try:
            self.p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()


class OurHolder:
    """The libblkimg helper holding the image open."""

    def __init__(self, helper, path, fmt, *opts):
        self.p = subprocess.Popen([helper, *opts, "-f", fmt, path, "hold",
                                   "120"], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)
        line = self.p.stdout.readline()
        if line != "locked\n":
            self.p.wait()
            pytest.fail("helper could not hold %s: %s" % (path,
                                                         self.p.stderr.read()))

    def close(self):
        self.p.terminate()
        self.p.wait(timeout=30)


@pytest.fixture
def qcow2_image(storage_disk):
    path = storage_disk.path("img.qcow2")
    cp = run("qemu-img", "create", "-q", "-f", "qcow2", path, "1M")
    assert cp.returncode == 0, cp.stderr
    return path


def helper_open(helper, path, fmt, *opts):
    return run(helper, *opts, "-f", fmt, path, "limits")


def test_qemu_writer_blocks_our_writer(qcow2_image, bi_helper):
    path = qcow2_image
    h = QemuIoHolder(path, "qcow2")
    try:
        ours = helper_open(bi_helper, path, "raw")
        theirs = run("qemu-io", "-f", "raw", "-c", "read 0 512", path)
        ours_ro = helper_open(bi_helper, path, "raw", "-r")
        ours_u = helper_open(bi_helper, path, "raw", "-r", "-U")
    finally:
        h.close()
    want = "Could not open '%s': Failed to get \"write\" lock\n%s\n" % (
        path, HINT % path)
    assert theirs.returncode == 1
    assert theirs.stderr == "qemu-io: can't open device %s: " % path + \
        want.split(": ", 1)[1]
    assert ours.returncode == 1
    assert ours.stderr == "helper: " + want
    # A reader that shares writes is fine (as with qemu-io -r -f raw).
    assert ours_ro.returncode == 0, ours_ro.stderr
    assert ours_u.returncode == 0, ours_u.stderr
    # Released: we can open it read-write now.
    assert helper_open(bi_helper, path, "raw").returncode == 0


def test_our_writer_blocks_qemu(qcow2_image, bi_helper):
    path = qcow2_image
    h = OurHolder(bi_helper, path, "raw")
    try:
        wait_locked(path, *RAW_RW)
        io_rw = run("qemu-io", "-f", "qcow2", "-c", "read 0 512", path)
        info = run("qemu-img", "info", path)
        info_u = run("qemu-img", "info", "-U", path)
        io_raw = run("qemu-io", "-f", "raw", "-c", "read 0 512", path)
    finally:
        h.close()
    msg = "Failed to get shared \"write\" lock\n%s\n" % (HINT % path)
    assert io_rw.returncode == 1
    assert io_rw.stderr == "qemu-io: can't open device %s: %s" % (path, msg)
    assert info.returncode == 1
    assert info.stderr == "qemu-img: Could not open '%s': %s" % (path, msg)
    assert info_u.returncode == 0, info_u.stderr
    # QEMU semantics for raw: writers that share coexist.
    assert io_raw.returncode == 0, io_raw.stderr
    # Our locks are gone with the process.
    assert run("qemu-img", "info", path).returncode == 0


def test_our_reader_does_not_block(qcow2_image, bi_helper):
    path = qcow2_image
    h = OurHolder(bi_helper, path, "raw", "-r")
    try:
        wait_locked(path, 100)
        io_rw = run("qemu-io", "-f", "qcow2", "-c", "write 0 512", path)
    finally:
        h.close()
    assert io_rw.returncode == 0, io_rw.stderr


def test_no_lock_bytes_after_close(storage_xfs_4k, bi_helper):
    path = storage_xfs_4k.path("x.img")
    open(path, "wb").close()
    os.truncate(path, 1 << 20)
    assert helper_open(bi_helper, path, "raw", "-t", "none").returncode == 0
    assert ofd_locks(path) == []


def test_qcow2_writer_refuses_sharing_writes(qcow2_image, bi_helper):
    """A qcow2 image open read-write by us: metadata is ours alone, so a
    raw writer (QEMU) must be refused, and our qcow2 reader refused while
    QEMU writes through raw."""
    path = qcow2_image
    h = OurHolder(bi_helper, path, "qcow2")
    try:
        io_raw = run("qemu-io", "-f", "raw", "-c", "read 0 512", path)
        io_ro = run("qemu-io", "-r", "-f", "raw", "-c", "read 0 512", path)
    finally:
        h.close()
    assert io_raw.returncode == 1, io_raw.stderr
    assert io_raw.stderr == "qemu-io: can't open device %s: Failed to get " \
        "\"write\" lock\n%s\n" % (path, HINT % path)
    assert io_ro.returncode == 0, io_ro.stderr

    h = QemuIoHolder(path, "raw")
    try:
        ours = helper_open(bi_helper, path, "qcow2", "-r")
        ours_u = helper_open(bi_helper, path, "qcow2", "-r", "-U")
    finally:
        h.close()
    assert ours.returncode == 1
    assert ours.stderr == "helper: Could not open '%s': Failed to get " \
        "shared \"write\" lock\n%s\n" % (path, HINT % path)
    assert ours_u.returncode == 0, ours_u.stderr


def strip_prog(s, prog):
    assert s.startswith(prog + ": "), s
    return s[len(prog) + 2:]


def test_tools_refused_like_qemu_tools(qcow2_image, blkimg, blkimg_io):
    """While qemu-io writes the image: blkimg info / blkimg-io fail exactly
    as qemu-img info / qemu-io do (exit code, both lines); -U works."""
    path = qcow2_image
    h = QemuIoHolder(path, "qcow2")
    try:
        ours = run(blkimg, "info", path)
        theirs = run("qemu-img", "info", path)
        ours_io = run(blkimg_io, "-c", "read 0 512", path)
        theirs_io = run("qemu-io", "-c", "read 0 512", path)
        ours_u = run(blkimg, "info", "-U", path)
    finally:
        h.close()
    assert ours.returncode == theirs.returncode == 1
    assert strip_prog(ours.stderr, "blkimg") == \
        strip_prog(theirs.stderr, "qemu-img")
    assert ours.stdout == theirs.stdout == ""
    assert ours_io.returncode == theirs_io.returncode == 1
    assert strip_prog(ours_io.stderr, "blkimg-io") == \
        strip_prog(theirs_io.stderr, "qemu-io")
    assert ours_u.returncode == 0, ours_u.stderr


def test_blkimg_io_writer_blocks_qemu(qcow2_image, blkimg_io):
    path = qcow2_image
    p = subprocess.Popen([blkimg_io, path], stdin=subprocess.PIPE,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_locked(path, *QCOW2_RW)
        theirs_io = run("qemu-io", "-c", "read 0 512", path)
        theirs_info = run("qemu-img", "info", path)
        theirs_u = run("qemu-img", "info", "-U", path)
    finally:
        p.stdin.close()
        p.wait(timeout=30)
    assert theirs_io.returncode == 1
    assert theirs_io.stderr == "qemu-io: can't open device %s: Failed to " \
        "get \"write\" lock\n%s\n" % (path, HINT % path)
    assert theirs_info.returncode == 1
    assert theirs_info.stderr == "qemu-img: Could not open '%s': Failed to " \
        "get shared \"write\" lock\n%s\n" % (path, HINT % path)
    assert theirs_u.returncode == 0
