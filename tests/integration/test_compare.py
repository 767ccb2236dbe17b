# SPDX-License-Identifier: MIT
"""blkimg compare against qemu-img 7.2: messages, mismatch offsets, exit
codes, strict mode, size differences, progress, raw and qcow2."""
import os
import pathlib
import subprocess

import pytest

from ops_helpers import copy_sparse
from test_convert_helpers import MiB, make_raw, run2

pytestmark = pytest.mark.qemu


def poke(path, off, data):
    with open(path, "r+b") as f:
        f.seek(off)
        f.write(data)


class Copies:
    """{key: path} of image files built once per worker (see copies());
    a test gets its own copy (allocation and all) of a file, in its
    tmp_path, when it first looks it up."""

    def __init__(self, built, tmp_path):
        self.built = built
        self.tmp_path = tmp_path
        self.copied = {}

    def __getitem__(self, k):
        if k not in self.copied:
            src = self.built[k]
            dst = self.tmp_path / pathlib.Path(src).name
            copy_sparse(src, dst)
            self.copied[k] = str(dst)
        return self.copied[k]

    def __contains__(self, k):
        return k in self.built

    def get(self, k, default=None):
        return self[k] if k in self.built else default


def copies(prebuilt, key, build, tmp_path):
    """build(dir) makes image files in dir and returns {key: path}: built
    once per worker and key; returns the Copies of them for this test."""
    built = {}

    def build_(d):
        built[str(d)] = build(d)
    src = prebuilt(("compare", key), build_)
    _sets.update(built)
    return Copies(_sets[str(src)], tmp_path)


_sets = {}


def build_imgs(tmp_path):
    a = make_raw(tmp_path / "a.raw", size=16 * MiB, seed=5)
    b = tmp_path / "b.raw"       # same content, different allocation
    with open(a, "rb") as f, open(b, "wb") as g:
        g.write(f.read())
    diff = tmp_path / "diff.raw"  # one byte differs inside data
    subprocess.run(["cp", "--sparse=always", a, diff], check=True)
    poke(diff, 3 * MiB + 4097, b"\x01")
    hole = tmp_path / "hole.raw"  # one byte in what is a hole in a
    subprocess.run(["cp", "--sparse=always", a, hole], check=True)
    poke(hole, 8 * MiB + 1003, b"\x07")
    empty = tmp_path / "empty.raw"
    with open(empty, "wb") as f:
        f.truncate(16 * MiB)
    bigger = tmp_path / "bigger.raw"
    subprocess.run(["cp", "--sparse=always", a, bigger], check=True)
    with open(bigger, "r+b") as f:
        f.truncate(20 * MiB)
    bigger_data = tmp_path / "bigger_data.raw"
    subprocess.run(["cp", "--sparse=always", bigger, bigger_data],
                   check=True)
    poke(bigger_data, 18 * MiB + 7, b"\x09")
    q = tmp_path / "a.qcow2"
    subprocess.run(["qemu-img", "convert", "-O", "qcow2", a, q], check=True)
    return {"a": a, "b": str(b), "diff": str(diff), "hole": str(hole),
            "empty": str(empty), "bigger": str(bigger),
            "bigger_data": str(bigger_data), "q": str(q)}


@pytest.fixture
def imgs(prebuilt, tmp_path):
    return copies(prebuilt, "imgs", build_imgs, tmp_path)


CASES = [
    ["a", "b"],
    ["a", "a"],
    ["a", "diff"],
    ["diff", "a"],
    ["a", "hole"],
    ["hole", "a"],
    ["empty", "hole"],
    ["a", "empty"],
    ["a", "bigger"],
    ["bigger", "a"],
    ["a", "bigger_data"],
    ["bigger_data", "a"],
    ["-s", "a", "b"],
    ["-s", "a", "a"],
    ["-s", "a", "bigger"],
    ["-s", "empty", "empty"],
    ["-q", "a", "diff"],
    ["-q", "a", "b"],
    ["-p", "a", "b"],
    ["-p", "a", "bigger"],
    ["-p", "-q", "a", "b"],
    ["-f", "raw", "-F", "raw", "a", "diff"],
    ["-f", "raw", "-F", "qcow2", "a", "a"],
    ["-U", "a", "b"],
    ["-T", "none", "a", "b"],
    ["-T", "foo", "a", "b"],
    ["a", "missing"],
    ["-p", "a", "missing"],
    ["a"],
    ["a", "b", "diff"],
    ["-x", "a", "b"],
    ["a", "q"],
    ["q", "a"],
    ["q", "diff"],
    ["q", "hole"],
    ["-f", "qcow2", "-F", "raw", "q", "b"],
    ["q", "bigger_data"],
]


