# SPDX-License-Identifier: MIT
"""blkimg convert against qemu-img 7.2 on identical inputs: resulting bytes,
allocation (sparseness), progress output, error messages and exit codes;
converted images cross-checked with `qemu-img compare` (and `qemu-img
check` for qcow2 targets)."""
import json
import os
import signal
import subprocess
import time

import pytest

from test_convert_helpers import (MiB, data_map, make_raw, norm_err, read,
                                  run2, same_allocation, same_output)

pytestmark = pytest.mark.qemu


@pytest.fixture
def src(tmp_path):
    return make_raw(tmp_path / "src.raw")


def qcompare(qemu_img, a, b, fa=None, fb=None):
    args = [qemu_img, "compare"]
    if fa:
        args += ["-f", fa]
    if fb:
        args += ["-F", fb]
    cp = subprocess.run(args + [a, b], capture_output=True, text=True)
    return cp.returncode, cp.stdout


def qcheck(qemu_img, img):
    cp = subprocess.run([qemu_img, "check", img], capture_output=True,
                        text=True)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    assert "No errors were found on the image." in cp.stdout


OPTION_SETS = [
    [],
    ["-S", "0"],
    ["-S", "512"],
    ["-S", "64k"],
    ["-W"],
    ["-m", "1"],
    ["-m", "16", "-W"],
    ["-C"],
    ["-t", "none", "-T", "none"],
    ["-t", "writeback", "-T", "none", "-m", "4"],
]


@pytest.mark.parametrize("opts", OPTION_SETS, ids=lambda o: " ".join(o) or
                         "default")
def test_raw_to_raw_matches_qemu(qemu_img, blkimg, tmp_path, src, opts):
    q = tmp_path / "q.raw"
    b = tmp_path / "b.raw"
    rq = run2(qemu_img, ["convert"] + opts + ["-O", "raw", src, q])
    rb = run2(blkimg, ["convert"] + opts + ["-O", "raw", src, b])
    assert rb == rq
    assert rb[0] == 0
    assert read(b) == read(src)
    assert read(b) == read(q)
    # same sparseness as qemu-img: holes and zero detection alike
    assert same_allocation(b, q)
    assert qcompare(qemu_img, src, b, "raw", "raw") == \
        (0, "Images are identical.\n")


def test_progress_is_byte_exact(qemu_img, blkimg, tmp_path, src):
    rq = run2(qemu_img, ["convert", "-p", "-O", "raw", src, tmp_path / "q"])
    rb = run2(blkimg, ["convert", "-p", "-O", "raw", src, tmp_path / "b"])
    assert rb == rq
    lines = rb[1].split(b"\r")
    # several intermediate lines, not just 0 and 100
    assert len(lines) > 5
    assert lines[0] == b"    (0.00/100%)"
    assert rb[1].endswith(b"    (100.00/100%)\r\n")


def test_progress_empty_image(qemu_img, blkimg, tmp_path):
    e = tmp_path / "e.raw"
    with open(e, "wb") as f:
        f.truncate(10 * MiB)
    rq = run2(qemu_img, ["convert", "-p", "-O", "raw", e, tmp_path / "q"])
    rb = run2(blkimg, ["convert", "-p", "-O", "raw", e, tmp_path / "b"])
    assert rb == rq
    assert rb[1] == b"    (0.00/100%)\r    (100.00/100%)\r\n"


def test_quiet_suppresses_progress(blkimg, tmp_path, src):
    rc, out, err = run2(blkimg, ["convert", "-q", "-p", "-O", "raw", src,
                                 tmp_path / "b"])
    assert (rc, out, err) == (0, b"", "")


