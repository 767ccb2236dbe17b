# SPDX-License-Identifier: MIT
"""Writes at unaligned offsets with `-t none` to vmdk, vhdx, vpc and vdi
images on a filesystem over a 4096-byte-sector loop device (issue 10):
O_DIRECT needs 4 KiB alignment there, so every new block, grain and
table entry goes through the bounce and read-modify-write paths. What
blkimg-io wrote reads back through qemu-io (`-t none` too) and
qemu-img, byte for byte against a model, and qemu-img check (where it
checks the format) finds nothing."""
import json
import subprocess

import pytest

import storage
from storage import storage_ext4_4k, storage_xfs_4k  # noqa: F401

pytestmark = [pytest.mark.root, pytest.mark.qemu]

MiB = 1 << 20

# id: (format, create options, whether qemu-img checks it)
FORMATS = {
    "vmdk": ("vmdk", "subformat=monolithicSparse", True),
    "vmdk-stream": ("vmdk", "subformat=streamOptimized", True),
    "vhdx": ("vhdx", "subformat=dynamic,block_size=1M", True),
    "vpc": ("vpc", "subformat=dynamic", False),
    "vdi": ("vdi", "static=off", True),
}

# (offset, length, byte): unaligned starts and ends, in new and in
# allocated blocks, across block and grain boundaries, overlapping
WRITES = [
    (1000, 3000, 0x11),
    (512, 512, 0x12),
    (65536 - 7, 14, 0x13),
    (MiB - 4095, 8193, 0x14),
    (3 * MiB + 1, 2 * MiB + 511, 0x15),
    (2000, 70001, 0x16),
    (9 * MiB + 4096, 4096, 0x17),
    (9 * MiB + 100, 5000, 0x18),
    (15 * MiB - 1, 1, 0x19),
]

# streamOptimized takes whole grains once, compressed: one write of
# each grain, at grain-aligned offsets but through the 4 KiB bounce for
# its markers and tail sectors
STREAM_WRITES = [
    (0, 65536, 0x21),
    (MiB, 3 * 65536, 0x22),
    (15 * MiB, MiB, 0x23),
]


def run(*argv, check=True):
    cp = subprocess.run([str(a) for a in argv], capture_output=True,
                        text=True)
    if check:
        assert cp.returncode == 0, (argv, cp.stdout, cp.stderr)
    return cp


@pytest.fixture(params=["ext4-4k", "xfs-4k"])
def storage_4k(request):
    with storage.make(request.param) as st:
        yield st


@pytest.mark.parametrize("key", sorted(FORMATS))
def test_unaligned_writes_direct(storage_4k, blkimg, blkimg_io, qemu_img,
                                 qemu_io, key):
    fmt, opts, checked = FORMATS[key]
    img = storage_4k.path("img." + fmt)
    run(blkimg, "create", "-q", "-f", fmt, "-o", opts, img, "16M")
    size = json.loads(run(qemu_img, "info", "--output=json", img)
                      .stdout)["virtual-size"]
    writes = STREAM_WRITES if "stream" in key else WRITES
    model = bytearray(size)
    args = []
    for off, ln, byte in writes:
        args += ["-c", "write -P %d %d %d" % (byte, off, ln)]
        model[off:off + ln] = bytes([byte]) * ln
    cp = run(blkimg_io, "-f", fmt, "-t", "none", *args, img)
    assert "failed" not in cp.stdout, cp.stdout

    # qemu-io reads the last write of each byte back with O_DIRECT where
    # it is one pattern, and a gap as zeroes
    reads = ["-c", "read -P 0 %d 4096" % (12 * MiB)]
    for off, ln, byte in writes:
        if model[off:off + ln] == bytes([byte]) * ln:
            reads += ["-c", "read -P %d %d %d" % (byte, off, ln)]
    cp = run(qemu_io, "-r", "-f", fmt, "-t", "none", *reads, img)
    assert "failed" not in cp.stdout and "Pattern" not in cp.stdout, \
        cp.stdout
    # the whole image against the model, read by qemu-img
    raw = storage_4k.path("img.raw")
    run(qemu_img, "convert", "-f", fmt, "-O", "raw", img, raw)
    with open(raw, "rb") as f:
        data = f.read()
    assert len(data) == size
    if data != model:
        bad = next(i for i in range(size) if data[i] != model[i])
        pytest.fail("byte %d is %#x, not %#x" % (bad, data[bad], model[bad]))
    # blkimg reads it back the same way, with O_DIRECT
    braw = storage_4k.path("b.raw")
    run(blkimg, "convert", "-T", "none", "-f", fmt, "-O", "raw", img, braw)
    with open(braw, "rb") as f:
        assert f.read() == data
    if checked:
        cp = run(qemu_img, "check", "-f", fmt, img, check=False)
        assert cp.returncode == 0, cp.stdout + cp.stderr
