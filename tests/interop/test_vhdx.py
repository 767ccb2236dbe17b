# SPDX-License-Identifier: MIT
"""vhdx (Hyper-V) images against QEMU 7.2's qemu-img and qemu-io.

Images qemu-img makes (dynamic and fixed, block_state_zero on and off,
several block sizes, written by qemu-io) read in blkimg exactly as in
QEMU: info (text and JSON), map, convert to raw. Images blkimg makes and
writes are clean under qemu-img check and identical to qemu-img's twins
written by qemu-io. A log built here per MS-VHDX is refused read-only by
both and replayed by both to the same bytes. Damaged headers, region
tables, metadata, BATs and logs are refused with one line, the file
unchanged.
"""
import hashlib
import json
import os
import shutil
import struct
import uuid

import crcmod.predefined
import pytest

pytestmark = pytest.mark.qemu

MiB = 1 << 20
crc32c = crcmod.predefined.mkPredefinedCrcFun("crc-32c")

# name -> (qemu-img create -o options, size, qemu-io commands)
SCRIPTS = {
    "dyn-8m": ("subformat=dynamic", "20M", [
        "write -P 0xaa 1000k 3M", "write -P 0xbb 19M 512",
        "write -z 9M 64k"]),
    "dyn-1m-nozero": ("block_state_zero=off,block_size=1M", "5000k", [
        "write -P 0x11 100k 1500k", "write -P 0x22 4M 4k"]),
    "fixed-2m": ("subformat=fixed,block_size=2M", "6M", [
        "write -P 0x33 1M 2M"]),
    "fixed-1m-nozero": ("subformat=fixed,block_state_zero=off,block_size=1M",
                        "3M", ["write -P 0x44 512 4k"]),
    "empty": ("", "0", []),
}


def qemu_image(run, d, name):
    opts, size, cmds = SCRIPTS[name]
    path = str(d / (name + ".vhdx"))
    argv = ["qemu-img", "create", "-q", "-f", "vhdx"]
    if opts:
        argv += ["-o", opts]
    run(argv + [path, size], check=True)
    io = ["qemu-io", "-f", "vhdx"]
    for c in cmds:
        io += ["-c", c]
    if cmds:
        run(io + [path], check=True)
    return path


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    from conftest import run_cmd
    d = tmp_path_factory.mktemp("vhdx")
    return {n: qemu_image(run_cmd, d, n) for n in SCRIPTS}


def copy(src, tmp_path, name=None):
    dst = str(tmp_path / (name or os.path.basename(src)))
    shutil.copyfile(src, dst)
    return dst