def test_progress_json(blkimg, tmp_path, src):
    rc, out, err = run2(blkimg, ["convert", "--progress=json", "-O", "raw",
                                 src, tmp_path / "b"])
    assert rc == 0, err
    objs = [json.loads(line) for line in out.decode().splitlines()]
    assert len(objs) >= 3
    assert objs[0]["percent"] == 0
    assert objs[-1]["status"] == "done"
    assert objs[-1]["percent"] == 100
    assert all(o["operation"] == "convert" for o in objs)
    assert objs[-1]["done"] == objs[-1]["total"] > 0
    pct = [o["percent"] for o in objs]
    assert pct == sorted(pct)


def test_progress_bar(blkimg, tmp_path, src):
    rc, out, err = run2(blkimg, ["convert", "--progress=bar", "-O", "raw",
                                 src, tmp_path / "b"])
    assert rc == 0, err
    assert b"100.00%" in out and out.endswith(b"\n")
    assert b"/s" in out


def test_existing_target_overwritten(qemu_img, blkimg, tmp_path, src):
    """-n: zero ranges of the source must become zeroes in a target that
    held data; written with zero writes that may punch holes."""
    garbage = os.urandom(64 * MiB)
    for name in ("q", "b"):
        with open(tmp_path / name, "wb") as f:
            f.write(garbage)
    rq = run2(qemu_img, ["convert", "-n", "-O", "raw", src, tmp_path / "q"])
    rb = run2(blkimg, ["convert", "-n", "-O", "raw", src, tmp_path / "b"])
    assert rb == rq == (0, b"", "")
    assert read(tmp_path / "b") == read(src)
    assert same_allocation(tmp_path / "b", tmp_path / "q")


def test_existing_target_larger(qemu_img, blkimg, tmp_path, src):
    for name in ("q", "b"):
        with open(tmp_path / name, "wb") as f:
            f.write(b"\xaa" * (80 * MiB))
    rq = run2(qemu_img, ["convert", "-n", "-O", "raw", src, tmp_path / "q"])
    rb = run2(blkimg, ["convert", "-n", "-O", "raw", src, tmp_path / "b"])
    assert rb == rq
    assert read(tmp_path / "b") == read(tmp_path / "q")


def test_target_is_zero(qemu_img, blkimg, tmp_path, src):
    for name in ("q", "b"):
        with open(tmp_path / name, "wb") as f:
            f.truncate(64 * MiB)
    args = ["convert", "-n", "--target-is-zero", "-O", "raw", src]
    assert run2(qemu_img, args + [tmp_path / "q"]) == \
        run2(blkimg, args + [tmp_path / "b"])
    assert read(tmp_path / "b") == read(src)
    assert same_allocation(tmp_path / "b", tmp_path / "q")


def test_concatenated_sources(qemu_img, blkimg, tmp_path):
    a = make_raw(tmp_path / "a.raw", size=5 * MiB + 512, seed=2,
                 extents=[(4096, 5000, "data"), (5 * MiB, 512, "data")])
    b = make_raw(tmp_path / "b.raw", size=3 * MiB, seed=3)
    c = make_raw(tmp_path / "c.raw", size=1 * MiB, seed=4,
                 extents=[(0, MiB, "data")])
    rq = run2(qemu_img, ["convert", "-p", "-O", "raw", a, b, c,
                         tmp_path / "q"])
    rb = run2(blkimg, ["convert", "-p", "-O", "raw", a, b, c,
                       tmp_path / "o"])
    assert rb == rq and rb[0] == 0
    assert read(tmp_path / "o") == read(a) + read(b) + read(c)
    assert same_allocation(tmp_path / "o", tmp_path / "q")


def test_unaligned_size(qemu_img, blkimg, tmp_path):
    s = tmp_path / "odd.raw"
    s.write_bytes(os.urandom(1001))
    run2(qemu_img, ["convert", "-O", "raw", s, tmp_path / "q"])
    assert run2(blkimg, ["convert", "-O", "raw", s, tmp_path / "b"])[0] == 0
    assert read(tmp_path / "b") == read(tmp_path / "q")
    assert read(tmp_path / "b")[:1001] == read(s)


