# SPDX-License-Identifier: MIT
"""vpc (VHD) images: blkimg reads, writes and creates them as QEMU 7.2.

Images made by qemu-img and written by qemu-io read identically through
blkimg (info text and JSON, map, convert to raw), dynamic and fixed, with
sizes that exercise the CHS rounding and the creator-dependent size rules;
blkimg-io's writes give the same file bytes as qemu-io's, with and without
O_DIRECT, and qemu-io reads them back; `blkimg create` and `convert -O vpc`
give qemu-img's files but for the timestamp, the UUID and the checksum.
Damaged footers, headers and BATs (a qemu-img image patched here) are
refused with qemu-img's one line.
"""
import json
import os
import shutil
import struct

import pytest

pytestmark = pytest.mark.qemu

MiB = 1 << 20
BLOCK = 2 * MiB  # qemu-img's block size for dynamic VHDs

# ------------------------------------------------------------ helpers


def footer_checksum(b):
    b = bytearray(b)
    b[64:68] = bytes(4)
    return ~sum(b) & 0xffffffff


def patch(path, off, fmt, value, footer_at=None):
    """Packs value (a tuple for several fields) at off (negative: from the
    end); footer_at: fix that footer's checksum after."""
    if off < 0:
        off += os.path.getsize(path)
    with open(path, "r+b") as f:
        f.seek(off)
        f.write(struct.pack(fmt, *(value if isinstance(value, tuple)
                                   else (value,))))
        if footer_at is not None:
            if footer_at < 0:
                footer_at += os.path.getsize(path)
            f.seek(footer_at)
            b = f.read(512)
            f.seek(footer_at + 64)
            f.write(struct.pack(">I", footer_checksum(b)))


def masked(path):
    """The file's bytes with every footer's timestamp, checksum and UUID
    zeroed (what differs between two images created alike)."""
    with open(path, "rb") as f:
        b = bytearray(f.read())
    for off in {0, len(b) - 512}:
        if off >= 0 and b[off:off + 8] == b"conectix":
            b[off + 24:off + 28] = bytes(4)
            b[off + 64:off + 84] = bytes(20)
    return bytes(b)


def footer_fields(path, at_end):
    with open(path, "rb") as f:
        f.seek(-512 if at_end else 0, os.SEEK_END if at_end else os.SEEK_SET)
        b = f.read(512)
    names = ("cookie features version data_offset timestamp app cver os "
             "orig cur cyls heads spt type checksum").split()
    v = dict(zip(names, struct.unpack(">8sIIQI4sI4sQQHBBII", b[:68])))
    for k in ("timestamp", "checksum"):
        del v[k]
    return v


def mk(run, qemu_img, path, size, *opts):
    args = [qemu_img, "create", "-q", "-f", "vpc"]
    if opts:
        args += ["-o", ",".join(opts)]
    run(args + [str(path), str(size)], check=True)
    return str(path)


def fmt_args(fixed):
    return ["-f", "vpc"] if fixed else []


def same_output(run, a, b, *args):
    """Runs args under both tools: same exit code, stdout and stderr (but
    for the program name)."""
    ca, cb = run(a, *args), run(b, *args)
    assert ca.returncode == cb.returncode, (args, ca.stderr, cb.stderr)
    assert ca.stdout == cb.stdout, args
    assert ca.stderr.replace("blkimg:", "qemu-img:") == cb.stderr, args
    return ca


def check_reads_as_qemu(run, blkimg, qemu_img, path, tmp_path, fixed):
    f = fmt_args(fixed)
    for out in ([], ["--output=json"]):
        same_output(run, blkimg, qemu_img, "info", *f, *out, path)
        same_output(run, blkimg, qemu_img, "map", *f, *out, path)
    a, b = tmp_path / "b.raw", tmp_path / "q.raw"
    run(blkimg, "convert", *f, "-O", "raw", path, a, check=True)
    run(qemu_img, "convert", *f, "-O", "raw", path, b, check=True)
    assert a.read_bytes() == b.read_bytes()
    run(blkimg, "convert", "-t", "none", "-T", "none", *f, "-O", "raw",
        path, a, check=True)
    assert a.read_bytes() == b.read_bytes()
    a.unlink()
    b.unlink()


