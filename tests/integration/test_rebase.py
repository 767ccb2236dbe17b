# SPDX-License-Identifier: MIT
"""blkimg rebase against qemu-img 7.2 on identical backing chains: output,
exit code, the recorded backing file, the guest bytes (safe mode keeps
them), allocation, and qemu-img check."""
import pytest

from ops_helpers import (check_ok, guest_bytes, info_lines, layout, qio,
                         run_both, sh, twin_dirs)

pytestmark = pytest.mark.qemu

MiB = 1024 * 1024


def build_chain(qemu_img):
    def build(d):
        sh(qemu_img, "create", "-q", "-f", "qcow2", "base.qcow2", "4M", cwd=d)
        qio("base.qcow2", "write -P 1 0 3M", cwd=d)
        sh(qemu_img, "create", "-q", "-f", "qcow2", "-b", "base.qcow2", "-F",
           "qcow2", "mid.qcow2", cwd=d)
        qio("mid.qcow2", "write -P 3 512k 1M", "write -P 4 3584k 4k", cwd=d)
        sh(qemu_img, "create", "-q", "-f", "qcow2", "-b", "mid.qcow2", "-F",
           "qcow2", "top.qcow2", cwd=d)
        qio("top.qcow2", "write -P 2 1M 1M", "write -z 3M 64k",
            "write -P 9 3590k 1000", cwd=d)
        sh(qemu_img, "create", "-q", "-f", "raw", "new.raw", "4M", cwd=d)
        qio("new.raw", "write -P 5 0 1M", "write -P 1 2M 1M", fmt="raw",
            cwd=d)
        sh(qemu_img, "create", "-q", "-f", "qcow2", "short.qcow2", "2M",
           cwd=d)
        qio("short.qcow2", "write -P 3 0 2M", cwd=d)
        sh(qemu_img, "create", "-q", "-f", "raw", "plain.raw", "1M", cwd=d)
    return build


CASES = [
    # real stacks
    ["-p", "-u", "-F", "raw", "-b", "new.raw", "top.qcow2"],
    ["-p", "-b", "new.raw", "-F", "raw", "top.qcow2"],
    ["-b", "new.raw", "-F", "raw", "top.qcow2"],
    ["-q", "-p", "-b", "new.raw", "-F", "raw", "top.qcow2"],
    # onto an image further down the chain (only what changed above it)
    ["-b", "base.qcow2", "-F", "qcow2", "-p", "top.qcow2"],
    # a shorter new backing file; no backing file at all
    ["-b", "short.qcow2", "-F", "qcow2", "top.qcow2"],
    ["-p", "-b", "", "top.qcow2"],
    ["-u", "-b", "", "top.qcow2"],
    ["-u", "-b", "base.qcow2", "-F", "qcow2", "top.qcow2"],
    ["-t", "none", "-T", "none", "-b", "new.raw", "-F", "raw", "top.qcow2"],
    # errors
    ["-b", "new.raw", "top.qcow2"],  # safe mode, missing -F: after copy
    ["-u", "-b", "new.raw", "top.qcow2"],
    ["-b", "nothere", "-F", "raw", "top.qcow2"],
    ["-u", "-b", "nothere", "-F", "raw", "top.qcow2"],
    ["-F", "raw", "top.qcow2"],
    ["top.qcow2"],
    ["-b", "x", "-F", "vmdkx", "top.qcow2"],
    ["-t", "bad", "-b", "new.raw", "-F", "raw", "top.qcow2"],
    ["-T", "bad", "-b", "new.raw", "-F", "raw", "top.qcow2"],
    ["-u", "-b", "new.raw", "-F", "raw", "-f", "raw", "plain.raw"],
    ["-b", "new.raw", "-F", "raw", "-f", "raw", "plain.raw"],
    ["-b", "new.raw", "-F", "raw", "missing.qcow2"],
    ["-x", "-b", "new.raw", "top.qcow2"],
    ["-b", "new.raw", "-F", "raw", "top.qcow2", "extra"],
    [],
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: " ".join(c) or "none")
def test_rebase_matches_qemu(qemu_img, blkimg, tmp_path, case):
    q, b = twin_dirs(tmp_path, build_chain(qemu_img))
    before = guest_bytes(qemu_img, q / "top.qcow2", tmp_path)
    rq, rb = run_both(qemu_img, blkimg, ["rebase"] + case, q, b)
    assert rb == rq
    top = "plain.raw" if "plain.raw" in case else "top.qcow2"
    fmt = "raw" if top == "plain.raw" else None
    if rq[0] == 0 and "nothere" in case:
        # the image now names a missing backing file: header only
        assert info_lines(qemu_img, b / top) == info_lines(qemu_img, q / top)
        with open(q / top, "rb") as f:
            hq = f.read(65536)
        with open(b / top, "rb") as f:
            assert f.read(65536) == hq
        return
    assert guest_bytes(qemu_img, b / top, tmp_path, fmt) == \
        guest_bytes(qemu_img, q / top, tmp_path, fmt)
    if fmt:
        return
    assert info_lines(qemu_img, b / top) == info_lines(qemu_img, q / top)
    assert layout(qemu_img, b / top) == layout(qemu_img, q / top)
    assert check_ok(qemu_img, b / top)[0] == 0
    if rq[0] == 0 and "-u" not in case:
        # safe mode: what the guest sees did not change
        assert guest_bytes(qemu_img, b / top, tmp_path) == before
    if "-u" in case:
        # unsafe mode rewrites the header only: the same header cluster
        with open(q / top, "rb") as f:
            hq = f.read(65536)
        with open(b / top, "rb") as f:
            hb = f.read(65536)
        assert hb == hq


