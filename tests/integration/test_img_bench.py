# SPDX-License-Identifier: MIT
"""blkimg bench vs qemu-img 7.2 bench: output (timing masked), option
validation, errors and exit codes; what write runs leave in the image;
the --random and --stats extensions."""
import os
import re

import pytest

from conftest import qemu_pbkdf2_retry
from test_img_helpers import (assert_same, both, mask_timing, qemu, qemu_io,
                              run)

pytestmark = pytest.mark.qemu


@pytest.fixture(scope="module")
def img(qemu_img, tmp_path_factory):
    d = tmp_path_factory.mktemp("bench")
    qemu(qemu_img, "create", "-q", "-f", "raw", d / "a.raw", "64M")
    qemu(qemu_img, "create", "-q", "-f", "qcow2", d / "b.qcow2", "64M")
    return d


CASES = [
    ["-c", "1000", "a.raw"],
    ["-c", "1000", "-f", "raw", "a.raw"],
    ["-c", "1000", "b.qcow2"],
    ["-c", "0", "a.raw"],
    ["-q", "-c", "10", "a.raw"],
    ["-c", "10", "-d", "2", "-s", "512", "-S", "1024", "-o", "1k", "a.raw"],
    ["-c", "100", "-s", "1.5k", "a.raw"],
    ["-c", "10", "-s", "0", "a.raw"],
    ["-c", "100", "-S", "0", "a.raw"],
    ["-c", "3000", "-o", "60M", "a.raw"],  # wraps at the image end
    ["-c", "100", "-t", "none", "a.raw"],
    ["-c", "100", "-n", "-t", "none", "a.raw"],
    ["-c", "100", "-i", "native", "-t", "none", "a.raw"],
    ["-c", "100", "-i", "io_uring", "a.raw"],
    ["-c", "100", "-i", "threads", "a.raw"],
    ["-c", "100", "-U", "a.raw"],
    ["-c", "100", "--no-drain", "a.raw"],
    ["-c", "1000", "-w", "-f", "raw", "--flush-interval=100", "a.raw"],
    ["-c", "1000", "-w", "-f", "raw", "--flush-interval=64", "--no-drain",
     "a.raw"],
    ["-c", "1000", "-w", "-f", "qcow2", "-d", "8", "--flush-interval=8",
     "b.qcow2"],
    ["-c", "100", "-w", "--pattern=0x5a", "-f", "raw", "a.raw"],
    ["-c", "100", "-w", "a.raw"],  # probed raw: the warning
    ["-c", "100", "--image-opts", "driver=raw,file.filename=a.raw"],
    # errors
    ["-c", "10", "-o", "1G", "a.raw"],
    ["--flush-interval=100", "a.raw"],
    ["-c", "100", "-w", "--flush-interval=10", "a.raw"],
    ["-c", "abc", "a.raw"],
    ["-c", "-1", "a.raw"],
    ["-c", "3000000000", "a.raw"],
    ["-d", "-5", "a.raw"],
    ["-d", "x", "a.raw"],
    ["-s", "3G", "a.raw"],
    ["-s", "x", "a.raw"],
    ["-S", "1x", "a.raw"],
    ["-S", "3G", "a.raw"],
    ["-o", "-1", "a.raw"],
    ["-o", "9E", "a.raw"],
    ["--pattern=256", "a.raw"],
    ["--pattern=x", "a.raw"],
    ["--flush-interval=x", "a.raw"],
    ["-t", "bad", "a.raw"],
    ["-i", "bad", "a.raw"],
    ["-c", "10", "-n", "a.raw"],
    ["-c", "10", "-i", "native", "a.raw"],
    ["-c", "10", "-i", "threads", "-n", "a.raw"],
    ["-c", "10", "-n", "-i", "threads", "a.raw"],
    ["-c", "10", "-i", "native", "-i", "io_uring", "a.raw"],
    ["-c", "10", "-w", "-U", "-f", "raw", "a.raw"],
    ["-c", "10", "-f", "qcow2", "a.raw"],
    ["-c", "10", "nonexist"],
    [],
    ["a.raw", "b.qcow2"],
    ["-Z", "a.raw"],
    ["-c"],
]


@pytest.mark.parametrize("args", CASES, ids=lambda a: " ".join(a) or "none")
def test_bench_same_as_qemu(qemu_img, blkimg, img, args):
    cq, cb = both(qemu_img, blkimg, ["bench"] + args, cwd_q=img)
    assert_same(cq, cb, mask=mask_timing, what="bench " + " ".join(args))


