# SPDX-License-Identifier: MIT
"""blkimg amend against qemu-img 7.2: output (progress lines included),
exit code, header cluster, qemu-img info, guest bytes, allocation and
qemu-img check on identical qcow2 images (v3 with a backing file and zero
clusters, v3 without backing, v2)."""
import pytest

from ops_helpers import (check_ok, guest_bytes, info_lines, layout, qio,
                         run_both, sh)

pytestmark = pytest.mark.qemu

MiB = 1024 * 1024


def build(qemu_img, d):
    sh(qemu_img, "create", "-q", "-f", "qcow2", "base.qcow2", "4M", cwd=d)
    qio("base.qcow2", "write -P 1 0 4M", cwd=d)
    # backed v3: data, zero clusters (plain and preallocated), holes
    sh(qemu_img, "create", "-q", "-f", "qcow2", "-b", "base.qcow2", "-F",
       "qcow2", "a.qcow2", cwd=d)
    qio("a.qcow2", "write -P 2 0 1M", "write -z 1M 1M", "write -P 3 3M 64k",
        "write -z 3M 64k", "write -P 4 3200k 1000", cwd=d)
    # no backing file
    sh(qemu_img, "create", "-q", "-f", "qcow2", "n.qcow2", "4M", cwd=d)
    qio("n.qcow2", "write -P 2 0 1M", "write -z 1M 1M", cwd=d)
    # v2 with lazy refcounts impossible; plain v2 image
    sh(qemu_img, "create", "-q", "-f", "qcow2", "-o", "compat=0.10",
       "v2.qcow2", "4M", cwd=d)
    qio("v2.qcow2", "write -P 5 64k 1M", cwd=d)
    # v3 with lazy refcounts, several L2 tables of zeroes
    # (4 KiB clusters: an L2 table per 2 MiB, progress in many steps)
    sh(qemu_img, "create", "-q", "-f", "qcow2", "-o",
       "lazy_refcounts=on,cluster_size=4k", "lazy.qcow2", "64M", cwd=d)
    qio("lazy.qcow2", "write -z 0 20M", "write -P 6 20M 64k",
        "write -z 30M 10M", cwd=d)
    sh(qemu_img, "create", "-q", "-f", "raw", "r.raw", "1M", cwd=d)


def twin(qemu_img, tmp_path):
    q, b = tmp_path / "q", tmp_path / "b"
    for d in (q, b):
        d.mkdir()
        build(qemu_img, d)
    return q, b


IMAGES = ["a.qcow2", "n.qcow2", "v2.qcow2", "lazy.qcow2"]

OPTIONS = [
    ["-o", "compat=0.10"],  # real stack
    ["-p", "-o", "compat=0.10"],
    ["-p", "-o", "compat=v2"],
    ["-o", "compat=1.1", "-p"],
    ["-o", "compat=v3,lazy_refcounts=on"],
    ["-p", "-o", "lazy_refcounts=on"],
    ["-o", "lazy_refcounts=off"],
    ["-o", "lazy_refcounts=off,compat=0.10"],
    ["-o", "compat=0.10,lazy_refcounts=on"],
    ["-o", "compat=1.1", "-o", "lazy_refcounts=on"],
    ["-o", "size=8M"],
    ["-q", "-p", "-o", "size=128M"],
    ["-o", "refcount_bits=16"],
    ["-o", "compat=0.10,refcount_bits=8"],
    ["-o", "refcount_bits=3"],
    ["-o", "refcount_bits=abc"],
    ["-o", "compat=2"],
    ["-o", "compat"],
    ["-o", "lazy_refcounts=x"],
    ["-o", "size=abc"],
    ["-o", "size=2M,,"],
    ["-o", ",,"],
    ["-o", ""],
    ["-o", "foo=bar", "-p"],
    ["-o", "cluster_size=4k"],
    ["-o", "extended_l2=on"],
    ["-o", "nocow=on"],
    ["-o", "backing_file=x"],
    ["-o", "backing_fmt=raw"],
    ["-o", "data_file=x"],
    ["-o", "data_file_raw=on"],
    ["-o", "encrypt.state=active"],
    ["-o", "help"],
    ["-f", "qcow2", "-o", "help"],
    ["-t", "bad", "-o", "size=4M"],
    ["-p"],
    ["-x", "-o", "size=4M"],
    ["-o", "size=4M", "-f", "raw"],
]


def _ids(c):
    return " ".join(c) or "none"


def _compare(qemu_img, q, b, img, tmp_path):
    assert info_lines(qemu_img, b / img) == info_lines(qemu_img, q / img)
    assert guest_bytes(qemu_img, b / img, tmp_path) == \
        guest_bytes(qemu_img, q / img, tmp_path)
    assert layout(qemu_img, b / img) == layout(qemu_img, q / img)
    rc, out = check_ok(qemu_img, b / img)
    assert rc == 0, out
    # the header cluster as qemu-img writes it (fields, extensions)
    with open(q / img, "rb") as f:
        hq = f.read(4096)
    with open(b / img, "rb") as f:
        assert f.read(4096) == hq


@pytest.mark.parametrize("img", IMAGES)
@pytest.mark.parametrize("opts", OPTIONS, ids=_ids)
def test_amend_matches_qemu(qemu_img, blkimg, tmp_path, opts, img):
    q, b = twin(qemu_img, tmp_path)
    before = guest_bytes(qemu_img, q / img, tmp_path)
    rq, rb = run_both(qemu_img, blkimg, ["amend"] + opts + [img], q, b)
    assert rb == rq
    _compare(qemu_img, q, b, img, tmp_path)
    # amend never changes what the guest reads (size changes aside)
    if not any(o.startswith("size=") for o in opts):
        assert guest_bytes(qemu_img, b / img, tmp_path) == before


@pytest.mark.parametrize("args", [
    ["amend", "-o", "size=2M", "r.raw"],
    ["amend", "-f", "raw", "-o", "size=2M", "r.raw"],
    ["amend", "-f", "raw", "-o", "help"],
    ["amend", "-o", "compat=1.1", "a.qcow2", "n.qcow2"],
    ["amend", "-o", "compat=1.1", "missing.qcow2"],
    ["amend", "-o", "compat=1.1"],
    ["amend", "a.qcow2"],
], ids=_ids)
def test_amend_errors_match_qemu(qemu_img, blkimg, tmp_path, args):
    q, b = twin(qemu_img, tmp_path)
    rq, rb = run_both(qemu_img, blkimg, args, q, b)
    assert rb == rq
    assert rq[0] != 0 or "help" in args


def test_amend_round_trip(qemu_img, blkimg, tmp_path):
    """Down to 0.10 and back up with blkimg alone: same bytes as qemu-img
    doing the same, every step passes check."""
    q, b = twin(qemu_img, tmp_path)
    for o in ("compat=0.10", "compat=1.1", "lazy_refcounts=on",
              "compat=0.10,lazy_refcounts=off", "compat=1.1"):
        rq, rb = run_both(qemu_img, blkimg, ["amend", "-o", o, "a.qcow2"],
                          q, b)
        assert rb == rq == (0, b"", "")
        _compare(qemu_img, q, b, "a.qcow2", tmp_path)
