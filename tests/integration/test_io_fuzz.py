# SPDX-License-Identifier: MIT
"""Differential runs of blkimg-io against qemu-io 7.2: seeded random
command scripts (valid and invalid offsets, lengths, suffixes, patterns,
requests crossing the end of the image, vectors, zero writes, discards,
aio, truncation) on identical raw and qcow2 images, in several cache
modes. Output (timing masked), stderr, exit code and, for raw images, the
resulting bytes must be the same."""
import random
import shutil
import subprocess

import pytest

from test_io_common import as_blkimg, mask

pytestmark = pytest.mark.qemu

SIZE = 4 * 1024 * 1024


def _num(r):
    c = r.random()
    if c < 0.4:
        v = r.randrange(0, SIZE + 70000)
    elif c < 0.6:
        v = r.randrange(0, 9) * 512 + r.choice([0, 1, 511])
    elif c < 0.7:
        v = r.choice([0, 1, SIZE, SIZE - 1, SIZE + 1, 65536, 65535])
    else:
        v = r.randrange(0, 200000)
    s = r.random()
    if s < 0.08 and v % 1024 == 0:
        return "%dk" % (v // 1024)
    if s < 0.12:
        return hex(v)
    if s < 0.14:
        return r.choice(["x", "1.5k", "-1", "0.5", "3G", "1e"])
    return str(v)


def _cmd(r, discard):
    kinds = ["read", "write", "readv", "writev", "wz", "alloc", "map",
             "length", "aw", "ar", "trunc", "flush"]
    if discard:
        kinds.append("discard")
    k = r.choice(kinds)

    def pat():
        return "-P %d " % r.randrange(0, 256) if r.random() < 0.6 else ""

    def opt():
        return r.choice(["", "", "-q ", "-C ", "-v "])

    n = lambda: _num(r)  # noqa: E731
    if k == "read":
        return "read %s%s%s %s" % (opt(), pat(), n(), n())
    if k == "write":
        return "write %s%s%s %s" % (r.choice(["", "-q ", "-f "]), pat(), n(),
                                    n())
    if k == "readv":
        return "readv %s%s" % (opt(), pat()) + \
            " ".join(n() for _ in range(r.randint(2, 5)))
    if k == "writev":
        return "writev %s" % pat() + \
            " ".join(n() for _ in range(r.randint(2, 5)))
    if k == "discard":
        return "discard %s %s" % (n(), n())
    if k == "wz":
        return "write -z %s%s %s" % (r.choice(["", "-u "]), n(), n())
    if k == "alloc":
        if r.random() < 0.7:
            return "alloc %s %s" % (n(), n())
        return "alloc %s" % n()
    if k == "aw":
        return "aio_write %s%s %s" % (pat(), n(), n())
    if k == "ar":
        return "aio_read %s%s %s" % (pat(), n(), n())
    if k == "trunc":
        return "truncate %s" % r.choice([str(SIZE), str(SIZE + 65536), "3M",
                                         "5M", str(SIZE - 512)])
    return k


def _script(r, discard):
    out = []
    for _ in range(r.randint(3, 14)):
        c = _cmd(r, discard)
        out += ["-c", c]
        if c.startswith("aio"):
            out += ["-c", "aio_flush"]  # completion order is qemu's whim
    return out + ["-c", "map"]


CASES = [("raw", "writeback"), ("raw", "writethrough"), ("raw", "none"),
         ("qcow2", "writeback"), ("qcow2", "none")]


@pytest.mark.parametrize("fmt,cache", CASES,
                         ids=["%s-%s" % c for c in CASES])
def test_random_scripts(tmp_path, blkimg_io, qemu_io, fmt, cache):
    q, b = tmp_path / "q", tmp_path / "b"
    q.mkdir()
    b.mkdir()
    for seed in range(12):
        r = random.Random("%s/%s/%d" % (fmt, cache, seed))
        subprocess.run(["qemu-img", "create", "-q", "-f", fmt, "i",
                        str(SIZE)], cwd=str(q), check=True)
        shutil.copyfile(q / "i", b / "i")
        # Unaligned discards under O_DIRECT are advisory: qemu passes the
        # exact bytes to the file system, blkimg rounds to the sector.
        script = _script(r, discard=not (fmt == "raw" and cache == "none"))
        res = []
        for tool, d in ((qemu_io, q), (blkimg_io, b)):
            cp = subprocess.run([tool, "-f", fmt, "-t", cache] + script +
                                ["i"], cwd=str(d), capture_output=True,
                                text=True, stdin=subprocess.DEVNULL,
                                timeout=300)
            assert "runtime error:" not in cp.stderr, cp.stderr
            assert "AddressSanitizer" not in cp.stderr, cp.stderr
            res.append((mask(as_blkimg(cp.stdout)), as_blkimg(cp.stderr),
                        cp.returncode))
        assert res[1] == res[0], "seed %d: %r" % (seed, script)
        if fmt == "raw":
            assert (b / "i").read_bytes() == (q / "i").read_bytes(), \
                "seed %d: %r" % (seed, script)
        else:
            # same guest-visible data: qemu-io reads both back
            cmp = subprocess.run(["qemu-img", "compare", "-q", str(q / "i"),
                                  str(b / "i")], capture_output=True)
            assert cmp.returncode == 0, "seed %d: %r" % (seed, script)