def digest(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def both(run, blkimg, qemu_img, argv):
    """argv run by blkimg and qemu-img: (rc, stdout, stderr) each, with
    the program names and qemu's error_report prefixes cut."""
    out = []
    for prog, name in ((blkimg, "blkimg: "), (qemu_img, "qemu-img: ")):
        cp = run(prog, *argv)
        out.append((cp.returncode, cp.stdout, cp.stderr.replace(name, "")))
    return out


def raw_of(run, prog, path, out):
    run(prog, "convert", "-f", "vhdx", "-O", "raw", path, out, check=True)
    return digest(out)


# --------------------------------------------------------------- reading

@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_read_as_qemu(run, blkimg, qemu_img, images, tmp_path, name):
    path = copy(images[name], tmp_path)
    for argv in (["info", path], ["info", "--output=json", path],
                 ["map", "--output=json", path], ["map", path],
                 ["check", path]):
        mine, theirs = both(run, blkimg, qemu_img, argv)
        assert mine == theirs, argv
    a = raw_of(run, blkimg, path, str(tmp_path / "b.raw"))
    assert a == raw_of(run, qemu_img, path, str(tmp_path / "q.raw"))
    assert digest(path) == digest(images[name])  # read-only: untouched


def test_differencing_refused(run, blkimg, images, tmp_path):
    """has_parent in the file parameters: one line, exit 1."""
    path = copy(images["dyn-8m"], tmp_path)
    with open(path, "r+b") as f:
        f.seek(3 * MiB + 65536 + 4)
        f.write(struct.pack("<I", 2))
    cp = run(blkimg, "info", path)
    assert cp.returncode == 1 and len(cp.stderr.splitlines()) == 1
    assert "Invalid argument" in cp.stderr  # no parent locator
    assert digest(path) == digest(path)


# ------------------------------------------------- writing and creating

WRITES = ["write -P 0x5a 1000k 3M", "write -P 0x6b 19M 512",
          "write -P 0x7c 0 4k", "write -z 2M 4k"]


@pytest.mark.parametrize("opts", [
    "subformat=dynamic", "subformat=dynamic,block_state_zero=off",
    "subformat=fixed", "subformat=fixed,block_state_zero=off,block_size=1M",
    "block_size=4M,log_size=2M"])
def test_create_and_write_as_qemu(run, blkimg, blkimg_io, qemu_img, qemu_io,
                                  tmp_path, opts):
    mine, theirs = str(tmp_path / "b.vhdx"), str(tmp_path / "q.vhdx")
    b = run(blkimg, "create", "-f", "vhdx", "-o", opts, mine, "20M")
    q = run(qemu_img, "create", "-f", "vhdx", "-o", opts, theirs, "20M")
    assert b.returncode == q.returncode == 0
    assert b.stdout.replace(mine, theirs) == q.stdout
    assert os.path.getsize(mine) == os.path.getsize(theirs)
    assert run(qemu_img, "check", mine).returncode == 0
    for argv in (["info", "--output=json"], ["map", "--output=json"]):
        x = run(blkimg, *argv, mine).stdout.replace(mine, "F")
        y = run(qemu_img, *argv, mine).stdout.replace(mine, "F")
        assert x == y
    cb, cq = [blkimg_io], [qemu_io]
    for c in WRITES:
        cb += ["-c", c]
        cq += ["-c", c]
    assert run(cb + [mine]).returncode == 0
    assert run(cq + [theirs]).returncode == 0
    cp = run(qemu_img, "check", mine)
    assert (cp.returncode, cp.stdout) == (
        0, "No errors were found on the image.\n")
    assert run(qemu_img, "compare", mine, theirs).returncode == 0
    assert run(blkimg, "compare", mine, theirs).returncode == 0
    assert raw_of(run, blkimg, mine, str(tmp_path / "1.raw")) == \
        raw_of(run, qemu_img, theirs, str(tmp_path / "2.raw"))


def test_write_into_qemu_image(run, blkimg_io, qemu_img, qemu_io, images,
                               tmp_path):
    """blkimg-io and qemu-io on copies of one qemu image: same guest
    bytes, both clean."""
    for name in ("dyn-8m", "fixed-1m-nozero", "dyn-1m-nozero"):
        a = copy(images[name], tmp_path, "a.vhdx")
        b = copy(images[name], tmp_path, "b.vhdx")
        cmds = ["write -P 0x99 512 8k", "write -P 0x98 2M 1M"]
        for prog, p in ((blkimg_io, a), (qemu_io, b)):
            argv = [prog]
            for c in cmds:
                argv += ["-c", c]
            assert run(argv + [p]).returncode == 0
        assert run(qemu_img, "check", a).returncode == 0
        assert run(qemu_img, "compare", a, b).returncode == 0


def test_convert_both_ways(run, blkimg, qemu_img, tmp_path):
    raw = tmp_path / "src.raw"
    data = bytearray(os.urandom(3 * MiB)) + bytes(2 * MiB) + os.urandom(4096)
    raw.write_bytes(bytes(data))
    mine, theirs = str(tmp_path / "b.vhdx"), str(tmp_path / "q.vhdx")
    for prog, out in ((blkimg, mine), (qemu_img, theirs)):
        run(prog, "convert", "-O", "vhdx", "-o", "block_size=1M", raw, out,
            check=True)
    assert run(qemu_img, "check", mine).returncode == 0
    assert run(qemu_img, "compare", "-f", "raw", "-F", "vhdx", raw,
               mine).returncode == 0
    for prog in (blkimg, qemu_img):
        back = str(tmp_path / "back.raw")
        run(prog, "convert", "-O", "raw", mine, back, check=True)
        assert open(back, "rb").read() == bytes(data)
        run(prog, "convert", "-O", "raw", theirs, back, check=True)
        assert open(back, "rb").read() == bytes(data)


def test_create_options_as_qemu(run, blkimg, qemu_img, tmp_path):
    out = str(tmp_path / "x.vhdx")
    for opts, size in (("block_size=3M", "1G"), ("subformat=foo", "1G"),
                       ("subformat=differencing", "1M"), ("", "65T"),
                       ("block_state_zero=maybe", "1M"),
                       ("log_size=5G", "1M"), ("block_size=300M", "1G"),
                       ("log_size=100", "1G"), ("", "5000")):
        argv = ["create", "-f", "vhdx"] + (["-o", opts] if opts else [])
        mine, theirs = both(run, blkimg, qemu_img, argv + [out, size])
        assert mine == theirs, opts
        if mine[0] == 0:
            assert run(qemu_img, "check", out).returncode == 0
            os.unlink(out)
    mine, theirs = both(run, blkimg, qemu_img,
                        ["create", "-f", "vhdx", "-o", "help"])
    assert mine == theirs


# ------------------------------------------------------------------ log

def set_headers(path, log_guid):
    """Rewrites both headers with log_guid, checksums fixed."""
    with open(path, "r+b") as f:
        for off in (64 * 1024, 128 * 1024):
            f.seek(off)
            h = bytearray(f.read(4096))
            h[48:64] = log_guid
            h[4:8] = b"\0" * 4
            struct.pack_into("<I", h, 4, crc32c(bytes(h)))
            f.seek(off)
            f.write(h)


def log_entry(guid, seq, descs, datas, flushed, last, tail=0):
    """One log entry (MS-VHDX 2.3.1): header, descriptors, data sectors.
    descs: ("desc", file_offset, 4096 bytes) or ("zero", offset, length)."""
    count = len(descs)
    dsect = (count + 2 + 127) // 128
    nsect = dsect + sum(1 for d in descs if d[0] == "desc")
    e = bytearray(nsect * 4096)
    struct.pack_into("<4sIIIQII16sQQ", e, 0, b"loge", 0, nsect * 4096, tail,
                     seq, count, 0, guid, flushed, last)
    k = dsect
    for i, d in enumerate(descs):
        at = 64 + 32 * i
        if d[0] == "zero":
            struct.pack_into("<4sIQQQ", e, at, b"zero", 0, d[2], d[1], seq)
        else:
            sec = d[2]
            struct.pack_into("<4s4s8sQQ", e, at, b"desc", sec[4092:],
                             sec[:8], d[1], seq)
            struct.pack_into("<4sI4084sI", e, k * 4096, b"data", seq >> 32,
                             sec[8:4092], seq & 0xffffffff)
            k += 1
    struct.pack_into("<I", e, 4, crc32c(bytes(e)))
    return bytes(e)


def dirty_image(run, qemu_img, tmp_path, entry_fn=None):
    """A dynamic 4 MiB image (1 MiB blocks) whose BAT says nothing is
    allocated, a block of 0x77 appended at 8 MiB, and a log that points
    block 1 at it and zeroes its second 4 KiB. Returns (path, expected
    guest bytes)."""
    path = str(tmp_path / "dirty.vhdx")
    run(qemu_img, "create", "-q", "-f", "vhdx", "-o",
        "block_size=1M,block_state_zero=off", path, "4M", check=True)
    with open(path, "r+b") as f:
        f.seek(8 * MiB)
        f.write(b"\x77" * MiB)
        f.seek(2 * MiB)
        bat = bytearray(f.read(4096))
    struct.pack_into("<Q", bat, 8, (8 * MiB) | 6)
    guid = uuid.uuid4().bytes
    descs = [("desc", 2 * MiB, bytes(bat)), ("zero", 8 * MiB + 4096, 4096)]
    entry = (entry_fn or log_entry)(guid, 1, descs, None, 9 * MiB, 9 * MiB)
    with open(path, "r+b") as f:
        f.seek(MiB)
        f.write(entry)
    set_headers(path, guid)
    want = bytearray(4 * MiB)
    want[MiB:2 * MiB] = b"\x77" * MiB
    want[MiB + 4096:MiB + 8192] = bytes(4096)
    return path, bytes(want)


def test_dirty_log_refused_read_only(run, blkimg, qemu_img, tmp_path):
    path, _ = dirty_image(run, qemu_img, tmp_path)
    before = digest(path)
    mine, theirs = both(run, blkimg, qemu_img, ["info", path])
    assert mine[0] == theirs[0] == 1
    assert mine[2] == theirs[2]
    assert digest(path) == before


def test_dirty_log_replayed_as_qemu(run, blkimg, blkimg_io, qemu_img,
                                    tmp_path):
    path, want = dirty_image(run, qemu_img, tmp_path)
    a = copy(path, tmp_path, "a.vhdx")
    b = copy(path, tmp_path, "b.vhdx")
    c = copy(path, tmp_path, "c.vhdx")
    mine, theirs = both(run, blkimg, qemu_img, ["check", "-r", "all", a])
    theirs = run(qemu_img, "check", "-r", "all", b)
    assert mine[0] == theirs.returncode == 0
    assert mine[1].replace(a, b) == theirs.stdout
    # blkimg-io opens read-write: the log is replayed there too
    assert run(blkimg_io, "-c", "read 0 512", c).returncode == 0
    for img in (a, b, c):
        for prog in (blkimg, qemu_img):
            out = str(tmp_path / "out.raw")
            run(prog, "convert", "-O", "raw", img, out, check=True)
            assert open(out, "rb").read() == want, (img, prog)
        assert run(qemu_img, "check", img).returncode == 0
        # the log is empty now: read-only opens work
        assert run(blkimg, "info", img).returncode == 0


def test_hostile_log_refused(run, blkimg, qemu_img, tmp_path):
    """A valid log entry whose descriptor writes into the headers: blkimg
    refuses it (QEMU would replay it), file unchanged; a log entry with a
    bad checksum is no entry at all, for both."""
    def over_headers(guid, seq, descs, datas, flushed, last):
        return log_entry(guid, seq, [("zero", 64 * 1024, 4096)] + descs,
                         datas, flushed, last)

    path, _ = dirty_image(run, qemu_img, tmp_path, over_headers)
    before = digest(path)
    cp = run(blkimg, "check", "-r", "all", path)
    assert cp.returncode == 1 and len(cp.stderr.splitlines()) == 1
    assert digest(path) == before

    def bad_crc(*args):
        e = bytearray(log_entry(*args))
        e[4] ^= 1
        return bytes(e)

    path, _ = dirty_image(run, qemu_img, tmp_path, bad_crc)
    mine, theirs = both(run, blkimg, qemu_img, ["info", path])
    assert mine[0] == theirs[0] == 0


# -------------------------------------------------------------- hostile

def damage(path, off, data):
    with open(path, "r+b") as f:
        f.seek(off)
        f.write(data)


def fix_crc(path, off, size, csum_at=4):
    with open(path, "r+b") as f:
        f.seek(off)
        b = bytearray(f.read(size))
        b[csum_at:csum_at + 4] = b"\0" * 4
        struct.pack_into("<I", b, csum_at, crc32c(bytes(b)))
        f.seek(off)
        f.write(b)


RT = 192 * 1024
MD = 3 * MiB
HOSTILE = {
    "both-headers": [(64 * 1024, b"XXXX"), (128 * 1024, b"XXXX")],
    "region-sig": [(RT, b"XXXX")],
    "region-count": [(RT + 8, struct.pack("<I", 5000)), ("crc", RT, 65536)],
    "region-overlap": [(RT + 32, struct.pack("<Q", 0)), ("crc", RT, 65536)],
    "region-past-eof": [(RT + 32, struct.pack("<Q", 1 << 40)),
                        ("crc", RT, 65536)],
    "bat-small": [(RT + 40, struct.pack("<I", 8)), ("crc", RT, 65536)],
    "metadata-sig": [(MD, b"XXXX")],
    "metadata-count": [(MD + 10, struct.pack("<H", 0xffff))],
    "block-size": [(MD + 65536, struct.pack("<I", 3 * MiB))],
    "sector-size": [(MD + 65536 + 32, struct.pack("<I", 1000))],
    "item-offset": [(MD + 32 + 16, struct.pack("<I", 0xfffffff0))],
    "bat-into-metadata": [(2 * MiB, struct.pack("<Q", MD | 6))],
    "bat-into-headers": [(2 * MiB, struct.pack("<Q", 6))],
    "log-offset": [(64 * 1024 + 72, struct.pack("<Q", 12345)),
                   ("crc", 64 * 1024, 4096),
                   (128 * 1024 + 72, struct.pack("<Q", 12345)),
                   ("crc", 128 * 1024, 4096)],
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_refused(run, blkimg, blkimg_io, qemu_img, images, tmp_path,
                         case):
    path = copy(images["dyn-8m"], tmp_path)
    for d in HOSTILE[case]:
        if d[0] == "crc":
            fix_crc(path, d[1], d[2])
        else:
            damage(path, *d)
    before = digest(path)
    for argv in ([blkimg, "info", path],
                 [blkimg, "convert", "-O", "raw", path,
                  str(tmp_path / "o.raw")],
                 [blkimg_io, "-c", "write 0 4k", path],
                 [blkimg, "check", path]):
        cp = run(argv)
        assert cp.returncode == 1, (argv, cp.stdout, cp.stderr)
        assert len(cp.stderr.splitlines()) == 1, cp.stderr
        assert digest(path) == before
    if case not in ("bat-small", "item-offset", "region-past-eof",
                    "metadata-count"):
        # qemu-img refuses these too (the others it reads past its
        # buffers or the file, or accepts)
        assert run(qemu_img, "info", path).returncode == 1


def test_check_truncated_as_qemu(run, blkimg, qemu_img, images, tmp_path):
    path = copy(images["dyn-1m-nozero"], tmp_path)
    os.truncate(path, 9 * MiB + 4096)
    mine, theirs = both(run, blkimg, qemu_img, ["check", path])
    assert mine == theirs
    assert mine[0] == 2
    mine, theirs = both(run, blkimg, qemu_img,
                        ["check", "--output=json", path])
    assert mine == theirs