# partial blocks, a write across blocks, rewrites of allocated blocks,
# zeroes, a vectored write across blocks; READS check the end state
WRITES = ["write -P 0x11 0 4k", "write -P 0x22 3M 1M",
          "write -P 0x33 1536k 3M", "write -P 0x44 10M 64k",
          "write -z 12M 8k", "write -P 0x55 2044k 8k",
          "writev -P 0x66 %d 512 1M 3M" % (16 * MiB - 512)]
READS = ["read -P 0x11 0 4k", "read -P 0 4k 1532k",
         "read -P 0x33 1536k 508k", "read -P 0x55 2044k 8k",
         "read -P 0x33 2052k 2556k", "read -P 0x44 10M 64k",
         "read -P 0 12M 8k", "readv -P 0x66 %d 512 1M 3M" % (16 * MiB - 512)]


def io_cmds(cmds):
    out = []
    for c in cmds:
        out += ["-c", c]
    return out

# ---------------------------------------------------------------- reads


@pytest.mark.parametrize("size", ["24M", "20000000", "20971521"])
@pytest.mark.parametrize("fixed", [False, True], ids=["dynamic", "fixed"])
def test_read_matches_qemu(run, blkimg, qemu_img, qemu_io, tmp_path, size,
                           fixed):
    sub = "subformat=fixed" if fixed else "subformat=dynamic"
    path = mk(run, qemu_img, tmp_path / "t.vhd", size, sub)
    check_reads_as_qemu(run, blkimg, qemu_img, path, tmp_path, fixed)
    run(qemu_io, *fmt_args(fixed), *io_cmds(WRITES[:-1]), path, check=True)
    check_reads_as_qemu(run, blkimg, qemu_img, path, tmp_path, fixed)


def test_force_size_image_reads_as_qemu(run, blkimg, qemu_img, qemu_io,
                                        tmp_path):
    """force_size: creator "qem2" and the maximum CHS geometry, the size
    is current_size (not a CHS multiple)."""
    path = mk(run, qemu_img, tmp_path / "t.vhd", 10000000, "force_size=on")
    run(qemu_io, "-c", "write -P 0x5a 9000000 1000000", path, check=True)
    check_reads_as_qemu(run, blkimg, qemu_img, path, tmp_path, False)


@pytest.mark.parametrize("app,cur", [
    (b"win ", 5 * MiB), (b"d2v ", 5 * MiB + 100), (b"CTXS", 3 * MiB),
    (b"tap\0", 4 * MiB), (b"vpc ", 5 * MiB), (b"qemu", 7 * MiB)])
def test_creator_size_rules(run, blkimg, qemu_img, tmp_path, app, cur):
    """The size from CHS geometry or current_size by creator application,
    and the force_size_calc runtime option either way."""
    path = mk(run, qemu_img, tmp_path / "t.vhd", "10M")
    patch(path, 28, ">4s", app)
    patch(path, 48, ">Q", cur, footer_at=0)
    same_output(run, blkimg, qemu_img, "info", "--output=json", path)
    for mode in ("chs", "current_size", "bogus"):
        # (QEMU names the image json:{...} then, blkimg by its file)
        opts = "driver=vpc,force_size_calc=%s,file.filename=%s" % (mode, path)
        q = run(qemu_img, "info", "--output=json", "--image-opts", opts)
        b = run(blkimg, "info", "--output=json", "--image-opts", opts)
        assert b.returncode == q.returncode
        if q.returncode:
            assert b.stderr.replace("blkimg:", "qemu-img:") == q.stderr
        else:
            assert (json.loads(b.stdout)["virtual-size"] ==
                    json.loads(q.stdout)["virtual-size"])


def test_max_geometry_uses_current_size(run, blkimg, qemu_img, tmp_path):
    path = mk(run, qemu_img, tmp_path / "t.vhd", "10M")
    patch(path, 56, ">HBB", (65535, 16, 255))
    patch(path, 48, ">Q", 6 * MiB, footer_at=0)
    same_output(run, blkimg, qemu_img, "info", "--output=json", path)


