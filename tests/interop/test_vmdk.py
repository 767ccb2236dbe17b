# SPDX-License-Identifier: MIT
"""vmdk images read (and written) by blkimg as QEMU 7.2 does.

Every subformat qemu-img creates (monolithicSparse, monolithicFlat,
twoGbMaxExtentSparse, twoGbMaxExtentFlat, streamOptimized), written by
qemu-io, and a VMware-style stream (grain directory in the footer) built
here: blkimg's info (human and JSON), map and raw conversion equal
qemu-img's, `compare` against QEMU's raw copy exits 0, also with `-t none`.
Hostile headers, directories and tables patched in with Python are refused
with one line and no crash.
"""
import json
import os
import re
import struct
import zlib

import pytest

pytestmark = pytest.mark.qemu

SUBFORMATS = ("monolithicSparse", "monolithicFlat", "twoGbMaxExtentSparse",
              "twoGbMaxExtentFlat", "streamOptimized")


def tail(s):
    """An error line without the program name."""
    return s.strip().split(": ", 1)[1]


def qemu_raw(run, qemu_img, path, out):
    run(qemu_img, "convert", "-f", "vmdk", "-O", "raw", path, out, check=True)
    with open(out, "rb") as f:
        return f.read()


def fill(run, qemu_io, path, size):
    """Patterns at the start, across a 2 GiB extent boundary when the
    image is that large, a zero write and the last grain."""
    cmds = ["write -P 0x11 0 200k", "write -P 0x22 1M 1M",
            "write -P 0x33 %d 64k" % (size - 65536)]
    if size > 2 << 30:
        cmds.append("write -P 0x44 %d 2M" % ((2 << 30) - (1 << 20)))
    args = [qemu_io, "-f", "vmdk"]
    for c in cmds:
        args += ["-c", c]
    run(*args, path, check=True)


def make(run, qemu_img, qemu_io, tmp_path, sub, size):
    path = str(tmp_path / ("%s.vmdk" % sub))
    if sub == "streamOptimized":
        src = str(tmp_path / "src.vmdk")
        run(qemu_img, "create", "-f", "vmdk", src, str(size), check=True)
        fill(run, qemu_io, src, size)
        run(qemu_img, "convert", "-O", "vmdk", "-o",
            "subformat=streamOptimized", src, path, check=True)
    else:
        run(qemu_img, "create", "-f", "vmdk", "-o", "subformat=" + sub, path,
            str(size), check=True)
        fill(run, qemu_io, path, size)
    return path


def same_as_qemu(run, blkimg, qemu_img, path, tmp_path):
    for args in (["info"], ["info", "--output=json"], ["map", "--output=json"]):
        q = run(qemu_img, *args, path)
        b = run(blkimg, *args, path)
        assert b.returncode == q.returncode == 0, b.stderr
        assert b.stdout == q.stdout, args
    ref = str(tmp_path / "ref.raw")
    out = str(tmp_path / "out.raw")
    qemu_raw(run, qemu_img, path, ref)
    cp = run(blkimg, "convert", "-O", "raw", path, out)
    assert cp.returncode == 0, cp.stderr
    cp = run(qemu_img, "compare", "-f", "raw", "-F", "raw", ref, out)
    assert cp.returncode == 0, cp.stdout
    for cache in ([], ["-T", "none"]):
        cp = run(blkimg, "compare", *cache, "-f", "vmdk", "-F", "raw", path,
                 ref)
        assert cp.returncode == 0, cp.stdout + cp.stderr
    os.unlink(ref)
    os.unlink(out)


@pytest.mark.parametrize("sub", SUBFORMATS)
def test_subformat_reads_as_qemu(run, blkimg, qemu_img, qemu_io, tmp_path, sub):
    size = (2 << 30) + (64 << 20) if sub.startswith("twoGb") else 64 << 20
    path = make(run, qemu_img, qemu_io, tmp_path, sub, size)
    same_as_qemu(run, blkimg, qemu_img, path, tmp_path)