def test_bench_timing_line(blkimg, img):
    cp = run([blkimg, "bench", "-c", "2000", "-d", "16", "a.raw"], cwd=img)
    assert cp.returncode == 0
    lines = cp.stdout.splitlines()
    assert lines[0] == ("Sending 2000 read requests, 4096 bytes each, 16 in "
                        "parallel (starting at offset 0, step size 4096)")
    assert re.fullmatch(r"Run completed in \d+\.\d{3} seconds\.", lines[1])
    assert len(lines) == 2


def test_bench_write_leaves_the_pattern(qemu_img, blkimg, tmp_path):
    """-w writes the pattern byte at offset, offset+step, ... like qemu."""
    for tool in (qemu_img, blkimg):
        d = tmp_path / os.path.basename(tool)
        d.mkdir()
        qemu(qemu_img, "create", "-q", "-f", "raw", d / "w.raw", "1M")
        cp = run([tool, "bench", "-w", "-f", "raw", "-c", "10", "-d", "4",
                  "-s", "4k", "-S", "8k", "-o", "4k", "--pattern=0xab",
                  "w.raw"], cwd=d)
        assert cp.returncode == 0, cp.stderr
    qd = (tmp_path / "qemu-img" / "w.raw").read_bytes()
    bd = (tmp_path / "blkimg" / "w.raw").read_bytes()
    assert bd == qd
    assert bd[4096:8192] == b"\xab" * 4096
    assert bd[8192:12288] == b"\0" * 4096


def test_bench_qcow2_write_then_check(qemu_img, blkimg, tmp_path):
    qemu(qemu_img, "create", "-q", "-f", "qcow2", tmp_path / "w.qcow2", "8M")
    cp = run([blkimg, "bench", "-w", "-f", "qcow2", "-c", "4000", "-d", "32",
              "--pattern=7", "--flush-interval=500", "w.qcow2"],
             cwd=tmp_path)
    assert cp.returncode == 0, cp.stderr
    ck = run([qemu_img, "check", "w.qcow2"], cwd=tmp_path)
    assert ck.returncode == 0, ck.stdout + ck.stderr
    rd = qemu_io("-f", "qcow2", "-c", "read -P 7 0 8M", "w.qcow2",
                 cwd=tmp_path)
    assert "Pattern verification failed" not in rd.stdout


def test_bench_random_and_stats(blkimg, img):
    cp = run([blkimg, "bench", "-c", "5000", "-d", "32", "-t", "none",
              "--random=7", "--stats", "a.raw"], cwd=img)
    assert cp.returncode == 0, cp.stderr
    lines = cp.stdout.splitlines()
    assert lines[0] == ("Sending 5000 read requests, 4096 bytes each, 32 in "
                        "parallel (random offsets in [0, 67108864), step "
                        "size 4096, seed 7)")
    assert re.fullmatch(r"Run completed in \d+\.\d{3} seconds\.", lines[1])
    assert lines[2] == "stats for 'a.raw' (protocol node):"
    stats = dict(l.strip().split(": ") for l in lines[3:])
    assert int(stats["bytes read"]) >= 5000 * 4096
    assert int(stats["bounced bytes"]) == 0
    assert int(stats["rmw operations"]) == 0
    assert int(stats["io calls"]) >= 5000


def test_bench_random_writes_are_in_range_and_aligned(qemu_img, blkimg,
                                                      tmp_path):
    """--random: every request at offset + k * step, inside the image."""
    qemu(qemu_img, "create", "-q", "-f", "raw", tmp_path / "r.raw", "1M")
    cp = run([blkimg, "bench", "-w", "-f", "raw", "-c", "200", "-d", "8",
              "-s", "512", "-S", "4k", "-o", "64k", "--random",
              "--pattern=1", "r.raw"], cwd=tmp_path)
    assert cp.returncode == 0, cp.stderr
    data = (tmp_path / "r.raw").read_bytes()
    assert len(data) == 1 << 20
    assert data[:65536] == b"\0" * 65536
    touched = 0
    for off in range(65536, 1 << 20, 4096):
        blk = data[off:off + 4096]
        assert blk[512:] == b"\0" * 3584
        if blk[:512] == b"\1" * 512:
            touched += 1
        else:
            assert blk[:512] == b"\0" * 512
    assert touched > 20


