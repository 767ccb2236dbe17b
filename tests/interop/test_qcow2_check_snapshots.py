# SPDX-License-Identifier: MIT
"""qcow2 check of a damaged snapshot table, as QEMU 7.2's check reads and
repairs it (qcow2_check_read_snapshot_table, qcow2_check_fix_snapshot_table):
a bad header pointer fails the check (exit 1), too many snapshots or too
much extra data fail it unless -r all drops them, entries without the v3
extra data are corruptions that -r all rewrites, a table cut by the end of
the file reads as zeroes. Each case is judged by blkimg and qemu-img on
the same bytes: exit codes and every line of output must agree, and after
each tool's repair qemu-img check must judge both results alike. Then a
seeded random differential of the snapshot table (qcow2_mutate.py
--snapshots): a few cases here, a few hundred under `slow`, thousands
under `torture`."""
import os
import shutil
import struct
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
import qcow2_mutate  # noqa: E402

pytestmark = pytest.mark.qemu


def _entries(path):
    lay = qcow2_mutate.Layout(path)
    return lay, qcow2_mutate.snapshot_entries(lay)[0]


def _p32(at, v):
    return lambda d, lay, e: d.__setitem__(slice(at(lay, e), at(lay, e) + 4),
                                           struct.pack(">I", v))


def _p64(at, v):
    return lambda d, lay, e: d.__setitem__(slice(at(lay, e), at(lay, e) + 8),
                                           struct.pack(">Q", v(lay, e)))


# name -> (damage(bytearray, layout, entries), whole -r all output equal)
CASES = {
    "count_past_table": (_p32(lambda lay, e: 60, 3), True),
    "count_too_large": (_p32(lambda lay, e: 60, 70000), False),
    "offset_unaligned": (_p64(lambda lay, e: 64,
                              lambda lay, e: lay.snap_off + 8), True),
    "offset_huge": (_p64(lambda lay, e: 64,
                         lambda lay, e: 0x7ffffffffffff000), True),
    "extra_too_much": (_p32(lambda lay, e: e[0][0] + 36, 2000), True),
    "extra_incomplete": (_p32(lambda lay, e: e[1][0] + 36, 8), True),
    "l1_unaligned": (_p64(lambda lay, e: e[0][0],
                          lambda lay, e: struct.unpack_from(
                              ">Q", lay.data, e[0][0])[0] + 8), True),
    "l1_too_large": (_p32(lambda lay, e: e[1][0] + 8, 0x4000000), True),
    "table_cut": (lambda d, lay, e: d.__delitem__(
        slice(e[1][0] + 20, None)), True),
}


@pytest.fixture(scope="module")
def snap_base(tmp_path_factory):
    if not shutil.which("qemu-img"):
        pytest.skip("qemu-img missing")
    path = str(tmp_path_factory.mktemp("snapbase") / "base.qcow2")
    qcow2_mutate.make_image(path, "snap4k")
    return path


def _norm(cp, tool):
    return (cp[1], cp[2].replace(os.path.basename(tool) + ":", "TOOL:"))


# 65536 entries: seconds of work for each tool
_SLOW_CASES = {"count_too_large"}


@pytest.mark.parametrize("case", [
    pytest.param(c, marks=pytest.mark.slow) if c in _SLOW_CASES else c
    for c in sorted(CASES)])
def test_snapshot_table_damage_as_qemu(case, snap_base, blkimg, tmp_path):
    damage, exact_repair = CASES[case]
    lay, entries = _entries(snap_base)
    data = bytearray(lay.data)
    damage(data, lay, entries)
    img = str(tmp_path / "d.qcow2")
    with open(img, "wb") as f:
        f.write(data)
    q = qcow2_mutate.check("qemu-img", img)
    b = qcow2_mutate.check(blkimg, img)
    assert b[0] == q[0], (q, b)
    assert _norm(b, blkimg) == _norm(q, "qemu-img")
    after = []
    for tool in ("qemu-img", blkimg):
        rep = str(tmp_path / ("rep-%s.qcow2" % os.path.basename(tool)))
        with open(rep, "wb") as f:
            f.write(data)
        r = qcow2_mutate.check(tool, rep, "-r", "all")
        after.append((r, qcow2_mutate.check("qemu-img", rep)[0]))
    (qr, q_after), (br, b_after) = after
    assert br[0] == qr[0], (qr, br)
    assert b_after == q_after
    if br[0] == 0:
        assert b_after == 0
    if exact_repair:
        assert _norm(br, blkimg) == _norm(qr, "qemu-img")


def test_repaired_snapshot_reads_back(snap_base, blkimg, run, qemu_img,
                                      tmp_path):
    """-r all on an entry with too little extra data keeps the snapshots
    as QEMU's repair keeps them: the same list (the entry's id and name
    are read where QEMU reads them), and the intact snapshot's data reads
    back as it was (qemu-img convert -l)."""
    lay, entries = _entries(snap_base)
    data = bytearray(lay.data)
    CASES["extra_incomplete"][0](data, lay, entries)
    lists = []
    for tool in ("qemu-img", blkimg):
        img = str(tmp_path / ("i-%s.qcow2" % os.path.basename(tool)))
        with open(img, "wb") as f:
            f.write(data)
        assert qcow2_mutate.check(tool, img, "-r", "all")[0] == 0
        lists.append(run(qemu_img, "snapshot", "-l", img, check=True).stdout)
        a, b = str(tmp_path / "a.raw"), str(tmp_path / "b.raw")
        run(qemu_img, "convert", "-O", "raw", "-l", "s1", snap_base, a,
            check=True)
        run(qemu_img, "convert", "-O", "raw", "-l", "s1", img, b, check=True)
        with open(a, "rb") as fa, open(b, "rb") as fb:
            assert fa.read() == fb.read()
    assert lists[0] == lists[1]
    assert "s1" in lists[1]


def _differential(blkimg, tmp_path, seeds):
    kinds = sorted(qcow2_mutate.SNAPSHOT_KINDS)
    found = []
    for seed in seeds:
        kind = kinds[seed % len(kinds)]
        for how, text in qcow2_mutate.one_case(blkimg, str(tmp_path), kind,
                                               seed, quick=True,
                                               snapshots=True):
            found.append(text)
    assert not found, "\n\n".join(found)


def test_snapshot_table_differential(blkimg, sanitized, tmp_path):
    _differential(blkimg, tmp_path, range(7000, 7000 + (4 if sanitized
                                                         else 12)))


@pytest.mark.slow
def test_snapshot_table_differential_slow(blkimg, tmp_path):
    _differential(blkimg, tmp_path, range(70000, 70300))


@pytest.mark.torture
def test_snapshot_table_differential_torture(blkimg, tmp_path):
    _differential(blkimg, tmp_path, range(700000, 703000))
