# SPDX-License-Identifier: MIT
"""convert with O_DIRECT on both sides (-t none -T none) on every storage:
the 512-byte-sector disk, ext4 and xfs on 4K-sector loop devices, the
4K-sector loop block device itself (an existing target that does not read
as zeroes: zero ranges must be written) and tmpfs. Bytes checked against
the source and with qemu-img compare / check."""
import os
import shutil
import subprocess

import pytest

from storage import any_storage, file_storage  # noqa: F401
from test_convert_helpers import MiB, make_raw, read, run2

pytestmark = [pytest.mark.qemu, pytest.mark.root]

SIZE = 24 * MiB + 3 * 512  # not a multiple of 4096


def _src(tmp_path):
    return make_raw(tmp_path / "src.raw", size=SIZE, seed=41,
                    extents=[(0, 5000, "data"), (MiB + 512, 70000, "data"),
                             (3 * MiB, 2 * MiB, "zero"),
                             (8 * MiB - 100, 300000, "data"),
                             (12 * MiB, 2 * MiB, "sparse"),
                             (SIZE - 3000, 3000, "data")])


def _read_dev(dev, n):
    with open(dev, "rb") as f:
        return f.read(n)


def test_raw_to_storage_direct(blkimg, qemu_img, tmp_path, any_storage):
    src = _src(tmp_path)
    dst = any_storage.path("out.raw")
    args = ["convert", "-t", "none", "-T", "none", "-O", "raw"]
    if any_storage.is_block_device:
        # the device holds garbage: zero ranges must really be zeroed
        with open(dst, "r+b") as f:
            f.write(os.urandom(32 * MiB))
        args.append("-n")
    rc, out, err = run2(blkimg, args + [src, dst])
    assert (rc, out, err) == (0, b"", "")
    if any_storage.is_block_device:
        assert _read_dev(dst, os.path.getsize(src)) == read(src)
    else:
        data = read(dst)
        assert data[:SIZE] == read(src)
        # the last partial block is written whole with O_DIRECT (4K
        # sectors): the file grows to the block, exactly as with qemu-img
        assert data[SIZE:] == bytes(len(data) - SIZE)
        q = any_storage.path("qemu.raw")
        subprocess.run([qemu_img] + args + [src, q], check=True)
        assert os.path.getsize(dst) == os.path.getsize(q)


def test_storage_to_disk_direct(blkimg, qemu_img, tmp_path, file_storage):
    src = _src(tmp_path)
    on = file_storage.path("src.raw")
    shutil.copyfile(src, on)
    out = tmp_path / "back.raw"
    rc, o, e = run2(blkimg, ["convert", "-t", "none", "-T", "none", "-f",
                             "raw", "-O", "raw", on, out])
    assert (rc, o, e) == (0, b"", "")
    assert read(out)[:SIZE] == read(src)


def test_qcow2_on_storage_direct(blkimg, qemu_img, tmp_path, file_storage):
    src = _src(tmp_path)
    q = file_storage.path("out.qcow2")
    rc, o, e = run2(blkimg, ["convert", "-p", "-t", "none", "-T", "none",
                             "-O", "qcow2", "-o", "compat=1.1", src, q])
    assert rc == 0, e
    assert o.endswith(b"(100.00/100%)\r\n")
    cp = subprocess.run([qemu_img, "check", q], capture_output=True,
                        text=True)
    assert cp.returncode == 0, cp.stdout
    cp = subprocess.run([qemu_img, "compare", src, q], capture_output=True,
                        text=True)
    assert cp.stdout == "Images are identical.\n"
    # and back to raw from the storage, both sides direct
    back = tmp_path / "back.raw"
    assert run2(blkimg, ["convert", "-t", "none", "-T", "none", "-f",
                         "qcow2", "-O", "raw", q, back])[0] == 0
    assert read(back)[:SIZE] == read(src)


def test_compressed_on_storage(blkimg, qemu_img, tmp_path, file_storage):
    src = _src(tmp_path)
    q = file_storage.path("c.qcow2")
    rc, o, e = run2(blkimg, ["convert", "-c", "-t", "none", "-T", "none",
                             "-O", "qcow2", src, q])
    assert (rc, o, e) == (0, b"", "")
    cp = subprocess.run([qemu_img, "compare", src, q], capture_output=True,
                        text=True)
    assert cp.stdout == "Images are identical.\n"
    assert subprocess.run([qemu_img, "check", q],
                          capture_output=True).returncode == 0
