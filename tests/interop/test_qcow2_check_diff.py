# SPDX-License-Identifier: MIT
"""Differential check: qcow2 images of ten kinds made by qemu-img, their
metadata damaged by seeded random changes (qcow2_mutate.py), judged by
qemu-img check and blkimg check. blkimg must never call clean what
qemu-img calls damaged, never raise a false alarm, never crash or hang in
check, convert or repair, and an image it says it repaired must pass
qemu-img check. `make torture` runs tens of thousands of seeds."""
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
import qcow2_mutate  # noqa: E402

pytestmark = pytest.mark.qemu

SEEDS = 20  # per kind: 200 cases
SEEDS_SANITIZED = 5


@pytest.mark.parametrize("kind", sorted(qcow2_mutate.KINDS))
def test_damaged_images_judged_as_qemu(kind, blkimg, sanitized, tmp_path):
    n = SEEDS_SANITIZED if sanitized else SEEDS
    found = []
    for i in range(n):
        seed = 1000 * (sorted(qcow2_mutate.KINDS).index(kind) + 1) + i
        for how, text in qcow2_mutate.one_case(blkimg, str(tmp_path), kind,
                                               seed, quick=True):
            # blkimg refusing to open a table past the end of the file that
            # qemu-img reads as zeroes is not a wrong answer (exit 1, not 0)
            if how != "refused":
                found.append(text)
    assert not found, "\n\n".join(found)


def test_truncated_below_l2_tables(run, qemu_img, qemu_io, blkimg, tmp_path):
    """The case the issue names: a file cut below its L2 tables is corrupt
    to both tools, with the same findings."""
    img = str(tmp_path / "t.qcow2")
    run(qemu_img, "create", "-q", "-f", "qcow2", img, "64M", check=True)
    run(qemu_io, "-c", "write -P 1 0 1M", "-c", "write -P 2 32M 1M", img,
        check=True)
    os.truncate(img, 300000)
    q = run(qemu_img, "check", img)
    b = run(blkimg, "check", img)
    assert q.returncode == b.returncode == 2
    assert b.stdout == q.stdout
    assert b.stderr == q.stderr


def test_l2_reserved_bits(run, qemu_img, qemu_io, blkimg, tmp_path):
    """An L2 entry with a reserved bit set is a corruption to both."""
    import struct
    img = str(tmp_path / "r.qcow2")
    run(qemu_img, "create", "-q", "-f", "qcow2", img, "1M", check=True)
    run(qemu_io, "-c", "write -P 1 0 64k", img, check=True)
    with open(img, "r+b") as f:
        f.seek(0x40000)
        (e,) = struct.unpack(">Q", f.read(8))
        f.seek(0x40000)
        f.write(struct.pack(">Q", e | (1 << 57)))
    q = run(qemu_img, "check", img)
    b = run(blkimg, "check", img)
    assert q.returncode == b.returncode == 2
    assert "reserved bits set" in b.stderr
    assert b.stdout == q.stdout and b.stderr == q.stderr
