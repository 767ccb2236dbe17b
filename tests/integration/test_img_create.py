# SPDX-License-Identifier: MIT
"""blkimg create vs qemu-img 7.2 create: output, errors, exit codes and the
resulting files, in two directories prepared the same way."""
import os

import pytest

from test_img_helpers import assert_same, both, qemu, run

pytestmark = pytest.mark.qemu


def dirs(tmp_path):
    q, b = tmp_path / "q", tmp_path / "b"
    q.mkdir()
    b.mkdir()
    return q, b


CASES = [
    ["x.raw", "1G"],
    ["-f", "raw", "x.raw", "1M"],
    ["-q", "x.raw", "1M"],
    ["x.raw", "1.5k"],
    ["x.raw", "0.5k"],
    ["x.raw", "1.k"],
    ["x.raw", "512b"],
    ["x.raw", "0x100"],
    ["x.raw", "0"],
    ["-f", "qcow2", "x.qcow2", "1G"],
    ["-f", "qcow2", "-o", "cluster_size=4k", "x.qcow2", "1M"],
    ["-f", "qcow2", "-o", "cluster_size=2M,lazy_refcounts=on", "x.qcow2",
     "64M"],
    ["-f", "qcow2", "-o", "compat=0.10", "x.qcow2", "1M"],
    ["-f", "qcow2", "-o", "cluster_size=4k", "-o", "refcount_bits=8",
     "x.qcow2", "1M"],
    ["-o", "size=1M", "x.raw"],
    ["-o", "preallocation=full", "x.raw", "1M"],
    ["-o", "preallocation=falloc", "x.raw", "1M"],
    ["-f", "qcow2", "-o", "preallocation=metadata", "x.qcow2", "1M"],
    ["-f", "qcow2", "-o", "compression_type=zstd", "x.qcow2", "1M"],
    ["-f", "qcow2", "-o", "extended_l2=on,cluster_size=4k", "x.qcow2", "1M"],
    ["-f", "qcow2", "-o", "data_file=d.raw", "x.qcow2", "1M"],
    ["-f", "qcow2", "-o", "nocow=on", "x.qcow2", "1M"],
    ["-o", "extent_size_hint=2M", "x.raw", "1M"],
    ["-f", "qcow2", "-o", "lazy_refcounts", "x.qcow2", "1M"],
    ["-f", "qcow2", "-o", "nolazy_refcounts", "x.qcow2", "1M"],
    # qemu's spellings of booleans and numbers; the line in qemu's order
    ["-f", "qcow2", "-o", "lazy_refcounts=yes,refcount_bits=0x10",
     "x.qcow2", "1M"],
    ["-f", "qcow2", "-o", "lazy_refcounts=y,extended_l2=false",
     "x.qcow2", "1M"],
    ["-o", "preallocation=off,nocow=on,extent_size_hint=0x100000", "x.raw",
     "1M"],
    # errors
    ["x.raw"],
    ["x.raw", "1Q"],
    ["x.raw", "1e3"],
    ["x.raw", "1k5"],
    ["x.raw", "1.5"],
    ["x.raw", "9E"],
    ["x.raw", "16E"],
    ["x.raw", "-1"],
    ["-f", "foo", "x.raw", "1G"],
    [],
    ["x.raw", "1G", "extra"],
    ["-Z", "x.raw"],
    ["-f"],
    ["x.raw", "1G", "-o"],
    ["-o", ",foo", "x.raw", "1G"],
    ["-o", "foo,", "x.raw", "1G"],
    ["-o", "foo=bar", "x.raw", "1G"],
    ["-o", "size=1M", "x.raw", "2M"],
    ["-b", "base.raw", "-F", "raw", "x.raw", "1M"],
    ["-F", "raw", "x.raw", "1M"],
    ["-f", "qcow2", "-F", "raw", "x.qcow2", "1M"],
    ["-f", "qcow2", "-b", "x.qcow2", "-F", "qcow2", "x.qcow2", "1M"],
    ["-f", "qcow2", "-b", "", "-F", "raw", "x.qcow2", "1M"],
    ["-f", "qcow2", "-o", "cluster_size=3k", "x.qcow2", "1M"],
    ["-f", "qcow2", "-o", "cluster_size=abc", "x.qcow2", "1M"],
    ["-f", "qcow2", "-o", "refcount_bits=abc", "x.qcow2", "1M"],
    ["-f", "qcow2", "-o", "refcount_bits=3", "x.qcow2", "1M"],
    ["-f", "qcow2", "-o", "lazy_refcounts=maybe", "x.qcow2", "1M"],
    ["-f", "qcow2", "-o", "lazy_refcounts=ON", "x.qcow2", "1M"],
    ["-f", "qcow2", "-o", "compat=2", "x.qcow2", "1M"],
    ["-f", "qcow2", "-o", "compression_type=lz4", "x.qcow2", "1M"],
    ["-f", "qcow2", "-o", "=5", "x.qcow2", "1M"],
    ["-f", "qcow2", "-o", "cluster_size", "x.qcow2", "1M"],
    ["-o", "preallocation=bad", "x.raw", "1M"],
    ["-o", "size=abc", "x.raw"],
    ["x.raw", "0x10k"],
    ["--nonexistent-option", "x.raw", "1M"],
    ["/nonexistent-dir/x.raw", "1M"],
    # -o help
    ["-o", "help"],
    ["-o", "?"],
    ["-f", "qcow2", "-o", "help"],
    ["-f", "raw", "-o", "help", "x.raw"],
    ["-f", "qcow2", "-o", "cluster_size=1k,help", "x.qcow2"],
    ["-f", "foo", "-o", "help"],
]


