# SPDX-License-Identifier: MIT
"""blkimg rebase against qemu-img 7.2 on identical backing chains: output,
exit code, the recorded backing file, the guest bytes (safe mode keeps
them), allocation, and qemu-img check."""
import signal
import subprocess
import time

import pytest

from ops_helpers import (check_ok, guest_bytes, info_lines, layout,
                         pristine_view, qio, run_both, sh, twin_copy)

pytestmark = pytest.mark.qemu

MiB = 1024 * 1024


@pytest.fixture
def twin(prebuilt, tmp_path):
    """twin(key, build) -> (q, b): the images build(dir) makes, built once
    per worker and key, copied for qemu-img (q/) and for blkimg (b/)."""
    def twin_(key, build):
        return twin_copy(prebuilt(("rebase",) + key, build), tmp_path)
    return twin_


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
def test_rebase_matches_qemu(qemu_img, blkimg, tmp_path, twin, case):
    q, b = twin(("chain",), build_chain(qemu_img))
    before = pristine_view(qemu_img, q / "top.qcow2", tmp_path)
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


def test_rebase_real_stack_output(blkimg, qemu_img, tmp_path, twin):
    q, b = twin(("chain",), build_chain(qemu_img))
    rq, rb = run_both(qemu_img, blkimg,
                      ["rebase", "-p", "-u", "-F", "raw", "-b", "new.raw",
                       "top.qcow2"], q, b)
    assert rb == (0, b"    (0.00/100%)\r    (100.00/100%)\r\n", "")
    assert rb == rq


def test_rebase_relative_to_image_dir(blkimg, qemu_img, tmp_path, twin):
    """-b names a file relative to the image, not to the working
    directory."""
    q, b = twin(("chain",), build_chain(qemu_img))
    rq = run_both(qemu_img, blkimg, ["rebase", "-b", "new.raw", "-F", "raw",
                                     "q/top.qcow2"], tmp_path, tmp_path)[0]
    rb = run_both(qemu_img, blkimg, ["rebase", "-b", "new.raw", "-F", "raw",
                                     "b/top.qcow2"], tmp_path, tmp_path)[1]
    assert rq[0] == 0 and rb[0] == 0
    assert guest_bytes(qemu_img, b / "top.qcow2", tmp_path) == \
        guest_bytes(qemu_img, q / "top.qcow2", tmp_path)
    assert info_lines(qemu_img, b / "top.qcow2") == \
        info_lines(qemu_img, q / "top.qcow2")


def test_rebase_header_full(blkimg, qemu_img, tmp_path, twin):
    """A backing name that does not fit in the header cluster: -ENOSPC
    message, image unchanged."""
    def build(d):
        sh(qemu_img, "create", "-q", "-f", "qcow2", "-o", "cluster_size=512",
           "t.qcow2", "1M", cwd=d)
    q, b = twin(("header-full",), build)
    name = "n" * 1000
    rq, rb = run_both(qemu_img, blkimg,
                      ["rebase", "-u", "-F", "raw", "-b", name, "t.qcow2"],
                      q, b)
    assert rb == rq
    assert rq[0] == 1
    assert info_lines(qemu_img, b / "t.qcow2") == \
        info_lines(qemu_img, q / "t.qcow2")


# ------------------------------------------------- the parallel copy path


def random_writes(seed, size, n):
    """qemu-io commands: n writes of data patterns, zero writes and
    discards at random (partly unaligned) offsets."""
    import random
    r = random.Random(seed)
    cmds = []
    for _ in range(n):
        length = r.choice([512, 4096, 65536, 3 * 65536 + 512, MiB, 3 * MiB])
        off = r.randrange(0, size - length) // 512 * 512
        kind = r.random()
        if kind < 0.7:
            cmds.append("write -P %d %d %d" % (r.randrange(1, 4), off,
                                                length))
        elif kind < 0.9:
            cmds.append("write -z %d %d" % (off, length))
        else:
            cmds.append("discard %d %d" % (off, length))
    return cmds


