# SPDX-License-Identifier: MIT
"""convert from a qcow2 whose Nth cluster cannot be read (a compressed
descriptor far past the end of the file) after readable ones: blkimg
names the same byte as qemu-img convert 7.2 (the start of the block
status extent that fails, not of the whole run read at once), with the
same exit code. Found by the fuzzer (stop 17's notes)."""
import struct

import pytest

pytestmark = pytest.mark.qemu


@pytest.mark.parametrize("cs,bad", [(512, 1), (512, 5), (4096, 2),
                                    (65536, 1)])
def test_read_error_offset_as_qemu(cs, bad, run, qemu_img, qemu_io, blkimg,
                                   tmp_path):
    img = str(tmp_path / "e.qcow2")
    run(qemu_img, "create", "-q", "-f", "qcow2", "-o",
        "cluster_size=%d" % cs, img, "1M", check=True)
    run(qemu_io, "-c", "write -P 1 0 %d" % (8 * cs), img, check=True)
    with open(img, "r+b") as f:
        f.seek(40)
        (l1,) = struct.unpack(">Q", f.read(8))
        f.seek(l1)
        (l2,) = struct.unpack(">Q", f.read(8))
        f.seek((l2 & 0x00fffffffffffe00) + 8 * bad)
        f.write(struct.pack(">Q", (1 << 62) | (1 << 40)))
    q = run(qemu_img, "convert", "-O", "raw", img, str(tmp_path / "q.raw"))
    b = run(blkimg, "convert", "-O", "raw", img, str(tmp_path / "b.raw"))
    assert q.returncode == b.returncode == 1
    assert "at byte %d:" % (bad * cs) in q.stderr
    assert b.stderr.replace("blkimg:", "qemu-img:") == q.stderr
