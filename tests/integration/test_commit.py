# SPDX-License-Identifier: MIT
"""blkimg commit against qemu-img 7.2 on identical backing chains: output,
exit code, then every image of the chain: guest bytes, allocation (host
offsets aside: the order clusters are allocated in may differ) and
qemu-img check; the top's view is unchanged by the commit."""
import pytest

from ops_helpers import (check_ok, guest_bytes, info_lines, layout, qio,
                         run_both, sh)

pytestmark = pytest.mark.qemu

IMAGES = ("top.qcow2", "mid.qcow2", "base.qcow2")


def build(qemu_img, d, base_fmt="qcow2"):
    base = "base." + ("qcow2" if base_fmt == "qcow2" else "raw")
    sh(qemu_img, "create", "-q", "-f", base_fmt, base, "4M", cwd=d)
    qio(base, "write -P 1 0 3M", fmt=base_fmt, cwd=d)
    sh(qemu_img, "create", "-q", "-f", "qcow2", "-b", base, "-F", base_fmt,
       "mid.qcow2", cwd=d)
    qio("mid.qcow2", "write -P 3 512k 1M", "write -z 2560k 128k", cwd=d)
    # the top is larger than its backing files: the base grows
    sh(qemu_img, "create", "-q", "-f", "qcow2", "-b", "mid.qcow2", "-F",
       "qcow2", "top.qcow2", "5M", cwd=d)
    qio("top.qcow2", "write -P 2 1M 1M", "write -z 3M 64k",
        "write -P 7 4M 100k", "write -P 8 3000k 1000", cwd=d)
    sh(qemu_img, "create", "-q", "-f", "raw", "plain.raw", "1M", cwd=d)


def twin(qemu_img, tmp_path, base_fmt="qcow2"):
    q, b = tmp_path / "q", tmp_path / "b"
    for d in (q, b):
        d.mkdir()
        build(qemu_img, d, base_fmt)
    return q, b


CASES = [
    ["-p", "top.qcow2"],  # real stack
    ["top.qcow2"],
    ["-q", "top.qcow2"],
    ["-d", "top.qcow2"],
    ["-b", "base.qcow2", "top.qcow2"],
    ["-b", "mid.qcow2", "-q", "top.qcow2"],
    ["-t", "none", "top.qcow2"],
    ["-r", "100M", "top.qcow2"],
    ["-f", "qcow2", "mid.qcow2"],
    # errors
    ["-b", "nothere", "top.qcow2"],
    ["-b", "top.qcow2", "top.qcow2"],
    ["base.qcow2"],
    ["-f", "raw", "plain.raw"],
    ["-r", "1x", "top.qcow2"],
    ["-t", "foo", "top.qcow2"],
    ["-x", "top.qcow2"],
    ["missing.qcow2"],
    ["top.qcow2", "mid.qcow2"],
    [],
]


def compare_chain(qemu_img, q, b, tmp_path, images=IMAGES, file_holes=False):
    for img in images:
        assert guest_bytes(qemu_img, b / img, tmp_path) == \
            guest_bytes(qemu_img, q / img, tmp_path), img
        assert layout(qemu_img, b / img, file_holes) == \
            layout(qemu_img, q / img, file_holes), img
        assert info_lines(qemu_img, b / img) == \
            info_lines(qemu_img, q / img), img
        assert check_ok(qemu_img, b / img)[0] == 0, img


def progress_ok(out):
    """qemu-img's job progress lines: how many intermediate steps it
    prints depends on the job's internals; the frame is fixed."""
    return (out.startswith(b"    (0.00/100%)\r") and
            out.endswith(b"    (100.00/100%)\r\nImage committed.\n"))


@pytest.mark.parametrize("case", CASES, ids=lambda c: " ".join(c) or "none")
def test_commit_matches_qemu(qemu_img, blkimg, tmp_path, case):
    q, b = twin(qemu_img, tmp_path)
    before = guest_bytes(qemu_img, q / "top.qcow2", tmp_path)
    rq, rb = run_both(qemu_img, blkimg, ["commit"] + case, q, b)
    if "-p" in case:
        assert rb[0] == rq[0] == 0 and rb[2] == rq[2] == ""
        assert progress_ok(rq[1]) and progress_ok(rb[1])
    else:
        assert rb == rq
    compare_chain(qemu_img, q, b, tmp_path)
    assert guest_bytes(qemu_img, b / "top.qcow2", tmp_path) == before


def test_commit_empties_top(qemu_img, blkimg, tmp_path):
    """Without -d the top keeps no cluster (unallocated, not zero: the
    backing shows through) and its file data is freed."""
    q, b = twin(qemu_img, tmp_path)
    run_both(qemu_img, blkimg, ["commit", "top.qcow2"], q, b)
    lay = layout(qemu_img, b / "top.qcow2")
    assert all(e["depth"] > 0 or not e["present"] for e in lay), lay
    cp = check_ok(qemu_img, b / "top.qcow2")
    assert cp[0] == 0 and "leaked" not in cp[1]


def test_commit_into_raw_base(qemu_img, blkimg, tmp_path):
    q, b = twin(qemu_img, tmp_path, base_fmt="raw")
    rq, rb = run_both(qemu_img, blkimg, ["commit", "-b", "base.raw",
                                         "top.qcow2"], q, b)
    assert rb == rq
    assert rq[0] == 0
    assert guest_bytes(qemu_img, b / "base.raw", tmp_path, "raw") == \
        guest_bytes(qemu_img, q / "base.raw", tmp_path, "raw")
    compare_chain(qemu_img, q, b, tmp_path, ("top.qcow2", "mid.qcow2"))


def test_commit_with_snapshot_in_top(qemu_img, blkimg, tmp_path):
    """A top with an internal snapshot: its clusters are shared, emptying
    the active table must leave the snapshot intact."""
    q, b = twin(qemu_img, tmp_path)
    for d in (q, b):
        sh(qemu_img, "snapshot", "-c", "s1", "top.qcow2", cwd=d)
        qio("top.qcow2", "write -P 6 0 64k", cwd=d)
    rq, rb = run_both(qemu_img, blkimg, ["commit", "top.qcow2"], q, b)
    assert rb == rq
    compare_chain(qemu_img, q, b, tmp_path)
    for d in (q, b):
        sh(qemu_img, "snapshot", "-a", "s1", "top.qcow2", cwd=d)
    compare_chain(qemu_img, q, b, tmp_path, file_holes=True)
