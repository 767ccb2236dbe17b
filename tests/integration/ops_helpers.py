# SPDX-License-Identifier: MIT
"""Helpers for the rebase / commit / amend / resize tests: image chains
built by qemu-img and qemu-io once (per pytest worker, see the `prebuilt`
fixture in tests/conftest.py) and copied into two directories, one per
tool, and the views of an image that must come out the same (guest bytes,
allocation map without host offsets, qemu-img check)."""
import errno
import fcntl
import itertools
import json
import os
import shutil
import struct
import subprocess

from test_convert_helpers import run2

QEMU_IO = shutil.which("qemu-io") or "qemu-io"


def sh(*cmd, cwd=None):
    subprocess.run([str(c) for c in cmd], check=True, capture_output=True,
                   cwd=cwd)


def qio(img, *cmds, fmt=None, cwd=None):
    args = [QEMU_IO]
    if fmt:
        args += ["-f", fmt]
    for c in cmds:
        args += ["-c", c]
    sh(*args, img, cwd=cwd)


CHUNK = 4 << 20


FS_IOC_FIEMAP = 0xC020660B
FIEMAP_EXTENT_LAST = 0x1
_FIEMAP_HEAD = struct.Struct("=QQIIII")
_FIEMAP_EXTENT = struct.Struct("=QQQQQI12x")


def allocated(fd):
    """The allocated ranges (offset, end) of the open file fd: its extents
    as FIEMAP lists them, written, unwritten (fallocated) or not yet
    written back alike. None when the file system has no FIEMAP."""
    out, start, count = [], 0, 256
    while True:
        req = bytearray(_FIEMAP_HEAD.size + count * _FIEMAP_EXTENT.size)
        _FIEMAP_HEAD.pack_into(req, 0, start, (1 << 64) - 1 - start, 0, 0,
                               count, 0)
        try:
            fcntl.ioctl(fd, FS_IOC_FIEMAP, req)
        except OSError as e:
            if e.errno in (errno.ENOTTY, errno.EOPNOTSUPP, errno.EINVAL):
                return None
            raise
        n = _FIEMAP_HEAD.unpack_from(req, 0)[3]
        if n == 0:
            return out
        for k in range(n):
            log, _, length, _, _, flags = _FIEMAP_EXTENT.unpack_from(
                req, _FIEMAP_HEAD.size + k * _FIEMAP_EXTENT.size)
            if out and out[-1][1] >= log:
                out[-1] = (out[-1][0], max(out[-1][1], log + length))
            else:
                out.append((log, log + length))
            if flags & FIEMAP_EXTENT_LAST:
                return out
        start = out[-1][1]


def seek_data(fd):
    """The data ranges (offset, end) of fd as SEEK_DATA/SEEK_HOLE see
    them."""
    out, pos = [], 0
    size = os.fstat(fd).st_size
    while pos < size:
        try:
            start = os.lseek(fd, pos, os.SEEK_DATA)
        except OSError as e:
            if e.errno != errno.ENXIO:
                raise
            break
        pos = os.lseek(fd, start, os.SEEK_HOLE)
        out.append((start, pos))
    return out


CHUNK = 4 << 20


def copy_sparse(src, dst):
    """Copies the file src to dst with the same allocation: the holes stay
    holes, whatever has blocks is written (zeroes too). Unwritten
    (fallocated) extents become written zeroes: SEEK_DATA, and with it
    qemu-img map, shows them as holes or as data depending on whether
    their pages are cached, which a copy should not depend on."""
    with open(src, "rb") as fi, open(dst, "wb") as fo:
        i, o = fi.fileno(), fo.fileno()
        size = os.fstat(i).st_size
        ranges = allocated(i)
        if ranges is None:
            ranges = seek_data(i)
        for start, stop in ranges:
            off, stop = start, min(stop, size)
            while off < stop:
                n = os.preadv(i, [_buf(0)[:min(CHUNK, stop - off)]], off)
                if n <= 0:
                    raise OSError(errno.EIO, "short copy of %s" % src)
                if os.pwrite(o, _buf(0)[:n], off) != n:
                    raise OSError(errno.EIO, "short copy to %s" % dst)
                off += n
        fo.truncate(size)


def copy_images(src, dst, names=None):
    """Copies the images names (default: every file) of directory src into
    the new directory dst (relative backing names keep working)."""
    dst.mkdir()
    for n in names if names is not None else sorted(os.listdir(src)):
        copy_sparse(src / n, dst / n)
    return dst


_copied_from = {}