def test_backing_chain_and_cid(run, blkimg, blkimg_io, qemu_img, qemu_io,
                               tmp_path):
    base = str(tmp_path / "base.vmdk")
    top = str(tmp_path / "top.vmdk")
    run(qemu_img, "create", "-f", "vmdk", base, "8M", check=True)
    run(qemu_io, "-c", "write -P 0x5a 0 1M", base, check=True)
    run(qemu_img, "create", "-f", "vmdk", "-b", "base.vmdk", "-F", "vmdk",
        top, check=True)
    run(qemu_io, "-c", "write -P 0x6b 512k 64k", top, check=True)
    same_as_qemu(run, blkimg, qemu_img, top, tmp_path)
    # the parent changes: its CID no longer matches, reads fail as QEMU's
    run(qemu_io, "-c", "write -P 0x7c 4M 4k", base, check=True)
    q = run(qemu_io, "-c", "read 0 4k", top)
    b = run(blkimg_io, "-c", "read 0 4k", top)
    assert "Invalid argument" in q.stdout + q.stderr
    assert "Invalid argument" in b.stdout + b.stderr


def contiguous_map(run, blkimg, path):
    cp = run(blkimg, "map", "--output=json", path)
    assert cp.returncode == 0, cp.stderr
    return json.loads(cp.stdout)


def test_grains_map_as_one_extent(run, blkimg, blkimg_io, qemu_img, qemu_io,
                                  tmp_path):
    """32 MiB written at once spans several grain tables (one covers 32
    MiB at 64 KiB grains) and is one host run: one map entry."""
    path = str(tmp_path / "big.vmdk")
    run(qemu_img, "create", "-f", "vmdk", path, "128M", check=True)
    run(qemu_io, "-c", "write -P 1 16M 32M", path, check=True)
    m = contiguous_map(run, blkimg, path)
    data = [e for e in m if e["data"]]
    assert len(data) == 1 and data[0]["length"] == 32 << 20

    def io_calls(length):
        cp = run(blkimg_io, "--stats", "-r", "-c", "read 16M %d" % length,
                 path)
        assert cp.returncode == 0, cp.stderr
        return int(re.search(r"io calls: (\d+)", cp.stdout + cp.stderr)[1])
    # the whole run is one read; the second grain table one more
    assert io_calls(32 << 20) <= io_calls(65536) + 1


# ---------------------------------------------------- VMware's stream


