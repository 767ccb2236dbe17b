# SPDX-License-Identifier: MIT
"""One host run, one I/O, for the foreign formats (issue 10): reading N
contiguous grains/blocks of vmdk (monolithicSparse), vhdx and vdi costs
the I/O calls reading one does, and an allocating write of N new blocks
costs what a write of one does (the driver hands out every new block of
the write as one host run). vpc has a sector bitmap in front of every
block, so no two blocks are host-contiguous: one I/O per block, and no
more. Counts, not times: `blkimg-io --stats` counts the calls on the
protocol node; the data is read back by qemu-io and the images checked
by qemu-img."""
import json
import subprocess

import pytest

pytestmark = pytest.mark.qemu

KiB = 1024

# (id, format, create options, grain/block KiB, blocks to write, whether
# contiguous blocks are one host run)
CASES = [
    ("vmdk", "vmdk", "subformat=monolithicSparse", 64, 256, True),
    ("vhdx", "vhdx", "subformat=dynamic,block_size=1M", 1024, 256, True),
    ("vdi", "vdi", "static=off", 1024, 256, True),
    ("vpc", "vpc", "subformat=dynamic", 2048, 16, False),
]


def io_calls(blkimg_io, fmt, path, cmd, rw=False):
    """The protocol node's I/O calls for opening path, running cmd with
    -t none and closing it."""
    cp = subprocess.run([blkimg_io, "--stats", *([] if rw else ["-r"]),
                         "-f", fmt, "-t", "none", "-c", cmd, path],
                        capture_output=True, text=True)
    assert cp.returncode == 0 and "failed" not in cp.stdout, \
        (cmd, cp.stdout, cp.stderr)
    lines = [l for l in (cp.stdout + cp.stderr).splitlines()
             if l.strip().startswith("io calls:")]
    assert lines, cp.stdout
    return int(lines[-1].split(":")[1])


def blank(blkimg, fmt, opts, path, size):
    subprocess.run([blkimg, "create", "-q", "-f", fmt, "-o", opts, path,
                    str(size)], check=True)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_contiguous_blocks_one_io(blkimg, blkimg_io, qemu_img, qemu_io,
                                  tmp_path, case):
    _, fmt, opts, kib, n, contiguous = case
    bs = kib * KiB
    size = (n + 1) * bs
    one, many = str(tmp_path / "one.img"), str(tmp_path / "many.img")
    blank(blkimg, fmt, opts, one, size)
    blank(blkimg, fmt, opts, many, size)

    # allocating writes: one block, then n blocks in one request
    w1 = io_calls(blkimg_io, fmt, one, "write -P 0x5a 0 %d" % bs, rw=True)
    wn = io_calls(blkimg_io, fmt, many, "write -P 0x5a 0 %d" % (n * bs),
                  rw=True)
    if contiguous:
        # (a single table entry may cost a read-modify-write of its
        # sector that whole sectors of entries do not)
        assert wn <= w1, (w1, wn)
    else:
        # the same few calls for every block, none more
        two = str(tmp_path / "two.img")
        blank(blkimg, fmt, opts, two, size)
        per = io_calls(blkimg_io, fmt, two, "write -P 0x5a 0 %d" % (2 * bs),
                       rw=True) - w1
        assert 0 < per <= 4 and wn == w1 + (n - 1) * per, (w1, per, wn)

    # reads: one block, 2, n/4 and n contiguous blocks
    r1 = io_calls(blkimg_io, fmt, many, "read -P 0x5a 0 %d" % bs)
    for k in (2, n // 4, n):
        rk = io_calls(blkimg_io, fmt, many, "read -P 0x5a 0 %d" % (k * bs))
        assert rk == (r1 if contiguous else r1 + k - 1), (k, r1, rk)
    # and the unallocated block after them reads as zeroes, without I/O
    assert io_calls(blkimg_io, fmt, many,
                    "read -P 0 %d %d" % (n * bs, bs)) == r1 - 1

    # what blkimg wrote is what QEMU reads, and the layout is one run
    cp = subprocess.run([qemu_io, "-r", "-f", fmt, "-c",
                         "read -P 0x5a 0 %d" % (n * bs), "-c",
                         "read -P 0 %d %d" % (n * bs, bs), many],
                        capture_output=True, text=True)
    assert cp.returncode == 0 and "fail" not in cp.stdout, cp.stdout
    if fmt != "vpc":
        cp = subprocess.run([qemu_img, "check", "-f", fmt, many],
                            capture_output=True, text=True)
        assert cp.returncode == 0, cp.stdout + cp.stderr
    m = json.loads(subprocess.run([qemu_img, "map", "--output=json", "-f",
                                   fmt, many], capture_output=True,
                                  text=True, check=True).stdout)
    data = [e for e in m if e["data"]]
    if "offset" in data[0]:
        for a, b in zip(data, data[1:]):
            follows = a["offset"] + a["length"] == b["offset"]
            assert follows == contiguous, (a, b)