@pytest.mark.parametrize("args", CASES, ids=lambda a: " ".join(a) or "none")
def test_create_same_as_qemu(qemu_img, blkimg, tmp_path, args):
    q, b = dirs(tmp_path)
    for d in (q, b):
        qemu(qemu_img, "create", "-q", "-f", "raw", d / "base.raw", "1M")
    cq, cb = both(qemu_img, blkimg, ["create"] + args, cwd_q=q, cwd_b=b)
    assert_same(cq, cb, what="create " + " ".join(args))
    # the same files, of the same size and format
    names = sorted(os.listdir(q))
    assert sorted(os.listdir(b)) == names
    for n in names:
        assert os.path.getsize(q / n) == os.path.getsize(b / n), n
        if n.endswith(".qcow2"):
            iq = run([qemu_img, "info", "--output=json", n], cwd=q)
            ib = run([qemu_img, "info", "--output=json", n], cwd=b)
            assert ib.returncode == iq.returncode == 0, ib.stderr
            drop = lambda s: "\n".join(
                l for l in s.splitlines() if "actual-size" not in l)
            assert drop(ib.stdout) == drop(iq.stdout)
            ck = run([qemu_img, "check", n], cwd=b)
            assert ck.returncode == 0, ck.stdout + ck.stderr


def test_create_backing_chain(qemu_img, blkimg, tmp_path):
    """Overlays: size from the backing file, backing format required,
    missing backing files, -u."""
    q, b = dirs(tmp_path)
    for d in (q, b):
        qemu(qemu_img, "create", "-q", "-f", "qcow2", d / "base.qcow2", "3M")
    for args in (
        ["-f", "qcow2", "-b", "base.qcow2", "-F", "qcow2", "top.qcow2"],
        ["-f", "qcow2", "-b", "base.qcow2", "-F", "qcow2", "top2.qcow2",
         "5M"],
        ["-f", "qcow2", "-b", "base.qcow2", "top3.qcow2"],
        ["-f", "qcow2", "-b", "nonexist", "-F", "raw", "top4.qcow2"],
        ["-f", "qcow2", "-b", "nonexist", "-F", "raw", "top5.qcow2", "1M"],
        ["-f", "qcow2", "-u", "-b", "nonexist", "-F", "raw", "top6.qcow2",
         "1M"],
        ["-f", "qcow2", "-u", "-b", "nonexist", "-F", "raw", "top7.qcow2"],
    ):
        cq, cb = both(qemu_img, blkimg, ["create"] + args, cwd_q=q, cwd_b=b)
        assert_same(cq, cb, what=" ".join(args))
    assert sorted(os.listdir(q)) == sorted(os.listdir(b))
    for n in sorted(os.listdir(q)):
        iq = run([qemu_img, "info", "-U", n], cwd=q)
        ib = run([qemu_img, "info", "-U", n], cwd=b)
        drop = lambda s: "\n".join(l for l in s.splitlines()
                                   if not l.startswith("disk size"))
        assert drop(ib.stdout) == drop(iq.stdout), n


def test_create_refuses_object(blkimg, tmp_path):
    cp = run([blkimg, "create", "--object", "throttle-group,id=t0",
              tmp_path / "x.raw", "1M"])
    assert cp.returncode == 1
    assert cp.stderr == "blkimg: --object is not supported\n"
    assert not (tmp_path / "x.raw").exists()


def test_create_prog_name_from_argv0(blkimg, tmp_path):
    """Messages are prefixed with the name the program was invoked as."""
    link = tmp_path / "qemu-img"
    os.symlink(blkimg, link)
    cp = run([link, "create", tmp_path / "x.raw", "1Q"])
    assert cp.returncode == 1
    assert cp.stderr.startswith("qemu-img: Invalid image size specified.")