def build_big(qemu_img, size=64, top_opts=()):
    """base <- mid1 <- mid2 <- top, and new.qcow2 / new.raw / short.qcow2
    sharing part of the patterns (so that some ranges are equal, others
    differ), each layer with many small extents."""
    def build(d):
        sh(qemu_img, "create", "-q", "-f", "qcow2", "base.qcow2",
           "%dM" % size, cwd=d)
        qio("base.qcow2", *random_writes(1, size * MiB, 50), cwd=d)
        prev = "base.qcow2"
        for i, name in enumerate(("mid1.qcow2", "mid2.qcow2")):
            sh(qemu_img, "create", "-q", "-f", "qcow2", "-b", prev, "-F",
               "qcow2", name, cwd=d)
            qio(name, *random_writes(10 + i, size * MiB, 50), cwd=d)
            prev = name
        sh(qemu_img, "create", "-q", "-f", "qcow2", *top_opts, "-b", prev,
           "-F", "qcow2", "top.qcow2", cwd=d)
        qio("top.qcow2", *random_writes(20, size * MiB, 40), cwd=d)
        # a new backing file: the base's data with part of it changed
        sh(qemu_img, "convert", "-O", "qcow2", "base.qcow2", "new.qcow2",
           cwd=d)
        qio("new.qcow2", *random_writes(30, size * MiB, 30), cwd=d)
        sh(qemu_img, "convert", "-O", "raw", "new.qcow2", "new.raw", cwd=d)
        sh(qemu_img, "create", "-q", "-f", "qcow2", "short.qcow2",
           "%dM" % (size // 3), cwd=d)
        qio("short.qcow2", *random_writes(40, size // 3 * MiB, 20), cwd=d)
    return build


BIG_CASES = [
    ["-p", "-b", "new.qcow2", "-F", "qcow2"],
    ["-p", "-t", "none", "-T", "none", "-b", "new.raw", "-F", "raw"],
    ["-b", "short.qcow2", "-F", "qcow2", "-p"],
    ["-p", "-b", ""],
    # onto images further down the chain (only what changed above them)
    ["-p", "-b", "mid1.qcow2", "-F", "qcow2"],
    ["-p", "-b", "base.qcow2", "-F", "qcow2", "-t", "none", "-T", "none"],
]


def _big_params():
    """Every case with 64k and with 4k clusters in the top; each case runs
    with one of them on the sanitizer pass (the other is `slow`: the
    normal build runs it)."""
    out = []
    for t, top_opts in enumerate([(), ("-o", "cluster_size=4096")]):
        for c, case in enumerate(BIG_CASES):
            out.append(pytest.param(
                case, top_opts,
                id="%s-%s" % (" ".join(top_opts) or "64k", " ".join(case)),
                marks=[pytest.mark.slow] if (t + c) % 2 else []))
    return out


@pytest.mark.parametrize("case,top_opts", _big_params())
def test_rebase_many_extents(qemu_img, blkimg, tmp_path, twin, case,
                             top_opts):
    """Chains of depth 3 with many extents: the same output (progress
    lines byte for byte), guest bytes, allocation and check results as
    qemu-img."""
    q, b = twin(("big", top_opts), build_big(qemu_img, top_opts=top_opts))
    before = pristine_view(qemu_img, q / "top.qcow2", tmp_path)
    rq, rb = run_both(qemu_img, blkimg, ["rebase"] + case + ["top.qcow2"],
                      q, b)
    assert rb == rq
    assert rq[0] == 0
    assert guest_bytes(qemu_img, b / "top.qcow2", tmp_path) == before
    assert guest_bytes(qemu_img, q / "top.qcow2", tmp_path) == before
    assert info_lines(qemu_img, b / "top.qcow2") == \
        info_lines(qemu_img, q / "top.qcow2")
    assert layout(qemu_img, b / "top.qcow2") == \
        layout(qemu_img, q / "top.qcow2")
    assert check_ok(qemu_img, b / "top.qcow2")[0] == 0


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_rebase_interrupted(qemu_img, blkimg, tmp_path, sig):
    """A signal stops a safe rebase after the requests in flight: exit 1,
    one message, the old backing file still recorded, the image
    consistent and its view unchanged."""
    d = tmp_path
    size = 32 * 1024
    sh(qemu_img, "create", "-q", "-f", "raw", "old.raw", "%dM" % size, cwd=d)
    sh(qemu_img, "create", "-q", "-f", "raw", "new.raw", "%dM" % size, cwd=d)
    qio("old.raw", "write -P 1 0 16M", fmt="raw", cwd=d)
    sh(qemu_img, "create", "-q", "-f", "qcow2", "-b", "old.raw", "-F", "raw",
       "top.qcow2", cwd=d)
    info = info_lines(qemu_img, d / "top.qcow2")
    # comparing 32 GiB of (sparse) backing files takes longer than the wait
    p = subprocess.Popen([str(blkimg), "rebase", "-b", "new.raw", "-F",
                          "raw", "top.qcow2"], cwd=d,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        time.sleep(0.5)
        if p.poll() is not None:
            pytest.skip("rebase finished before the signal")
        t0 = time.time()
        p.send_signal(sig)
        out, err = p.communicate(timeout=30)
        elapsed = time.time() - t0
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    name = "SIGINT" if sig == signal.SIGINT else "SIGTERM"
    err = err.decode()
    assert p.returncode == 1, err
    assert err.startswith("blkimg: Interrupted by %s: 'top.qcow2' still "
                          "uses its old backing file" % name), err
    assert err.count("\n") == 1
    assert elapsed < 10
    assert info_lines(qemu_img, d / "top.qcow2") == info
    assert check_ok(qemu_img, d / "top.qcow2")[0] == 0
    cp = subprocess.run([qemu_img, "compare", "-U", "-f", "raw", "-F",
                         "qcow2", str(d / "old.raw"), str(d / "top.qcow2")],
                        capture_output=True)
    assert cp.returncode == 0, cp.stdout