def test_sector_bitmap_not_consulted(run, blkimg, blkimg_io, qemu_img,
                                     qemu_io, tmp_path):
    """QEMU 7.2 reads an allocated block whole, whatever its sector bitmap
    says (here: no sector present): so does blkimg."""
    path = mk(run, qemu_img, tmp_path / "t.vhd", "8M")
    run(qemu_io, "-c", "write -P 0x3c 0 1M", path, check=True)
    with open(path, "r+b") as f:
        f.seek(D_BAT)
        bitmap = struct.unpack(">I", f.read(4))[0] * 512
        f.seek(bitmap)
        f.write(bytes(512))
    check_reads_as_qemu(run, blkimg, qemu_img, path, tmp_path, False)
    # a write sets the block's bitmap to all ones, as QEMU's does
    copy = str(tmp_path / "c.vhd")
    shutil.copy(path, copy)
    run(qemu_io, "-c", "write -P 0x3d 4k 4k", path, check=True)
    run(blkimg_io, "-c", "write -P 0x3d 4k 4k", copy, check=True)
    assert open(path, "rb").read() == open(copy, "rb").read()


def test_fixed_vhd_probes_as_raw(run, blkimg, qemu_img, tmp_path):
    path = mk(run, qemu_img, tmp_path / "t.vhd", "4M", "subformat=fixed")
    same_output(run, blkimg, qemu_img, "info", "--output=json", path)
    cp = run(blkimg, "info", "--output=json", path, check=True)
    assert json.loads(cp.stdout)["format"] == "raw"

# -------------------------------------------------------------- hostile

D_HDR = 512  # dynamic header offset in qemu-img's images
D_BAT = 1536


def hostile_cases():
    """(name, [(offset, struct format, value, footer to fix or None)],
    fixed image?)"""
    end = -512
    return [
        ("footer-checksum", [(64, ">I", 1, None)], False),
        ("fixed-footer-checksum", [(end + 64, ">I", 1, None)], True),
        ("fixed-type-dynamic", [(end + 60, ">I", 3, end)], True),
        ("fixed-type-differencing", [(end + 60, ">I", 4, end)], True),
        ("no-cookie", [(end, ">8s", b"conectiX", None),
                       (0, ">8s", b"\0" * 8, None)], True),
        ("data-offset-far", [(16, ">Q", 1 << 40, 0)], False),
        ("data-offset-huge", [(16, ">Q", (1 << 64) - 1, 0)], False),
        ("header-magic", [(D_HDR, ">8s", b"cxsparsX", None)], False),
        ("block-size-not-pow2", [(D_HDR + 32, ">I", 3000, None)], False),
        ("block-size-small", [(D_HDR + 32, ">I", 256, None)], False),
        ("block-size-zero", [(D_HDR + 32, ">I", 0, None)], False),
        ("bat-too-small", [(D_HDR + 28, ">I", 2, None)], False),
        ("bat-entries-huge", [(D_HDR + 28, ">I", 0x7fffffff, None)], False),
        ("bat-entries-negative", [(D_HDR + 28, ">I", 0x80000000, None)],
         False),
        ("bat-entries-big", [(D_HDR + 28, ">I", 0x1fffffff, None)], False),
        ("bat-outside-file", [(D_HDR + 16, ">Q", 1 << 40, None)], False),
        ("bat-offset-huge", [(D_HDR + 16, ">Q", (1 << 63) - 100, None)],
         False),
        ("bat-entry-past-end", [(D_BAT, ">I", 100000, None)], False),
        ("bat-entry-zero", [(D_BAT, ">I", 0, None)], False),
        ("bat-entry-max", [(D_BAT + 4, ">I", 0xfffffffe, None)], False),
        ("size-too-large", [(28, ">4s", b"win ", None),
                            (48, ">Q", 1 << 50, 0)], False),
        ("geometry-beyond-bat", [(56, ">HBB", (65535, 16, 254), 0)], False),
    ]


@pytest.mark.parametrize("name,patches,fixed", hostile_cases(),
                         ids=[c[0] for c in hostile_cases()])