def test_bench_object_opens_an_encrypted_image(qemu_img, blkimg, tmp_path):
    """--object (blkimg only): a secret for a LUKS image; its reads are
    the plaintext qemu-io wrote, and a wrong key is refused as info
    refuses it."""
    sec = "secret,id=s0,data=pw"
    cp = qemu_pbkdf2_retry([qemu_img, "create", "-q", "-f", "luks",
                            "--object", sec, "-o", "key-secret=s0,iter-time=10",
                            tmp_path / "e.luks", "4M"])
    assert cp.returncode == 0, cp.stderr
    qemu_io("--object", sec, "--image-opts", "-c", "write -P 0x3c 0 4M",
            "driver=luks,key-secret=s0,file.filename=e.luks", cwd=tmp_path)
    opts = "driver=luks,key-secret=s0,file.filename=e.luks"
    cp = run([blkimg, "bench", "--object", sec, "--image-opts", "-c", "2000",
              "-d", "16", "-t", "none", "--random", opts], cwd=tmp_path)
    assert cp.returncode == 0, cp.stderr
    assert cp.stdout.startswith("Sending 2000 read requests")
    cp = run([blkimg, "bench", "-w", "--pattern=0x3c", "--object", sec,
              "--image-opts", "-c", "64", "-s", "64k", opts], cwd=tmp_path)
    assert cp.returncode == 0, cp.stderr
    rd = qemu_io("--object", sec, "--image-opts", "-c", "read -P 0x3c 0 4M",
                 opts, cwd=tmp_path)
    assert "Pattern verification failed" not in rd.stdout, rd.stdout
    # a wrong key: refused in the words of qemu-img convert's open
    bad = ["--object", "secret,id=s0,data=wrong", "--image-opts", opts]
    cb = run([blkimg, "bench", *bad, "-c", "1"], cwd=tmp_path)
    cq = run([qemu_img, "convert", *bad, "-O", "raw", "out.raw"],
             cwd=tmp_path)
    assert cb.returncode == cq.returncode == 1
    assert cb.stderr.replace("blkimg:", "qemu-img:") == cq.stderr
    assert "Invalid password, cannot unlock any keyslot" in cb.stderr
    # a bad object: refused as the subcommands that take --object do
    cb = run([blkimg, "bench", "--object", "x", "a.raw"], cwd=tmp_path)
    ci = run([blkimg, "info", "--object", "x", "a.raw"], cwd=tmp_path)
    assert cb.returncode == ci.returncode == 1
    assert cb.stderr == ci.stderr and len(cb.stderr.splitlines()) == 1


def test_bench_help_documents_extensions(blkimg):
    cp = run([blkimg, "bench", "--help"])
    assert cp.returncode == 0
    assert "--random" in cp.stdout and "--stats" in cp.stdout
    assert "'--object'" in cp.stdout
    assert ("bench [-c count] [-d depth] [-f fmt] "
            "[--flush-interval=flush_interval] [-i aio] [-n] [--no-drain] "
            "[-o offset] [--pattern=pattern] [-q] [-s buffer_size] "
            "[-S step_size] [-t cache] [-w] [-U] filename") in cp.stdout


@pytest.mark.root
@pytest.mark.parametrize("kind", ["ext4-4k", "xfs-4k"])
def test_bench_unaligned_direct_writes_on_4k_storage(qemu_img, blkimg, kind):
    """512-byte O_DIRECT writes on 4096-byte sectors: the same result as
    qemu-img bench, and --stats shows the read-modify-write it took."""
    from storage import make
    with make(kind) as st:
        files = {}
        for tool in (qemu_img, blkimg):
            p = st.path(os.path.basename(tool) + ".raw")
            qemu(qemu_img, "create", "-q", "-f", "raw", p, "1M")
            args = [tool, "bench", "-w", "-f", "raw", "-t", "none", "-c",
                    "64", "-d", "4", "-s", "512", "-S", "1536",
                    "--pattern=0x3c", p]
            if tool == blkimg:
                args.insert(2, "--stats")
            cp = run(args)
            assert cp.returncode == 0, cp.stderr
            files[tool] = (p, cp.stdout)
        with open(files[qemu_img][0], "rb") as f:
            want = f.read()
        with open(files[blkimg][0], "rb") as f:
            got = f.read()
        assert got == want
        assert got[1536:2048] == b"\x3c" * 512
        stats = dict(l.strip().split(": ") for l in
                     files[blkimg][1].splitlines()[3:])
        assert int(stats["rmw operations"]) > 0
        assert int(stats["bytes written"]) >= 64 * 512
