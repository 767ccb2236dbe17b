# SPDX-License-Identifier: MIT
"""Helpers shared by the convert / compare / measure / resize / dd tests:
deterministic test images and side-by-side runs of qemu-img and blkimg."""
import os
import random
import re
import subprocess

MiB = 1024 * 1024


def make_raw(path, size=64 * MiB, seed=1, extents=None):
    """A raw image with holes, data at aligned and unaligned offsets,
    explicitly written (allocated) zeroes, short zero runs inside data and
    data at the very end. Returns the path."""
    rnd = random.Random(seed)
    if extents is None:
        extents = [
            (0, 700000, "data"),
            (3 * MiB + 512, 700000, "data"),
            (10 * MiB, 3 * MiB, "zero"),
            (20 * MiB, 700000, "data"),
            (30 * MiB, 5000, "data"),
            (30 * MiB + 5000, 9000, "zero"),
            (30 * MiB + 14000, 3000, "data"),
            (33 * MiB, 2 * MiB, "sparse"),  # 4K data every 64K
            (40 * MiB - 4096, 700000, "data"),
            (size - 10000, 10000, "data"),
        ]
    with open(path, "wb") as f:
        f.truncate(size)
        for off, length, kind in extents:
            if off >= size:
                continue
            length = min(length, size - off)
            f.seek(off)
            if kind == "data":
                f.write(rnd.randbytes(length))
            elif kind == "zero":
                f.write(b"\0" * length)
            elif kind == "sparse":
                for o in range(0, length, 65536):
                    f.seek(off + o)
                    f.write(rnd.randbytes(4096) if (o // 65536) % 3 else
                            b"\0" * 4096)
    return str(path)


def norm_err(s):
    """Program names out of stderr (qemu-img vs blkimg)."""
    if isinstance(s, bytes):
        s = s.decode("utf-8", "replace")
    s = re.sub(r"(^|\n)(qemu-img|blkimg): ", r"\1PROG: ", s)
    s = s.replace("'qemu-img --help'", "'PROG --help'")
    s = s.replace("'blkimg --help'", "'PROG --help'")
    return s


def run2(tool, args, cwd=None):
    cp = subprocess.run([str(tool)] + [str(a) for a in args],
                        capture_output=True, stdin=subprocess.DEVNULL,
                        cwd=cwd, timeout=600)
    return cp.returncode, cp.stdout, norm_err(cp.stderr)


def same_output(qemu_img, blkimg, args, cwd, prepare=None):
    """Runs args with both tools (prepare() before each) and returns both
    (rc, stdout, stderr) triples."""
    res = []
    for tool in (qemu_img, blkimg):
        if prepare:
            prepare()
        res.append(run2(tool, args, cwd=cwd))
    return res


def blocks(path):
    return os.stat(path).st_blocks


def same_allocation(a, b):
    """a and b allocate the same bytes (data extents equal) and as much
    space (st_blocks, which also counts the file system's own metadata: an
    ext4 extent-tree block of 8 sectors may come or go with the physical
    layout, so that much slack)."""
    return data_map(a) == data_map(b) and abs(blocks(a) - blocks(b)) <= 8


def data_map(path):
    """The file's data extents (SEEK_DATA/SEEK_HOLE): which bytes are
    allocated, without the file system's own metadata blocks that
    st_blocks also counts (an ext4 extent-tree block comes and goes with
    the physical layout)."""
    out = []
    with open(path, "rb") as f:
        fd = f.fileno()
        # Preallocated (unwritten) extents read as zeroes; SEEK_DATA calls
        # them holes unless their pages are in the page cache (the test may
        # have read the file): drop those pages first, so the answer
        # depends on the file alone.
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        end = os.fstat(fd).st_size
        pos = 0
        while pos < end:
            try:
                start = os.lseek(fd, pos, os.SEEK_DATA)
            except OSError:
                break
            stop = os.lseek(fd, start, os.SEEK_HOLE)
            out.append((start, stop))
            pos = stop
    return out


def read(path):
    with open(path, "rb") as f:
        return f.read()