def test_hostile_refused(run, blkimg, blkimg_io, qemu_img, tmp_path, name,
                         patches, fixed):
    sub = "subformat=fixed" if fixed else "subformat=dynamic"
    path = mk(run, qemu_img, tmp_path / "t.vhd", "10M", sub)
    for off, fmt, val, fix in patches:
        patch(path, off, fmt, val, footer_at=fix)
    before = open(path, "rb").read()
    q = run(qemu_img, "info", "-f", "vpc", path)
    b = run(blkimg, "info", "-f", "vpc", path)
    assert q.returncode == 1 and len(q.stderr.splitlines()) == 1, q.stderr
    assert (b.returncode, b.stdout) == (1, "")
    assert b.stderr.replace("blkimg:", "qemu-img:") == q.stderr
    cp = run(blkimg_io, "-f", "vpc", "-c", "write -P 0xee 0 64k", path)
    assert cp.returncode == 1 and len(cp.stderr.splitlines()) == 1
    assert open(path, "rb").read() == before

def test_block_over_metadata_not_written(run, blkimg, blkimg_io, qemu_img,
                                         qemu_io, tmp_path):
    """A BAT entry pointing into the header and BAT (inside the file, so
    QEMU opens it): reads match QEMU's; a write there fails and changes
    nothing (QEMU would write the guest's data over its metadata)."""
    path = mk(run, qemu_img, tmp_path / "t.vhd", "10M")
    run(qemu_io, "-c", "write -P 0x21 0 4k", path, check=True)
    patch(path, D_BAT + 4, ">I", 1)
    check_reads_as_qemu(run, blkimg, qemu_img, path, tmp_path, False)
    before = open(path, "rb").read()
    cp = run(blkimg_io, "-c", "write -P 0x22 %d 4k" % BLOCK, path)
    assert cp.returncode == 1
    assert open(path, "rb").read() == before

# --------------------------------------------------------------- writes


@pytest.mark.parametrize("cache", ["writeback", "none"])
@pytest.mark.parametrize("fixed", [False, True], ids=["dynamic", "fixed"])
def test_writes_match_qemu(run, blkimg, blkimg_io, qemu_img, qemu_io,
                           tmp_path, fixed, cache):
    """The same writes through qemu-io and blkimg-io give the same file
    bytes (blocks appended in the same order, footer moved, BAT entries),
    and qemu-io reads blkimg-io's back."""
    sub = "subformat=fixed" if fixed else "subformat=dynamic"
    q = mk(run, qemu_img, tmp_path / "q.vhd", "40M", sub)
    b = str(tmp_path / "b.vhd")
    shutil.copy(q, b)
    f = fmt_args(fixed)
    run(qemu_io, *f, "-t", cache, *io_cmds(WRITES), q, check=True)
    cp = run(blkimg_io, *f, "-t", cache, *io_cmds(WRITES), b, check=True)
    assert open(q, "rb").read() == open(b, "rb").read()
    cp = run(qemu_io, *f, "-r", *io_cmds(READS), b, check=True)
    assert "Pattern verification failed" not in cp.stdout
    cp = run(qemu_img, "compare", *f, *(["-F", "vpc"] if fixed else []), q,
             b, check=True)
    assert cp.stdout == "Images are identical.\n"
    check_reads_as_qemu(run, blkimg, qemu_img, b, tmp_path, fixed)


def test_overwrite_in_place(run, blkimg_io, qemu_img, qemu_io, tmp_path):
    """Rewriting allocated blocks moves nothing: same file length."""
    path = mk(run, qemu_img, tmp_path / "t.vhd", "20M")
    run(qemu_io, "-c", "write -P 0x11 0 4M", path, check=True)
    size = os.path.getsize(path)
    run(blkimg_io, "-c", "write -P 0x22 1M 2M", path, check=True)
    assert os.path.getsize(path) == size
    cp = run(qemu_io, "-r", "-c", "read -P 0x11 0 1M", "-c",
             "read -P 0x22 1M 2M", "-c", "read -P 0x11 3M 1M", path,
             check=True)
    assert "failed" not in cp.stdout