def test_real_stack_command_lines(qemu_img, blkimg, tmp_path, src):
    for extra in ([], ["-o", "preallocation=falloc"]):
        args = ["convert"] + extra + ["-t", "none", "-p", "-O", "raw", src]
        rq = run2(qemu_img, args + [tmp_path / "q"])
        rb = run2(blkimg, args + [tmp_path / "b"])
        assert rb == rq and rb[0] == 0
        assert read(tmp_path / "b") == read(src)
        assert same_allocation(tmp_path / "b", tmp_path / "q")


ERROR_CASES = [
    ["convert", "-O", "raw"],
    ["convert", "-S", "100", "-O", "raw", "SRC", "x"],
    ["convert", "-S", "32M", "-O", "raw", "SRC", "x"],
    ["convert", "-m", "20", "-O", "raw", "SRC", "x"],
    ["convert", "-m", "0", "-O", "raw", "SRC", "x"],
    ["convert", "-t", "foo", "-O", "raw", "SRC", "x"],
    ["convert", "-T", "foo", "-O", "raw", "SRC", "x"],
    ["convert", "-c", "-O", "raw", "SRC", "x"],
    ["convert", "-n", "-O", "raw", "SRC", "missing"],
    ["convert", "--target-is-zero", "-O", "raw", "SRC", "x"],
    ["convert", "--target-image-opts", "SRC", "x"],
    ["convert", "-B", "SRC", "-O", "raw", "SRC", "x"],
    ["convert", "-o", "foo=bar", "-O", "raw", "SRC", "x"],
    ["convert", "-O", "raw", "-x", "SRC", "x"],
    ["convert", "-O", "raw", "-f"],
    ["convert", "-p", "-O", "raw", "missing", "x"],
    ["convert", "-O", "foo", "SRC", "x"],
    ["convert", "-C", "-c", "-O", "qcow2", "SRC", "x"],
    ["convert", "-C", "-S", "4k", "-O", "raw", "SRC", "x"],
    ["convert", "-O", "raw", "SRC", "/nonexistent-dir/x"],
    ["convert", "-O", "qcow2", "-B", "SRC", "SRC", "x"],
    ["convert", "-O", "qcow2", "-F", "raw", "SRC", "x"],
    ["convert", "-O", "qcow2", "-B", "SRC", "-F", "raw", "SRC", "SRC", "x"],
    ["convert", "-c", "-O", "qcow2", "-o", "preallocation=full", "SRC", "x"],
    ["convert", "-O", "qcow2", "-o", "cluster_size=1000", "SRC", "x"],
    ["convert", "-O", "qcow2", "-o", "bogus=1", "SRC", "x"],
    ["convert", "-r", "x", "-O", "raw", "SRC", "x"],
    ["convert", "-r", "-5", "-O", "raw", "SRC", "x"],
    ["convert", "-O", "raw", "SRC", "x", "-r"],
]


@pytest.mark.parametrize("args", ERROR_CASES, ids=" ".join)
def test_errors_match_qemu(qemu_img, blkimg, tmp_path, src, args):
    args = [src if a == "SRC" else a for a in args]

    def clean():
        for n in ("x", "tiny"):
            if os.path.exists(tmp_path / n):
                os.unlink(tmp_path / n)
    rq, rb = same_output(qemu_img, blkimg, args, tmp_path, clean)
    assert rb == rq
    assert rb[0] == 1