@pytest.mark.parametrize("args", CASES, ids=" ".join)
def test_compare_matches_qemu(qemu_img, blkimg, tmp_path, imgs, args):
    argv = ["compare"] + [imgs.get(a, a) if a != "missing" else
                          str(tmp_path / "missing") for a in args]
    rq = run2(qemu_img, argv)
    rb = run2(blkimg, argv)
    assert rb == rq


def test_compare_mismatch_offsets(blkimg, tmp_path, imgs):
    rc, out, _ = run2(blkimg, ["compare", imgs["a"], imgs["diff"]])
    assert (rc, out) == (1, b"Content mismatch at offset %d!\n" %
                         (3 * MiB + 4096))
    rc, out, _ = run2(blkimg, ["compare", imgs["a"], imgs["hole"]])
    assert (rc, out) == (1, b"Content mismatch at offset %d!\n" %
                         (8 * MiB + 512))
    rc, out, _ = run2(blkimg, ["compare", imgs["a"], imgs["bigger_data"]])
    assert (rc, out) == (1, b"Warning: Image size mismatch!\n"
                         b"Content mismatch at offset %d!\n" % (18 * MiB))


def test_compare_exit_codes(blkimg, tmp_path, imgs):
    assert run2(blkimg, ["compare", imgs["a"], imgs["b"]])[0] == 0
    assert run2(blkimg, ["compare", imgs["a"], imgs["diff"]])[0] == 1
    assert run2(blkimg, ["compare", imgs["a"],
                         str(tmp_path / "nope")])[0] == 2


def test_compare_qcow2_to_converted(qemu_img, blkimg, tmp_path, imgs):
    out = tmp_path / "c.qcow2"
    subprocess.run([qemu_img, "convert", "-c", "-O", "qcow2", imgs["a"], out],
                   check=True)
    assert run2(blkimg, ["compare", imgs["a"], out]) == \
        (0, b"Images are identical.\n", "")
    poke(imgs["b"], 15 * MiB, b"\xff")
    rq = run2(qemu_img, ["compare", out, imgs["b"]])
    rb = run2(blkimg, ["compare", out, imgs["b"]])
    assert rb == rq
    assert rb[0] == 1


def build_deep(tmp_path):
    a = tmp_path / "a.raw"
    with open(a, "wb") as f:
        f.truncate(64 * MiB)
        for i in range(0, 64, 3):  # 2 MiB of data, 1 MiB hole, ...
            f.seek(i * MiB)
            f.write(os.urandom(2 * MiB if i < 63 else MiB))
    out = {"a": str(a)}

    def variant(name, pokes, sparse=True):
        p = tmp_path / name
        subprocess.run(["cp", "--sparse=always" if sparse else
                        "--sparse=never", a, p], check=True)
        for off, data in pokes:
            poke(p, off, data)
        out[name] = str(p)

    variant("full", [], sparse=False)
    variant("late", [(50 * MiB + 513, b"\xfe")])
    variant("two", [(40 * MiB + 4096, b"\xfe"), (20 * MiB + 5, b"\xfd")])
    # allocated (zero) data at 11 MiB, a content change at 31 MiB
    variant("alloc_then_data", [(11 * MiB, b"\0" * 4096),
                                (31 * MiB + 1, b"\x01")])
    # non-zero bytes in a hole of a at 44 MiB + 100
    variant("in_hole", [(44 * MiB + 100, b"\x05")])
    for name in ("a", "late"):
        q = tmp_path / (name + ".qcow2")
        subprocess.run(["qemu-img", "convert", "-O", "qcow2", out[name], q],
                       check=True)
        out[name + "_q"] = str(q)
    return out


@pytest.fixture
def deep(prebuilt, tmp_path):
    """64 MiB images with many extents, so that many reads are in flight
    when the first difference is met: a full copy, copies with one or two
    differences far in, one whose allocation differs before a content
    difference, and qcow2 conversions."""
    return copies(prebuilt, "deep", build_deep, tmp_path)


DEEP_CASES = [
    ["a", "full"],
    ["a", "late"],
    ["a", "two"],
    ["two", "a"],
    ["a", "alloc_then_data"],
    ["-s", "a", "alloc_then_data"],
    ["-s", "a", "full"],
    ["a", "in_hole"],
    ["a_q", "late"],
    ["a_q", "late_q"],
    ["-T", "none", "a_q", "late"],
    ["-T", "none", "a", "full"],
    ["-p", "a", "full"],
]


@pytest.mark.parametrize("args", DEEP_CASES, ids=" ".join)
def test_compare_first_difference_with_reads_in_flight(qemu_img, blkimg,
                                                       deep, args):
    """The first difference in offset order is reported, as qemu-img's
    sequential walk finds it, although later reads are already done."""
    argv = ["compare"] + [deep.get(a, a) for a in args]
    rq = run2(qemu_img, argv)
    rb = run2(blkimg, argv)
    assert rb == rq