def test_rebase_real_stack_output(blkimg, qemu_img, tmp_path):
    q, b = twin_dirs(tmp_path, build_chain(qemu_img))
    rq, rb = run_both(qemu_img, blkimg,
                      ["rebase", "-p", "-u", "-F", "raw", "-b", "new.raw",
                       "top.qcow2"], q, b)
    assert rb == (0, b"    (0.00/100%)\r    (100.00/100%)\r\n", "")
    assert rb == rq


def test_rebase_relative_to_image_dir(blkimg, qemu_img, tmp_path):
    """-b names a file relative to the image, not to the working
    directory."""
    q, b = twin_dirs(tmp_path, build_chain(qemu_img))
    rq = run_both(qemu_img, blkimg, ["rebase", "-b", "new.raw", "-F", "raw",
                                     "q/top.qcow2"], tmp_path, tmp_path)[0]
    rb = run_both(qemu_img, blkimg, ["rebase", "-b", "new.raw", "-F", "raw",
                                     "b/top.qcow2"], tmp_path, tmp_path)[1]
    assert rq[0] == 0 and rb[0] == 0
    assert guest_bytes(qemu_img, b / "top.qcow2", tmp_path) == \
        guest_bytes(qemu_img, q / "top.qcow2", tmp_path)
    assert info_lines(qemu_img, b / "top.qcow2") == \
        info_lines(qemu_img, q / "top.qcow2")


def test_rebase_header_full(blkimg, qemu_img, tmp_path):
    """A backing name that does not fit in the header cluster: -ENOSPC
    message, image unchanged."""
    def build(d):
        sh(qemu_img, "create", "-q", "-f", "qcow2", "-o", "cluster_size=512",
           "t.qcow2", "1M", cwd=d)
    q, b = twin_dirs(tmp_path, build)
    name = "n" * 1000
    rq, rb = run_both(qemu_img, blkimg,
                      ["rebase", "-u", "-F", "raw", "-b", name, "t.qcow2"],
                      q, b)
    assert rb == rq
    assert rq[0] == 1
    assert info_lines(qemu_img, b / "t.qcow2") == \
        info_lines(qemu_img, q / "t.qcow2")