def stream_vmdk(path, grains, capacity_sectors):
    """A streamOptimized file as VMware writes it: header with the grain
    directory at the end (GD_AT_END), grains with markers, grain table and
    directory markers, footer and end-of-stream. grains: {index: bytes}."""
    gsec, gtes = 128, 512
    ngt = (capacity_sectors // gsec + gtes - 1) // gtes

    def header(gd):
        h = struct.pack("<IIQQQQIQQQ", 3, 0x30001, capacity_sectors, gsec,
                        1, 1, gtes, 0, gd, 2)
        h += b"\0" + b"\n \r\n" + struct.pack("<H", 1)
        return (b"KDMV" + h).ljust(512, b"\0")

    out = bytearray(header(0xFFFFFFFFFFFFFFFF))
    desc = (b'# Disk DescriptorFile\nversion=1\nCID=12345678\n'
            b'parentCID=ffffffff\ncreateType="streamOptimized"\n')
    out += desc.ljust(512, b"\0")
    gtes_val = [0] * (ngt * gtes)
    for idx in sorted(grains):
        comp = zlib.compress(grains[idx])
        gtes_val[idx] = len(out) // 512
        rec = struct.pack("<QI", idx * gsec, len(comp)) + comp
        out += rec.ljust((len(rec) + 511) // 512 * 512, b"\0")
    gd = []
    for t in range(ngt):
        out += struct.pack("<QII", 4, 0, 1).ljust(512, b"\0")  # GT marker
        gd.append(len(out) // 512)
        out += struct.pack("<%dI" % gtes, *gtes_val[t * gtes:(t + 1) * gtes])
    gdsec = (ngt * 4 + 511) // 512
    out += struct.pack("<QII", gdsec, 0, 2).ljust(512, b"\0")  # GD marker
    gd_at = len(out) // 512
    out += struct.pack("<%dI" % ngt, *gd).ljust(gdsec * 512, b"\0")
    out += struct.pack("<QII", 1, 0, 3).ljust(512, b"\0")  # footer marker
    out += header(gd_at)
    out += b"\0" * 512  # end of stream
    with open(path, "wb") as f:
        f.write(out)


def test_vmware_stream_footer(run, blkimg, qemu_img, tmp_path):
    path = str(tmp_path / "vmw.vmdk")
    grains = {0: b"\x01" * 65536, 3: bytes(range(256)) * 256,
              700: b"\x07" * 65536}
    stream_vmdk(path, grains, 64 << 11)
    same_as_qemu(run, blkimg, qemu_img, path, tmp_path)


def test_descriptor_with_zero_extent_and_offsets(run, blkimg, blkimg_io,
                                                 tmp_path):
    """FLAT extents at offsets, a SPARSE extent and a ZERO extent (read
    as zeroes: QEMU 7.2 skips ZERO lines)."""
    flat = tmp_path / "data.bin"
    flat.write_bytes(b"\0" * 512 + b"\xaa" * 4096 + b"\xbb" * 4096)
    desc = tmp_path / "multi.vmdk"
    desc.write_text('version=1\nCID=1\nparentCID=ffffffff\n'
                    'createType="monolithicFlat"\n'
                    'RW 8 FLAT "data.bin" 1\n'
                    'RW 16 ZERO\n'
                    'RW 8 FLAT "data.bin" 9\n')
    cp = run(blkimg_io, "-r", "-c", "read -P 0xaa 0 4k", "-c",
             "read -P 0 4k 8k", "-c", "read -P 0xbb 12k 4k", str(desc))
    assert cp.returncode == 0 and "Pattern verification failed" not in \
        cp.stdout, cp.stdout + cp.stderr
    info = json.loads(run(blkimg, "info", "--output=json", str(desc)).stdout)
    assert info["virtual-size"] == 16384
    kinds = [e["format"] for e in info["format-specific"]["data"]["extents"]]
    assert kinds == ["FLAT", "ZERO", "FLAT"]


# ------------------------------------------------------------ hostile

def patch(path, off, data):
    with open(path, "r+b") as f:
        f.seek(off)
        f.write(data)


HOSTILE = [
    # (name, offset, bytes, qemu refuses too)
    ("version", 4, struct.pack("<I", 4), True),
    ("gtes", 44, struct.pack("<I", 1000), True),
    ("granularity0", 20, struct.pack("<Q", 0), True),
    ("granularity", 20, struct.pack("<Q", 0x400000), True),
    ("capacity", 12, struct.pack("<Q", 33 << 36), True),
    ("capacity_wrap", 12, struct.pack("<Q", 1 << 62), False),
    ("grain_offset", 64, struct.pack("<Q", 1 << 40), True),
    ("gd_offset", 56, struct.pack("<Q", 1 << 30), False),
    ("gd_entry", None, struct.pack("<I", 0x7fffffff), False),
]


@pytest.mark.parametrize("name,off,data,qemu_refuses", HOSTILE,
                         ids=[h[0] for h in HOSTILE])
def test_hostile_header_refused(run, blkimg, qemu_img, tmp_path, name, off,
                                data, qemu_refuses):
    path = str(tmp_path / "h.vmdk")
    run(qemu_img, "create", "-f", "vmdk", path, "64M", check=True)
    if off is None:  # the first grain directory entry
        with open(path, "rb") as f:
            f.seek(56)
            off = struct.unpack("<Q", f.read(8))[0] * 512
    patch(path, off, data)
    b = run(blkimg, "info", path)
    assert b.returncode == 1
    assert len(b.stderr.strip().splitlines()) == 1, b.stderr
    if qemu_refuses:
        q = run(qemu_img, "info", path)
        assert q.returncode == 1
        assert tail(b.stderr) == tail(q.stderr)


def test_hostile_grain_entries(run, blkimg, blkimg_io, qemu_img, qemu_io,
                               tmp_path):
    """A grain table entry past the end of the file fails the read; a
    compressed grain whose marker claims too much fails it too."""
    path = str(tmp_path / "g.vmdk")
    run(qemu_img, "create", "-f", "vmdk", path, "64M", check=True)
    run(qemu_io, "-c", "write -P 1 0 64k", path, check=True)
    with open(path, "rb") as f:
        f.seek(56)
        gd = struct.unpack("<Q", f.read(8))[0] * 512
        f.seek(gd)
        gt = struct.unpack("<I", f.read(4))[0] * 512
    patch(path, gt, struct.pack("<I", 0x10000000))
    cp = run(blkimg_io, "-r", "-c", "read 0 4k", path)
    assert "Input/output error" in cp.stdout + cp.stderr
    cp = run(blkimg, "convert", "-O", "raw", path, str(tmp_path / "o.raw"))
    assert cp.returncode == 1 and len(cp.stderr.splitlines()) == 1

    so = str(tmp_path / "so.vmdk")
    stream_vmdk(so, {0: b"\x01" * 65536}, 1 << 11)
    patch(so, 1024 + 8, struct.pack("<I", 0xfffffff0))
    cp = run(blkimg_io, "-r", "-c", "read 0 4k", so)
    q = run(qemu_io, "-r", "-c", "read 0 4k", so)
    assert "Invalid argument" in q.stdout + q.stderr
    assert "Invalid argument" in cp.stdout + cp.stderr


def test_hostile_descriptors(run, blkimg, qemu_img, tmp_path):
    cases = {
        "noct": 'version=1\nCID=1\nparentCID=ffffffff\n',
        "type": 'version=1\ncreateType="foo"\n',
        "line": 'version=1\ncreateType="monolithicFlat"\nRW 100 FLAT "x"\n',
        "file": 'version=1\nCID=1\nparentCID=ffffffff\n'
                'createType="monolithicFlat"\nRW 100 FLAT "nothere" 0\n',
    }
    for name, text in cases.items():
        p = tmp_path / (name + ".vmdk")
        p.write_text(text)
        b = run(blkimg, "info", str(p))
        q = run(qemu_img, "info", str(p))
        assert b.returncode == q.returncode == 1, name
        assert tail(b.stderr) == tail(q.stderr), name


# ------------------------------------------------------------- writes

WRITES = ["write -P 0x11 1000 5000", "write -P 0x22 60k 200k",
          "write -P 0x33 63M 1M", "write -P 0x44 32M 512",
          "write -P 0x55 100k 1k", "write -z 10M 128k", "write -z 300k 10k"]
# across the first extent's end
SPLIT_WRITE = "write -P 0x66 %d 1M" % ((2 << 30) - (512 << 10))


def mask_cids(text):
    return re.sub(rb"(\n(?:parent)?CID=)[0-9a-f]+", rb"\1x", text)


def masked(path):
    """The file's bytes with the descriptor's CIDs masked (random at
    creation, a new one on the first write), the descriptor cut at its
    first NUL (a CID of another length shifts the text, and QEMU leaves
    the bytes past the new end as they were), and a large file (a flat
    extent) as its size and allocation."""
    st = os.stat(path)
    if st.st_size > 16 << 20:
        return (st.st_size, st.st_blocks)
    with open(path, "rb") as f:
        data = f.read()
    if data[:4] != b"KDMV":
        # in whole sectors: the CIDs' lengths change the text's
        return (len(data) + 511) // 512, mask_cids(data.split(b"\0")[0])
    desc = mask_cids(data[512:512 * 21].split(b"\0")[0])
    return data[:512] + desc + data[512 * 21:]


@pytest.mark.parametrize("opts,size", [
    ("subformat=monolithicSparse", "64M"),
    ("zeroed_grain=on", "64M"),
    ("subformat=twoGbMaxExtentSparse", "3G"),
    ("subformat=monolithicFlat", "64M"),
    ("backing", "64M"),
], ids=["sparse", "zeroed_grain", "split", "flat", "backing"])
def test_writes_as_qemu_io(run, blkimg_io, qemu_img, qemu_io, tmp_path, opts,
                           size):
    """The same writes by blkimg-io (-t none) and qemu-io on twin images:
    the files are byte-identical but the CID, qemu-img check is clean and
    qemu-io reads what blkimg wrote."""
    dirs = [tmp_path / "b", tmp_path / "q"]
    for d in dirs:
        d.mkdir()
        if opts == "backing":
            run(qemu_img, "create", "-q", "-f", "vmdk", str(d / "base.vmdk"),
                size, check=True)
            run(qemu_io, "-c", "write -P 0x5a 0 2M", str(d / "base.vmdk"),
                check=True)
            run(qemu_img, "create", "-q", "-f", "vmdk", "-b", "base.vmdk",
                "-F", "vmdk", str(d / "t.vmdk"), check=True)
        else:
            run(qemu_img, "create", "-q", "-f", "vmdk", "-o", opts,
                str(d / "t.vmdk"), size, check=True)
    args = []
    for c in WRITES + ([SPLIT_WRITE] if size == "3G" else []):
        args += ["-c", c]
    cp = run(blkimg_io, "-t", "none", *args, str(dirs[0] / "t.vmdk"))
    assert cp.returncode == 0 and "failed" not in cp.stdout, cp.stdout
    run(qemu_io, *args, str(dirs[1] / "t.vmdk"), check=True)
    names = sorted(os.listdir(dirs[1]))
    assert sorted(os.listdir(dirs[0])) == names
    for name in names:
        assert masked(dirs[0] / name) == masked(dirs[1] / name), name
    b, q = str(dirs[0] / "t.vmdk"), str(dirs[1] / "t.vmdk")
    cp = run(qemu_img, "check", b)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    cp = run(qemu_img, "compare", b, q)
    assert cp.returncode == 0, cp.stdout


# ------------------------------------------------------------ create

CREATE = [
    ["a.vmdk", "100M"],
    ["-o", "subformat=monolithicFlat", "f.vmdk", "10M"],
    ["-o", "subformat=twoGbMaxExtentSparse,zeroed_grain=on", "s.vmdk", "5G"],
    ["-o", "subformat=twoGbMaxExtentFlat", "f2.vmdk", "3G"],
    ["-o", "subformat=streamOptimized", "so.vmdk", "10M"],
    ["-o", "adapter_type=lsilogic,hwversion=7,toolsversion=123", "x.vmdk",
     "100M"],
    ["-o", "compat6=on", "y.vmdk", "1G"],
    ["z.vmdk", "1000"],
    ["-o", "subformat=twoGbMaxExtentSparse", "e.vmdk", "0"],
    ["-b", "a.vmdk", "-F", "vmdk", "c.vmdk"],
    # refused
    ["-b", "q.qcow2", "-F", "qcow2", "r.vmdk"],
    ["-b", "q.qcow2", "-F", "vmdk", "r.vmdk"],
    ["-o", "adapter_type=foo", "r.vmdk", "1M"],
    ["-o", "subformat=foo", "r.vmdk", "1M"],
    ["-o", "compat6=on,hwversion=7", "r.vmdk", "1M"],
    ["-o", "subformat=monolithicFlat", "-b", "a.vmdk", "-F", "vmdk", "r.vmdk",
     "1M"],
    ["-o", "subformat=monolithicFlat,zeroed_grain=on", "r.vmdk", "1M"],
    ["-b", "nothere.vmdk", "-F", "vmdk", "r.vmdk", "1M"],
]


def test_create_as_qemu_img(run, blkimg, qemu_img, tmp_path):
    """The same files (but the CIDs), the same "Formatting" lines and
    errors, for every subformat and option qemu-img takes."""
    dirs = {}
    for tool, exe in (("q", qemu_img), ("b", blkimg)):
        d = tmp_path / tool
        d.mkdir()
        run(qemu_img, "create", "-q", "-f", "qcow2", str(d / "q.qcow2"), "1M",
            check=True)
        outs = []
        for args in CREATE:
            cp = run(exe, "create", "-f", "vmdk", *args, cwd=str(d))
            outs.append((cp.returncode, cp.stdout,
                         cp.stderr.replace(os.path.basename(exe), "X")))
        dirs[tool] = (d, outs)
    (qd, qouts), (bd, bouts) = dirs["q"], dirs["b"]
    for args, q, b in zip(CREATE, qouts, bouts):
        assert q == b, args
    names = sorted(os.listdir(qd))
    assert sorted(os.listdir(bd)) == names
    for name in names:
        if name.endswith(".vmdk"):
            assert masked(bd / name) == masked(qd / name), name
    for name in ("a.vmdk", "s.vmdk", "so.vmdk", "c.vmdk"):
        cp = run(qemu_img, "check", str(bd / name))
        assert cp.returncode == 0, cp.stdout + cp.stderr


def test_create_help(run, blkimg, qemu_img):
    q = run(qemu_img, "create", "-f", "vmdk", "-o", "help")
    b = run(blkimg, "create", "-f", "vmdk", "-o", "help")
    assert (b.returncode, b.stdout) == (q.returncode, q.stdout)


@pytest.mark.parametrize("how", [["-o", "subformat=streamOptimized"], ["-c"],
                                 ["-t", "none", "-o",
                                  "subformat=streamOptimized"],
                                 ["-o", "subformat=monolithicFlat"], []],
                         ids=["stream", "compress", "stream-direct", "flat",
                              "sparse"])
def test_convert_to_vmdk_as_qemu_img(run, blkimg, qemu_img, qemu_io, tmp_path,
                                     how):
    """convert -O vmdk writes the files qemu-img writes: streamOptimized
    grains compressed with markers, -c on a monolithicSparse target as
    plain grains (QEMU's vmdk does so)."""
    src = str(tmp_path / "src.vmdk")
    run(qemu_img, "create", "-q", "-f", "vmdk", src, "64M", check=True)
    fill(run, qemu_io, src, 64 << 20)
    (tmp_path / "q").mkdir()
    (tmp_path / "b").mkdir()
    q, b = str(tmp_path / "q" / "t.vmdk"), str(tmp_path / "b" / "t.vmdk")
    opts = [a for a in how if a not in ("-t", "none")]
    run(qemu_img, "convert", "-O", "vmdk", *opts, src, q, check=True)
    cp = run(blkimg, "convert", "-O", "vmdk", *how, src, b)
    assert cp.returncode == 0, cp.stderr
    assert masked(b) == masked(q)
    cp = run(qemu_img, "check", b)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    cp = run(qemu_img, "compare", src, b)
    assert cp.returncode == 0, cp.stdout


# ---------------------------------------------------- VMDK 3 and check


def cowd_vmdk(path):
    """A VMDK 3 ("COWD") sparse file: 8 KiB grains, 4096-entry tables,
    the CIDs at sector 1 where QEMU reads them."""
    gsec, cap = 16, 2048 * 8
    ngt = (cap // gsec + 4095) // 4096
    gd_off, gt_sec = 2, 4096 * 4 // 512
    gt_off = gd_off + (ngt * 4 + 511) // 512
    data_off = gt_off + ngt * gt_sec
    gtes = [0] * (ngt * 4096)
    grains = {0: b"\x11", 5: b"\x22", 6: b"\x23", 1000: b"\x33"}
    out = bytearray(data_off * 512)
    for i, (g, d) in enumerate(sorted(grains.items())):
        gtes[g] = data_off + i * gsec
        out += d * (gsec * 512)
    hdr = b"COWD" + struct.pack("<10I", 1, 3, cap, gsec, gd_off, ngt,
                                len(out) // 512, 0, 0, 0)
    out[0:len(hdr)] = hdr
    desc = b"# Disk DescriptorFile\nversion=1\nCID=fffffffe\nparentCID=ffffffff\n"
    out[512:512 + len(desc)] = desc
    gd = [gt_off + t * gt_sec for t in range(ngt)]
    out[gd_off * 512:gd_off * 512 + 4 * ngt] = struct.pack("<%dI" % ngt, *gd)
    for t in range(ngt):
        o = (gt_off + t * gt_sec) * 512
        out[o:o + 4096 * 4] = struct.pack(
            "<4096I", *gtes[t * 4096:(t + 1) * 4096])
    with open(path, "wb") as f:
        f.write(out)


def test_vmdk3_reads_as_qemu(run, blkimg, qemu_img, tmp_path):
    path = str(tmp_path / "v3.vmdk")
    cowd_vmdk(path)
    same_as_qemu(run, blkimg, qemu_img, path, tmp_path)


def test_check_as_qemu_img(run, blkimg, qemu_img, qemu_io, tmp_path):
    """Clean images, an entry past the end of the file, repairs refused:
    the same output and exit codes."""
    ok = str(tmp_path / "ok.vmdk")
    run(qemu_img, "create", "-q", "-f", "vmdk", ok, "64M", check=True)
    run(qemu_io, "-c", "write -P 1 0 128k", ok, check=True)
    bad = str(tmp_path / "bad.vmdk")
    with open(ok, "rb") as f:
        data = bytearray(f.read())
    gd = struct.unpack_from("<Q", data, 56)[0] * 512
    gt = struct.unpack_from("<I", data, gd)[0] * 512
    struct.pack_into("<I", data, gt + 4, 0x100000)
    with open(bad, "wb") as f:
        f.write(data)
    flat = str(tmp_path / "flat.vmdk")
    run(qemu_img, "create", "-q", "-f", "vmdk", "-o",
        "subformat=monolithicFlat", flat, "1M", check=True)
    for path in (ok, bad, flat):
        for opts in ([], ["--output=json"], ["-r", "all"]):
            q = run(qemu_img, "check", *opts, path)
            b = run(blkimg, "check", *opts, path)
            assert b.returncode == q.returncode, (path, opts)
            assert b.stdout == q.stdout, (path, opts)
            assert b.stderr.replace("blkimg:", "qemu-img:") == q.stderr


def test_stream_optimized_writes_as_qemu_io(run, blkimg_io, qemu_img, qemu_io,
                                            tmp_path):
    """streamOptimized takes whole grains (or the image's tail) once,
    compressed at the end of the file; a rewrite fails with EIO."""
    cmds = ["write -P 1 0 64k", "write -P 2 128k 128k", "write -P 3 1000 10",
            "write -P 4 0 64k", "write -z 1M 64k", "write -P 5 10176k 64k"]
    args = []
    for c in cmds:
        args += ["-c", c]
    outs = []
    for tool, exe in (("q", qemu_io), ("b", blkimg_io)):
        d = tmp_path / tool
        d.mkdir()
        path = str(d / "s.vmdk")
        run(qemu_img, "create", "-q", "-f", "vmdk", "-o",
            "subformat=streamOptimized", path, "10M", check=True)
        cp = run(exe, *args, path)
        outs.append([l for l in cp.stdout.splitlines()
                     if l.startswith(("wrote", "write failed"))])
    assert outs[0] == outs[1]
    q, b = str(tmp_path / "q" / "s.vmdk"), str(tmp_path / "b" / "s.vmdk")
    assert masked(b) == masked(q)
    assert run(qemu_img, "check", b).returncode == 0


@pytest.mark.parametrize("cache", [[], ["-t", "none"]], ids=["default", "none"])
def test_convert_stream_incompressible_tail(run, blkimg, qemu_img, tmp_path,
                                            cache):
    """Random grains compress to more than a grain; the last one, at the
    end of the file, must survive the end of the stream whole (the file
    ends on the sector after it, as qemu-img's)."""
    src = tmp_path / "src.raw"
    with open(src, "wb") as f:
        f.truncate(4 << 20)
        f.seek(1 << 20)
        f.write(os.urandom(128 << 10))
        f.seek((4 << 20) - (64 << 10))
        f.write(os.urandom(64 << 10))
    (tmp_path / "q").mkdir()
    (tmp_path / "b").mkdir()
    q, b = str(tmp_path / "q" / "t.vmdk"), str(tmp_path / "b" / "t.vmdk")
    for exe, out, extra in ((qemu_img, q, []), (blkimg, b, cache)):
        run(exe, "convert", *extra, "-f", "raw", "-O", "vmdk", "-o",
            "subformat=streamOptimized", src, out, check=True)
    assert os.path.getsize(b) == os.path.getsize(q)
    assert masked(b) == masked(q)
    assert run(qemu_img, "check", b).returncode == 0
    cp = run(qemu_img, "compare", "-f", "raw", "-F", "vmdk", src, b)
    assert cp.returncode == 0, cp.stdout + cp.stderr