def test_target_smaller_than_source(qemu_img, blkimg, tmp_path, src):
    def prep():
        with open(tmp_path / "tiny", "wb") as f:
            f.truncate(MiB)
    rq, rb = same_output(qemu_img, blkimg,
                         ["convert", "-n", "-O", "raw", src, "tiny"],
                         tmp_path, prep)
    assert rb == rq
    assert "output file is smaller than input file" in rb[2]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupt_stops_cleanly(blkimg, tmp_path, sig):
    big = tmp_path / "big.raw"
    with open(big, "wb") as f:
        f.truncate(64 * 1024 * MiB)
    out = tmp_path / "out.raw"
    # -S 0 writes every byte of the 64 GiB: far longer than the test waits
    p = subprocess.Popen([blkimg, "convert", "-S", "0", "-O", "raw", big,
                          out], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    try:
        time.sleep(0.7)
        assert p.poll() is None, "convert ended before the signal"
        t0 = time.time()
        p.send_signal(sig)
        _, err = p.communicate(timeout=30)
        elapsed = time.time() - t0
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    name = "SIGINT" if sig == signal.SIGINT else "SIGTERM"
    err = err.decode()
    assert p.returncode == 1
    assert err.startswith("blkimg: Interrupted by %s: '%s' is incomplete "
                          "(copy stopped at byte " % (name, out)), err
    assert err.count("\n") == 1
    assert elapsed < 10
    os.unlink(out)


# ------------------------------------------------------------- qcow2


def qemu_qcow2(qemu_img, src, path, *opts):
    subprocess.run([qemu_img, "convert", "-O", "qcow2"] + list(opts) +
                   [src, path], check=True)
    return str(path)


@pytest.mark.parametrize("opts", [[], ["-o", "compat=1.1"],
                                  ["-o", "cluster_size=4k"],
                                  ["-o", "cluster_size=2M"],
                                  ["-o", "compat=0.10"],
                                  ["-o", "refcount_bits=1,lazy_refcounts=on"],
                                  ["-t", "none", "-T", "none"]],
                         ids=lambda o: " ".join(o) or "default")
def test_raw_to_qcow2(qemu_img, blkimg, tmp_path, src, opts):
    out = tmp_path / "b.qcow2"
    rc, o, e = run2(blkimg, ["convert", "-O", "qcow2"] + opts + [src, out])
    assert (rc, o, e) == (0, b"", "")
    qcheck(qemu_img, str(out))
    assert qcompare(qemu_img, src, str(out)) == \
        (0, "Images are identical.\n")
    # sparse where the source is: no more data than qemu-img allocates
    q = qemu_qcow2(qemu_img, src, tmp_path / "q.qcow2", *opts)
    info_b = json.loads(subprocess.run(
        [qemu_img, "map", "--output=json", out], capture_output=True,
        check=True).stdout)
    info_q = json.loads(subprocess.run(
        [qemu_img, "map", "--output=json", q], capture_output=True,
        check=True).stdout)
    data_b = sum(x["length"] for x in info_b if x["data"])
    data_q = sum(x["length"] for x in info_q if x["data"])
    assert data_b == data_q


def test_qcow2_to_raw(qemu_img, blkimg, tmp_path, src):
    q = qemu_qcow2(qemu_img, src, tmp_path / "s.qcow2")
    for opts in ([], ["-t", "none", "-T", "none"], ["-W", "-m", "16"]):
        out = tmp_path / "b.raw"
        rb = run2(blkimg, ["convert", "-f", "qcow2", "-O", "raw"] + opts +
                  [q, out])
        rq = run2(qemu_img, ["convert", "-f", "qcow2", "-O", "raw"] + opts +
                  [q, tmp_path / "q.raw"])
        assert rb == rq == (0, b"", "")
        assert read(out) == read(src)
        assert same_allocation(out, tmp_path / "q.raw")


def test_qcow2_to_raw_progress(qemu_img, blkimg, tmp_path, src):
    q = qemu_qcow2(qemu_img, src, tmp_path / "s.qcow2")
    rq = run2(qemu_img, ["convert", "-p", "-O", "raw", q, tmp_path / "q"])
    rb = run2(blkimg, ["convert", "-p", "-O", "raw", q, tmp_path / "b"])
    assert rb == rq


def test_qcow2_to_qcow2_real_stack(qemu_img, blkimg, tmp_path, src):
    q = qemu_qcow2(qemu_img, src, tmp_path / "s.qcow2")
    out = tmp_path / "b.qcow2"
    args = ["convert", "-p", "-t", "none", "-T", "none", "-f", "qcow2", q,
            "-O", "qcow2", "-o", "compat=1.1"]
    rb = run2(blkimg, args + [out])
    rq = run2(qemu_img, args + [tmp_path / "q.qcow2"])
    assert rb == rq and rb[0] == 0
    qcheck(qemu_img, str(out))
    assert qcompare(qemu_img, q, str(out)) == (0, "Images are identical.\n")


def test_qcow2_zero_clusters_and_holes(qemu_img, blkimg, tmp_path):
    q = tmp_path / "z.qcow2"
    subprocess.run([qemu_img, "create", "-f", "qcow2", q, "16M"], check=True,
                   capture_output=True)
    subprocess.run(["qemu-io", "-c", "write -P 0x11 0 1M",
                    "-c", "write -z 512k 256k", "-c", "write -P 0x22 5M 3M",
                    "-c", "write -z 6M 64k", "-c", "write -P 0 12M 1M", q],
                   check=True, capture_output=True)
    for fmt in ("raw", "qcow2"):
        out = tmp_path / ("o." + fmt)
        assert run2(blkimg, ["convert", "-O", fmt, q, out])[0] == 0
        assert qcompare(qemu_img, str(q), str(out)) == \
            (0, "Images are identical.\n")
    # the explicit zero write at 12M is detected as zeroes (sparse)
    m = json.loads(subprocess.run([qemu_img, "map", "--output=json",
                                   tmp_path / "o.qcow2"], capture_output=True,
                                  check=True).stdout)
    assert not any(x["data"] and x["start"] <= 12 * MiB <
                   x["start"] + x["length"] for x in m)


@pytest.mark.parametrize("ctype", ["zlib", "zstd"])
def test_compressed(qemu_img, blkimg, tmp_path, src, ctype):
    out = tmp_path / "c.qcow2"
    rc, o, e = run2(blkimg, ["convert", "-c", "-O", "qcow2", "-o",
                             "compression_type=" + ctype, src, out])
    assert (rc, o, e) == (0, b"", "")
    qcheck(qemu_img, str(out))
    assert qcompare(qemu_img, src, str(out)) == \
        (0, "Images are identical.\n")
    info = json.loads(subprocess.run([qemu_img, "info", "--output=json", out],
                                     capture_output=True,
                                     check=True).stdout)
    assert info["format-specific"]["data"]["compression-type"] == ctype
    # compressible data: the compressed file is smaller than the data
    txt = tmp_path / "t.raw"
    txt.write_bytes((b"hello compressible world " * 200000)[:4 * MiB])
    out2 = tmp_path / "t.qcow2"
    assert run2(blkimg, ["convert", "-c", "-O", "qcow2", "-o",
                         "compression_type=" + ctype, txt, out2])[0] == 0
    assert os.path.getsize(out2) < MiB
    assert qcompare(qemu_img, str(txt), str(out2))[0] == 0
    qcheck(qemu_img, str(out2))


@pytest.mark.parametrize("opts", [[], ["-o", "compression_type=zstd"],
                                  ["-o", "cluster_size=4k"],
                                  ["-t", "none", "-o", "cluster_size=512"]],
                         ids=lambda o: " ".join(o) or "default")
def test_compressed_file_identical_to_qemu(qemu_img, blkimg, tmp_path, opts):
    """convert -c lays the file out as qemu-img does, byte for byte:
    clusters compress in parallel but take host space in guest order, an
    uncompressible cluster is stored as data, and the file ends on a sector
    boundary."""
    src = tmp_path / "mix.raw"
    with open(src, "wb") as f:
        f.truncate(24 * MiB)
        f.write((b"compressible text " * 100000)[:3 * MiB])
        f.seek(5 * MiB)
        f.write(os.urandom(1 * MiB))  # does not compress
        f.seek(9 * MiB + 3000)
        f.write(b"\x07" * 70000)
        f.seek(24 * MiB - 777)
        f.write(b"end" * 259)
    outs = []
    for tool, name in ((qemu_img, "q.qcow2"), (blkimg, "b.qcow2")):
        out = tmp_path / name
        cp = subprocess.run([tool, "convert", "-c", "-O", "qcow2"] + opts +
                            [src, out], capture_output=True, text=True)
        assert cp.returncode == 0, cp.stderr
        outs.append(out.read_bytes())
    assert outs[1] == outs[0]
    assert len(outs[1]) % 512 == 0


@pytest.mark.parametrize("opts", [[], ["-S", "0"], ["-o", "cluster_size=4k"],
                                  ["-t", "none", "-o", "compression_type=zstd"]],
                         ids=lambda o: " ".join(o) or "default")
def test_compressed_interleaved_identical_to_qemu(qemu_img, blkimg, tmp_path,
                                                  opts):
    """-c moves several clusters a chunk (compressed at once): clusters that
    compress, that do not, and that hold zeroes, interleaved inside every
    chunk and ending in a partial cluster, give qemu-img's file byte for
    byte, and its progress lines."""
    src = tmp_path / "inter.raw"
    with open(src, "wb") as f:
        for i in range(6 * 16):  # 6 MiB in 64 KiB pieces
            kind = (i * 7 + i // 5) % 4
            if kind == 0:
                f.write((b"text %d " % i * 9000)[:65536])
            elif kind == 1:
                f.write(os.urandom(65536))  # does not compress
            elif kind == 2:
                f.write(bytes(65536))
            else:
                f.write(os.urandom(8192) + bytes([i % 251]) * 57344)
        f.write(b"tail" * 384)  # ends 1536 bytes into a cluster
    outs = []
    # the last run on one CPU: slices are cut into fewer jobs, same file
    for pre, tool, name in (([], qemu_img, "q.qcow2"), ([], blkimg, "b.qcow2"),
                            (["taskset", "-c", "0"], blkimg, "b1.qcow2")):
        out = tmp_path / name
        cp = subprocess.run(pre + [tool, "convert", "-p", "-c", "-O", "qcow2"] +
                            opts + [src, out], capture_output=True)
        assert cp.returncode == 0, cp.stderr
        outs.append((cp.stdout, out.read_bytes()))
    assert outs[1][0] == outs[0][0]
    assert outs[1][1] == outs[0][1]
    assert outs[2] == outs[1]


def test_backing_target_writes_only_top(qemu_img, blkimg, tmp_path):
    """-B/-F: what is unallocated above the source's backing file stays
    unallocated in the target."""
    base = make_raw(tmp_path / "base.raw", size=16 * MiB, seed=7)
    top = tmp_path / "top.qcow2"
    subprocess.run([qemu_img, "create", "-f", "qcow2", "-b", base, "-F",
                    "raw", top], check=True, capture_output=True)
    subprocess.run(["qemu-io", "-c", "write -P 0x33 1M 128k",
                    "-c", "write -z 0 64k", top], check=True,
                   capture_output=True)
    out = tmp_path / "o.qcow2"
    rc, o, e = run2(blkimg, ["convert", "-O", "qcow2", "-B", base, "-F",
                             "raw", top, out])
    assert (rc, o, e) == (0, b"", "")
    qcheck(qemu_img, str(out))
    assert qcompare(qemu_img, str(top), str(out)) == \
        (0, "Images are identical.\n")
    m = json.loads(subprocess.run([qemu_img, "map", "--output=json", out],
                                  capture_output=True, check=True).stdout)
    top_data = sum(x["length"] for x in m if x["depth"] == 0 and x["data"])
    assert top_data == 128 * 1024


IMAGE_OPTS_CASES = [
    ["convert", "--image-opts", "-O", "raw", "driver=raw,file.filename=SRC",
     "x"],
    ["convert", "--image-opts", "-O", "raw", "driver=qcow2,file.filename=QS",
     "x"],
    ["convert", "--image-opts", "-O", "raw", "file.filename=SRC", "x"],
    ["convert", "--image-opts", "-O", "raw",
     "driver=raw,file.driver=file,file.filename=SRC", "x"],
    ["convert", "--image-opts", "-f", "raw", "-O", "raw",
     "driver=raw,file.filename=SRC", "x"],
    ["convert", "--image-opts", "-O", "raw", "driver=raw", "x"],
    ["convert", "-n", "--target-image-opts", "SRC",
     "driver=raw,file.filename=y"],
    ["convert", "-n", "--target-image-opts", "-O", "raw", "SRC",
     "driver=raw,file.filename=y"],
    ["convert", "-p", "-O", "raw", "SRC", "QS", "SRC", "x"],
    ["convert", "-p", "-S", "0", "-O", "qcow2", "QS", "x"],
    ["convert", "-c", "-p", "-O", "qcow2", "-o", "cluster_size=4k", "SRC",
     "x"],
    ["convert", "-p", "-O", "qcow2", "-B", "SRC", "-F", "raw", "QS", "x"],
]


@pytest.mark.parametrize("args", IMAGE_OPTS_CASES, ids=" ".join)
def test_image_opts_and_more_match_qemu(qemu_img, blkimg, tmp_path, src,
                                        args):
    qs = qemu_qcow2(qemu_img, src, tmp_path / "s.qcow2")
    os.sync()
    args = [a.replace("SRC", src).replace("QS", qs) for a in args]
    outs = []

    def prep():
        for n in ("x", "y"):
            if os.path.exists(tmp_path / n):
                os.unlink(tmp_path / n)
        with open(tmp_path / "y", "wb") as f:
            f.truncate(os.path.getsize(src) * 3)
    for tool in (qemu_img, blkimg):
        prep()
        outs.append(run2(tool, args, cwd=tmp_path))
        for n in ("x", "y"):
            p = tmp_path / n
            if os.path.exists(p):
                os.rename(p, tmp_path / (n + "." + os.path.basename(tool)))
    assert outs[1] == outs[0]
    for n in ("x", "y"):
        a = tmp_path / (n + ".qemu-img")
        b = tmp_path / (n + "." + os.path.basename(blkimg))
        if os.path.exists(a) and outs[0][0] == 0:
            cp = subprocess.run([qemu_img, "compare", a, b],
                                capture_output=True, text=True)
            assert cp.stdout == "Images are identical.\n"


def test_target_is_a_source_refused(qemu_img, blkimg, tmp_path, src):
    """Recreating or rewriting an image that is being read loses it:
    refused as qemu-img's locks refuse it, and the image is intact."""
    before = read(src)
    qs = qemu_qcow2(qemu_img, src, tmp_path / "s.qcow2")
    ov = tmp_path / "ov.qcow2"
    subprocess.run([qemu_img, "create", "-q", "-f", "qcow2", "-b", src, "-F",
                    "raw", ov], check=True)
    for args in (["convert", "-O", "raw", src, src],
                 ["convert", "-n", "-O", "raw", src, src],
                 ["convert", "-O", "qcow2", qs, qs],
                 ["convert", "-O", "raw", ov, src]):
        rb = run2(blkimg, args)
        rq = run2(qemu_img, args)
        assert rb == rq
        assert rb[0] == 1 and 'Failed to get "write" lock' in rb[2]
        assert read(src) == before
    assert qcompare(qemu_img, src, qs) == (0, "Images are identical.\n")


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("sparse", ["512", "4k", "8k", "64k"])
def test_zero_detection_matches_qemu(qemu_img, blkimg, tmp_path, seed,
                                     sparse):
    """Random mixes of zero and non-zero sectors inside allocated data, at
    unaligned offsets: the same bytes written and skipped as qemu-img."""
    import random
    r = random.Random(seed)
    src = tmp_path / "z.raw"
    size = 8 * MiB
    with open(src, "wb") as f:
        f.write(b"\0" * size)  # all allocated
        off = 0
        while off < size:
            n = r.choice([1, 2, 3, 7, 8, 9, 16, 17, 120, 300]) * 512
            if r.random() < 0.5:
                f.seek(off)
                f.write(r.randbytes(min(n, size - off)))
            off += n
    for tool, out in ((qemu_img, "q"), (blkimg, "b")):
        assert run2(tool, ["convert", "-S", sparse, "-O", "raw", src,
                           tmp_path / out])[0] == 0
    assert read(tmp_path / "b") == read(src)
    assert data_map(tmp_path / "b") == data_map(tmp_path / "q")
    # and the same through qcow2 targets: same clusters allocated
    for tool, out in ((qemu_img, "q.qcow2"), (blkimg, "b.qcow2")):
        assert run2(tool, ["convert", "-S", sparse, "-O", "qcow2", src,
                           tmp_path / out])[0] == 0
    maps = []
    for out in ("q.qcow2", "b.qcow2"):
        m = json.loads(subprocess.run([qemu_img, "map", "--output=json",
                                       tmp_path / out], capture_output=True,
                                      check=True).stdout)
        merged = []  # host layout may differ: merge by kind only
        for x in m:
            if merged and tuple(merged[-1][2:]) == (x["data"], x["zero"]):
                merged[-1][1] += x["length"]
            else:
                merged.append([x["start"], x["length"], x["data"],
                               x["zero"]])
        maps.append(merged)
    assert maps[0] == maps[1]


def test_backing_chain_flattened(qemu_img, blkimg, tmp_path, src):
    """Without -B the whole chain is copied: backing data, the overlay's
    data and its zero clusters (which hide backing data)."""
    base = qemu_qcow2(qemu_img, src, tmp_path / "b.qcow2")
    top = tmp_path / "t.qcow2"
    subprocess.run([qemu_img, "create", "-q", "-f", "qcow2", "-b", base,
                    "-F", "qcow2", top], check=True)
    subprocess.run(["qemu-io", "-c", "write -P 9 1M 1M", "-c",
                    "write -z 0 64k", top], check=True, capture_output=True)
    os.sync()
    for fmt in ("raw", "qcow2"):
        rq = run2(qemu_img, ["convert", "-p", "-O", fmt, top,
                             tmp_path / ("q." + fmt)])
        rb = run2(blkimg, ["convert", "-p", "-O", fmt, top,
                           tmp_path / ("o." + fmt)])
        assert rb == rq and rb[0] == 0
        assert qcompare(qemu_img, str(top), str(tmp_path / ("o." + fmt))) \
            == (0, "Images are identical.\n")
    assert read(tmp_path / "o.raw") == read(tmp_path / "q.raw")
    assert same_allocation(tmp_path / "o.raw", tmp_path / "q.raw")
    assert read(tmp_path / "o.raw")[:65536] == bytes(65536)


def test_rate_limit(blkimg, tmp_path):
    """-r BYTES_PER_SECOND: 8 MiB of data at 4 MiB/s takes about 2 s."""
    src = make_raw(tmp_path / "r.raw", size=16 * MiB, seed=9,
                   extents=[(0, 8 * MiB, "data")])
    t0 = time.time()
    assert run2(blkimg, ["convert", "-r", "4M", "-O", "raw", src,
                         tmp_path / "o"]) == (0, b"", "")
    slow = time.time() - t0
    assert read(tmp_path / "o") == read(src)
    assert 1.4 < slow < 10
    t0 = time.time()
    assert run2(blkimg, ["convert", "-r", "0", "-O", "raw", src,
                         tmp_path / "o2"])[0] == 0
    assert time.time() - t0 < slow