def test_new_block_over_stale_bytes_reads_zeroes(run, blkimg_io, qemu_img,
                                                 qemu_io, tmp_path):
    """A file longer than its last block (bytes after the footer): a new
    block there reads zeroes where it was not written (qemu-io 7.2 shows
    the stale bytes), and QEMU reads the data back."""
    path = mk(run, qemu_img, tmp_path / "t.vhd", "20M")
    with open(path, "ab") as f:
        f.write(b"\xaa" * (3 * MiB))
    run(blkimg_io, "-c", "write -P 0x11 1M 4k", path, check=True)
    cp = run(qemu_io, "-r", "-c", "read -P 0 0 1M", "-c",
             "read -P 0x11 1M 4k", "-c", "read -P 0 %d %d" %
             (MiB + 4096, MiB - 4096), path, check=True)
    assert "failed" not in cp.stdout


def test_fixed_footer_never_overwritten(run, blkimg_io, qemu_img, tmp_path):
    """A fixed VHD whose geometry claims more than the file holds: a write
    that would overwrite the footer fails (qemu-io 7.2 writes it and the
    image no longer opens)."""
    path = mk(run, qemu_img, tmp_path / "t.vhd", "4M", "subformat=fixed")
    patch(path, -512 + 56, ">H", 300, footer_at=-512)
    before = open(path, "rb").read()
    end = len(before) - 512
    cp = run(blkimg_io, "-f", "vpc", "-c", "write -P 0x11 %d 8k" %
             (end - 4096), path)
    assert cp.returncode == 1
    assert open(path, "rb").read() == before
    run(blkimg_io, "-f", "vpc", "-c", "write -P 0x11 %d 4k" % (end - 4096),
        path, check=True)
    run(qemu_img, "info", "-f", "vpc", path, check=True)


def test_failed_write_leaves_no_bat_entry(run, blkimg_io, qemu_img, qemu_io,
                                          small_tmpfs):
    """Data first, BAT entry after: a block whose data write fails (the
    file system is full) is not referenced; the image still opens in QEMU
    and every block reads either its data or zeroes."""
    mnt = small_tmpfs("5M")
    path = mk(run, qemu_img, mnt / "t.vhd", "64M")
    cp = run(blkimg_io, "-c", "write -P 0x77 0 16M", path)
    assert cp.returncode != 0
    cp = run(qemu_img, "map", "--output=json", path, check=True)
    data = [e for e in json.loads(cp.stdout) if e["data"]]
    assert data and data[-1]["start"] + data[-1]["length"] < 16 * MiB
    for e in data:
        cp = run(qemu_io, "-r", "-c", "read -P 0x77 %d %d" %
                 (e["start"], e["length"]), path, check=True)
        assert "failed" not in cp.stdout


def test_unsupported_operations(run, blkimg, qemu_img, tmp_path):
    path = mk(run, qemu_img, tmp_path / "t.vhd", "4M")
    same_output(run, blkimg, qemu_img, "check", path)
    same_output(run, blkimg, qemu_img, "resize", path, "8M")
    same_output(run, blkimg, qemu_img, "measure", "-O", "vpc", "--size", "1G")

# ------------------------------------------------------------- creation


@pytest.mark.parametrize("opts,size", [
    ([], "100M"), ([], "10000000"), ([], "0"), ([], "1"),
    (["subformat=fixed"], "10M"), (["subformat=dynamic"], "200G"),
    (["force_size=on"], "10000000"),
    (["subformat=fixed", "force_size=on"], "33M"),
    (["subformat=fixed", "preallocation=full"], "3M"),
    (["force_size=yes"], "1G"),
])
def test_create_matches_qemu(run, blkimg, qemu_img, tmp_path, opts, size):
    q, b = str(tmp_path / "q.vhd"), str(tmp_path / "b.vhd")
    o = ["-o", ",".join(opts)] if opts else []
    cq = run(qemu_img, "create", "-f", "vpc", *o, q, size, check=True)
    cb = run(blkimg, "create", "-f", "vpc", *o, b, size, check=True)
    assert cb.stdout == cq.stdout.replace(q, b)
    fixed = "subformat=fixed" in opts
    assert footer_fields(b, fixed) == footer_fields(q, fixed)
    assert masked(b) == masked(q)
    with open(b, "rb") as f:
        f.seek(-512 if fixed else 0, os.SEEK_END if fixed else os.SEEK_SET)
        foot = f.read(512)
    assert struct.unpack(">I", foot[64:68])[0] == footer_checksum(foot)
    if not fixed:
        with open(b, "rb") as f:
            f.seek(512)
            h = bytearray(f.read(1024))
        s = struct.unpack(">I", h[36:40])[0]
        h[36:40] = bytes(4)
        assert s == ~sum(h) & 0xffffffff
    same_output(run, blkimg, qemu_img, "info", *fmt_args(fixed),
                "--output=json", b)


