# SPDX-License-Identifier: MIT
"""Concurrent requests against an in-memory model (issue 12, section 5):
each round, one blkimg-io process puts many unaligned aio_write requests
in flight at once, next to each other inside the same clusters (where a
copy-on-write that loses a neighbour's update would show) and over what
earlier rounds wrote, plus aio_read requests of bytes no write of the
round touches, checked against the model with -P; then aio_flush. After
each round qemu-img reads the whole image back (convert to raw) and it
must equal the model byte for byte. Seeded; qcow2 at 512 B and 4 KiB
clusters, extended L2, and raw. A few rounds here, many under torture."""
import random

import pytest

pytestmark = pytest.mark.qemu

SIZE = 256 * 1024
FORMATS = {
    "qcow2-4k": ["-f", "qcow2", "-o", "cluster_size=4096"],
    "qcow2-512": ["-f", "qcow2", "-o", "cluster_size=512"],
    "qcow2-extl2": ["-f", "qcow2", "-o", "cluster_size=65536,extended_l2=on"],
    "raw": ["-f", "raw"],
}


def _round(rng, model, nwrites):
    """The commands of one round and the model after it."""
    cuts = sorted(rng.sample(range(1, SIZE), 2 * nwrites))
    writes = []
    for k in range(nwrites):
        a, b = cuts[2 * k], cuts[2 * k + 1]
        if rng.randrange(3) == 0:
            b = min(SIZE, a + rng.randrange(1, 700))  # small, unaligned
        if writes and a < writes[-1][1]:
            continue
        writes.append((a, b, rng.randrange(1, 256)))
    touched = bytearray(SIZE)
    for a, b, _ in writes:
        touched[a:b] = b"\1" * (b - a)
    reads = []
    for _ in range(nwrites):
        a = rng.randrange(SIZE)
        b = a
        while b < SIZE and b - a < 9000 and not touched[b] and \
                model[b] == model[a]:
            b += 1
        if b > a and not touched[a]:
            reads.append((a, b, model[a]))
    cmds = []
    order = [("w", w) for w in writes] + [("r", r) for r in reads]
    rng.shuffle(order)
    for kind, (a, b, p) in order:
        cmds += ["-c", "aio_%s -P %d %d %d" % ("write" if kind == "w"
                                                else "read", p, a, b - a)]
    cmds += ["-c", "aio_flush"]
    for a, b, p in writes:
        model[a:b] = bytes([p]) * (b - a)
    return cmds


def _trial(fmt, seed, rounds, run, qemu_img, blkimg_io, tmp_path):
    img = str(tmp_path / ("m-%s.img" % fmt))
    run(qemu_img, "create", "-q", *FORMATS[fmt], img, str(SIZE), check=True)
    rng = random.Random(seed)
    model = bytearray(SIZE)
    for r in range(rounds):
        cmds = _round(rng, model, rng.randrange(4, 24))
        cp = run(blkimg_io, "-f", FORMATS[fmt][1], *cmds, img)
        assert cp.returncode == 0, cp.stderr
        assert "failed" not in cp.stdout + cp.stderr, (r, cp.stdout)
        raw = str(tmp_path / "back.raw")
        run(qemu_img, "convert", "-f", FORMATS[fmt][1], "-O", "raw", img,
            raw, check=True)
        with open(raw, "rb") as f:
            got = f.read()
        if got != bytes(model):
            bad = next(i for i in range(SIZE) if got[i] != model[i])
            pytest.fail("%s seed %d round %d: byte %d is %d, model %d" %
                        (fmt, seed, r, bad, got[bad], model[bad]))
    if fmt != "raw":
        cp = run(qemu_img, "check", img)
        assert cp.returncode == 0, cp.stdout + cp.stderr


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_aio_overlapping_model(fmt, run, qemu_img, blkimg_io, tmp_path):
    _trial(fmt, 1200 + sorted(FORMATS).index(fmt), 4, run, qemu_img,
           blkimg_io, tmp_path)


@pytest.mark.torture
@pytest.mark.parametrize("fmt", sorted(FORMATS))
@pytest.mark.parametrize("seed", range(20))
def test_aio_overlapping_model_torture(fmt, seed, run, qemu_img, blkimg_io,
                                       tmp_path):
    _trial(fmt, 50000 + seed, 30, run, qemu_img, blkimg_io, tmp_path)