def twin_copy(src, tmp_path, names=None):
    """Two copies of the images of src (built once): returns (q, b), the
    directory qemu-img works in and the one blkimg works in."""
    q = copy_images(src, tmp_path / "q", names)
    b = copy_images(src, tmp_path / "b", names)
    _copied_from[str(q)] = _copied_from[str(b)] = src
    return q, b


_pristine = {}


def pristine_view(qemu_img, img, tmp_path):
    """guest_bytes() of img, a fresh copy made by twin_copy, before any
    test touched it: read once per built image (from the image it was
    copied from, which no test modifies)."""
    src = _copied_from[str(img.parent)] / img.name
    if str(src) not in _pristine:
        # kept for the whole run: next to the prebuilt directory (a test's
        # tmp_path goes when the test passes)
        views = src.parent.parent / "pristine-views"
        views.mkdir(exist_ok=True)
        _pristine[str(src)] = guest_bytes(qemu_img, src, views)
    return _pristine[str(src)]


_views = itertools.count()


def guest_bytes(qemu_img, img, tmp_path, fmt=None):
    """What the guest reads from img (qemu-img convert to raw), as a
    Content: compare it with == to another image's."""
    out = tmp_path / ("view-%d-%d.raw" % (os.getpid(), next(_views)))
    args = [qemu_img, "convert", "-U", "-O", "raw"]
    if fmt:
        args += ["-f", fmt]
    sh(*args, img, out)
    return Content(out)


class Content:
    """The bytes of a file that is kept (and removed with this object):
    two Contents compare equal exactly when their files hold the same
    bytes. The files are compared in chunks through two reused buffers:
    on the test machines, allocating (faulting in) a fresh 64 MiB buffer
    per view cost more than the qemu-img runs around it."""

    def __init__(self, path):
        self.path = str(path)
        self.size = os.path.getsize(self.path)

    def __eq__(self, other):
        if not isinstance(other, Content):
            return NotImplemented
        return same_file(self.path, other.path)

    def __ne__(self, other):
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq

    __hash__ = None

    def __repr__(self):
        return "<Content of %s, %d bytes>" % (self.path, self.size)

    def __del__(self):
        try:
            os.unlink(self.path)
        except OSError:
            pass


_bufs = []


def _buf(i):
    """Reused CHUNK-sized buffer i (0 or 1), as a memoryview."""
    if not _bufs:
        _bufs.extend(memoryview(bytearray(CHUNK)) for _ in range(2))
    return _bufs[i]


def same_file(a, b):
    """True when the files a and b hold the same bytes (read in chunks)."""
    with open(a, "rb") as fa, open(b, "rb") as fb:
        if os.fstat(fa.fileno()).st_size != os.fstat(fb.fileno()).st_size:
            return False
        va, vb = _buf(0), _buf(1)
        while True:
            na, nb = fa.readinto(va), fb.readinto(vb)
            if na != nb or va[:na] != vb[:nb]:
                return False
            if na == 0:
                return True


def layout(qemu_img, img, file_holes=False):
    """qemu-img map --output=json without host offsets (allocation order
    may differ) and without file names, adjacent equal runs merged."""
    cp = subprocess.run([qemu_img, "map", "-U", "--output=json", str(img)],
                        capture_output=True, text=True, check=True)
    out = []
    for e in json.loads(cp.stdout):
        e.pop("offset", None)
        e.pop("filename", None)
        if file_holes and e["data"]:
            # a hole in the host file inside an allocated cluster reads as
            # zeroes: which clusters have one depends on host allocation
            e["zero"] = False
        # runs split only where host offsets jump are merged
        if out and all(out[-1][k] == e[k] for k in e
                       if k not in ("start", "length")) and \
                out[-1]["start"] + out[-1]["length"] == e["start"]:
            out[-1]["length"] += e["length"]
        else:
            out.append(e)
    return out


def check_ok(qemu_img, img):
    cp = subprocess.run([qemu_img, "check", "-U", str(img)],
                        capture_output=True, text=True)
    return cp.returncode, cp.stdout + cp.stderr


def info_lines(qemu_img, img):
    """qemu-img info lines, the image's directory replaced by DIR."""
    d = os.path.dirname(os.path.abspath(str(img)))
    cp = subprocess.run([qemu_img, "info", "-U", str(img)],
                        capture_output=True, text=True, check=True)
    return [l.replace(d, "DIR") for l in cp.stdout.splitlines()
            if not l.startswith(("image:", "disk size:"))]


def run_both(qemu_img, blkimg, args, q, b):
    """Runs the same relative command line in each directory."""
    return run2(qemu_img, args, cwd=q), run2(blkimg, args, cwd=b)