@pytest.mark.parametrize("opts,size", [
    ("subformat=foo", "1M"), ("force_size=maybe", "1M"), ("foo=1", "1M"),
    ("backing_file=x", "1M"), ("force_size=on", "2041G"),
    ("subformat=fixed", "3000G")])
def test_create_errors_match_qemu(run, blkimg, qemu_img, tmp_path, opts,
                                  size):
    """(qemu-img may leave an empty file behind; blkimg removes it)"""
    path = str(tmp_path / "t.vhd")
    cp = run(blkimg, "create", "-f", "vpc", "-o", opts, path, size)
    assert cp.returncode == 1 and not os.path.exists(path)
    same_output(run, blkimg, qemu_img, "create", "-f", "vpc", "-o", opts,
                path, size)


def test_create_help_matches_qemu(run, blkimg, qemu_img, tmp_path):
    same_output(run, blkimg, qemu_img, "create", "-f", "vpc", "-o", "help")
    same_output(run, blkimg, qemu_img, "create", "-f", "vpc", "-o", "help",
                str(tmp_path / "x.vhd"))


@pytest.fixture
def source_raw(run, qemu_io, tmp_path):
    path = str(tmp_path / "src.raw")
    with open(path, "wb") as f:
        f.truncate(33 * MiB)
    run(qemu_io, "-f", "raw", "-c", "write -P 0x11 0 100k", "-c",
        "write -P 0x22 5M 3M", "-c", "write -P 0x33 20M 4k", "-c",
        "write -P 0x44 32M 1M", path, check=True)
    return path


@pytest.mark.parametrize("opts", [
    "subformat=dynamic", "subformat=fixed", "force_size=on",
    "subformat=fixed,force_size=on"])
def test_convert_to_vpc_matches_qemu(run, blkimg, qemu_img, tmp_path,
                                     source_raw, opts):
    """convert -O vpc: qemu-img's file (blocks in guest order); with
    subformat=fixed,force_size=on (Azure's upload form) the virtual size
    is the source's, to the byte."""
    q, b = str(tmp_path / "q.vhd"), str(tmp_path / "b.vhd")
    run(qemu_img, "convert", "-O", "vpc", "-o", opts, source_raw, q,
        check=True)
    run(blkimg, "convert", "-O", "vpc", "-o", opts, source_raw, b,
        check=True)
    assert masked(b) == masked(q)
    fixed = "fixed" in opts
    info = json.loads(run(qemu_img, "info", "--output=json",
                          *fmt_args(fixed), b, check=True).stdout)
    if "force_size" in opts:
        assert info["virtual-size"] == 33 * MiB
    cp = run(qemu_img, "compare", "-f", "raw", "-F", "vpc", source_raw, b)
    assert cp.returncode == 0, cp.stdout


def test_convert_vpc_to_vpc_direct(run, blkimg, qemu_img, tmp_path,
                                   source_raw):
    q, b = str(tmp_path / "q.vhd"), str(tmp_path / "b.vhd")
    src = str(tmp_path / "src.vhd")
    run(qemu_img, "convert", "-O", "vpc", source_raw, src, check=True)
    run(qemu_img, "convert", "-O", "vpc", src, q, check=True)
    run(blkimg, "convert", "-t", "none", "-T", "none", "-O", "vpc", src, b,
        check=True)
    assert masked(b) == masked(q)
