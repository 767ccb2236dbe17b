# SPDX-License-Identifier: MIT
"""Probing never guesses wrong: every image format qemu-img 7.2 probes.

Images of each format qemu-img can create (qcow, qed, vmdk in each
subformat, vhdx, vpc dynamic and fixed, vdi, luks, parallels) are made by
qemu-img; bochs, cloop and dmg images (qemu-img cannot create them) are
crafted here from the format facts and opened by qemu-img to prove them
valid. For each, `blkimg info` names the format qemu-img info names: a
format blkimg cannot open yet is refused with one line naming it (exit 1),
by every command, without -f and with it, and no file is created, written
or truncated; a fixed VHD is raw to both. Edge cases (text that looks like
a vmdk descriptor only in part, dmg's name rule, empty and 1-byte files)
are decided by running qemu-img on the same bytes. The probed-raw
protection of block 0 refuses the new signatures as qemu-io does.
"""
import base64
import hashlib
import json
import os
import shutil
import struct
import zlib

import pytest
from conftest import cached_dir, qemu_pbkdf2_retry

pytestmark = pytest.mark.qemu

MiB = 1 << 20

# name -> qemu-img create arguments (extent files get the name as prefix)
CREATED = {
    "qcow": ["-f", "qcow"],
    "qed": ["-f", "qed"],
    "vmdk-monolithicSparse": ["-f", "vmdk"],
    "vmdk-monolithicFlat": ["-f", "vmdk", "-o", "subformat=monolithicFlat"],
    "vmdk-twoGbMaxExtentSparse": [
        "-f", "vmdk", "-o", "subformat=twoGbMaxExtentSparse"],
    "vmdk-twoGbMaxExtentFlat": [
        "-f", "vmdk", "-o", "subformat=twoGbMaxExtentFlat"],
    "vmdk-streamOptimized": [
        "-f", "vmdk", "-o", "subformat=streamOptimized"],
    "vhdx": ["-f", "vhdx"],
    "vpc-dynamic": ["-f", "vpc", "-o", "subformat=dynamic"],
    "vpc-fixed": ["-f", "vpc", "-o", "subformat=fixed"],
    "vdi": ["-f", "vdi"],
    "luks": ["--object", "secret,id=sec0,data=x", "-f", "luks", "-o",
             "key-secret=sec0,iter-time=10"],
    "parallels": ["-f", "parallels"],
}

# --------------------------------------------------- crafted from the facts


def craft_bochs(path, size=MiB, extent=4096):
    """A growing bochs redolog (v2) with every extent unallocated."""
    hdr = bytearray(512)
    hdr[0:22] = b"Bochs Virtual HD Image"
    hdr[32:39] = b"Redolog"
    hdr[48:55] = b"Growing"
    entries = -(-size // extent)
    # version, header size, catalog entries, bitmap size, extent size
    struct.pack_into("<IIIII", hdr, 64, 0x00020000, 512, entries, 512, extent)
    struct.pack_into("<Q", hdr, 88, size)
    with open(path, "wb") as f:
        f.write(bytes(hdr) + b"\xff" * (4 * entries))


CLOOP_MAGIC = (b"#!/bin/sh\n#V2.0 Format\n"
               b"modprobe cloop file=$0 && mount -r -t iso9660 /dev/cloop $1\n")


def craft_cloop(path, block=512):
    """A cloop V2.0 image of one zlib-compressed block of zeroes."""
    data = zlib.compress(bytes(block))
    head = CLOOP_MAGIC.ljust(128, b"\0") + struct.pack(">II", block, 1)
    first = len(head) + 16
    with open(path, "wb") as f:
        f.write(head + struct.pack(">QQ", first, first + len(data)) + data)


def craft_dmg(path, sectors=1):
    """A UDIF image: an XML plist with one mish block (one all-zero
    chunk), then the 512-byte koly trailer pointing at it."""
    mish = bytearray(204 + 40)
    struct.pack_into(">I", mish, 0, 0x6d697368)  # "mish"
    struct.pack_into(">IQQQQ", mish, 204, 0, 0, 0, sectors, 0)  # UDZE
    xml = (b"<plist><data>" + base64.b64encode(bytes(mish)) +
           b"</data></plist>")
    koly = bytearray(512)
    koly[0:4] = b"koly"
    struct.pack_into(">QQ", koly, 0xd8, 0, len(xml))  # XML offset, length
    struct.pack_into(">Q", koly, 0x1ec, sectors)
    with open(path, "wb") as f:
        f.write(xml + bytes(koly))


CRAFTED = {
    "bochs": craft_bochs,
    "cloop": craft_cloop,
    "dmg.dmg": craft_dmg,
}

ALL = sorted(CREATED) + sorted(CRAFTED)
# formats blkimg opens (tests/interop/test_<format>.py test them): info
# must equal qemu-img's; a fixed VHD is raw to both (see below)
OPENS = {"vdi", "vpc", "vmdk", "vhdx", "luks"}

# ----------------------------------------------------------------- helpers


def qemu_create(qemu_img, path, args):
    # QEMU times LUKS's PBKDF2: a loaded machine may fail it
    cp = qemu_pbkdf2_retry([qemu_img, "create", "-q"] + args +
                           [str(path), "1M"])
    if cp.returncode != 0:
        pytest.fail("qemu-img create %s: %s" % (args, cp.stderr))


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    """Every image once, in one directory (tests work on copies): those
    qemu-img makes shared by every worker and run (conftest.cached_dir;
    the LUKS one times PBKDF2), the crafted ones made here."""
    import pathlib
    qemu_img = shutil.which("qemu-img") or "qemu-img"
    d = tmp_path_factory.mktemp("probe")

    def build(c):
        for name, args in CREATED.items():
            qemu_create(qemu_img, pathlib.Path(c) / name, args)
    made = cached_dir("probe-formats|%r" % sorted(CREATED.items()), build)
    for f in os.listdir(made):
        shutil.copyfile(made / f, d / f)
    for name, craft in CRAFTED.items():
        craft(str(d / name))
    return d


def copy_image(images, name, dest):
    """Copies image name (with its extent files, named name-*) into dest;
    returns the path of its main file."""
    for f in os.listdir(images):
        if f == name or f.startswith(name + "-"):
            shutil.copyfile(images / f, dest / f)
    return dest / name


def tree_hashes(d):
    """{file name: sha256} of every file in d."""
    out = {}
    for n in sorted(os.listdir(d)):
        with open(os.path.join(d, n), "rb") as f:
            out[n] = hashlib.sha256(f.read()).hexdigest()
    return out


def qemu_format(run, qemu_img, path, *opts):
    """The format qemu-img info picks for path (it must open it)."""
    cp = run(qemu_img, "info", "--output=json", *opts, path)
    assert cp.returncode == 0, cp.stderr
    return json.loads(cp.stdout)["format"]


def refusal(path, fmt):
    return ("blkimg: Could not open '%s': Image format '%s' is not "
            "supported by blkimg yet\n" % (path, fmt))


# ----------------------------------------------------------------- info


@pytest.mark.parametrize("name", ALL)
def test_info_names_the_format(run, blkimg, qemu_img, images, tmp_path, name):
    path = str(copy_image(images, name, tmp_path))
    before = tree_hashes(tmp_path)
    want = qemu_format(run, qemu_img, path)
    for out in ([], ["--output=json"]):
        cp = run(blkimg, "info", *out, path)
        if want == "raw":
            assert cp.returncode == 0, cp.stderr
            if out:
                got = json.loads(cp.stdout)
                q = json.loads(run(qemu_img, "info", "--output=json",
                                   path).stdout)
                assert got["format"] == "raw"
                assert got["virtual-size"] == q["virtual-size"]
            else:
                assert "file format: raw\n" in cp.stdout
        elif want in OPENS:
            q = run(qemu_img, "info", *out, path, check=True)
            assert (cp.returncode, cp.stdout) == (0, q.stdout), cp.stderr
        else:
            assert (cp.returncode, cp.stdout) == (1, "")
            assert cp.stderr == refusal(path, want)
    assert tree_hashes(tmp_path) == before


def test_fixed_vhd_is_raw_to_both(run, blkimg, qemu_img, images, tmp_path):
    """A fixed VHD has its footer only at the end: QEMU's prober sees raw
    (the whole file, footer included, is the virtual disk)."""
    path = str(copy_image(images, "vpc-fixed", tmp_path))
    assert qemu_format(run, qemu_img, path) == "raw"
    cp = run(blkimg, "info", "--output=json", path, check=True)
    info = json.loads(cp.stdout)
    assert info["format"] == "raw"
    assert info["virtual-size"] == os.path.getsize(path)
    with open(path, "rb") as f:
        f.seek(-512, os.SEEK_END)
        assert f.read(8) == b"conectix"  # the footer, at the end only


# ------------------------------------------------------ every command refuses


def refusing_commands(blkimg, blkimg_io, path, out):
    """(argv, exit code) of commands, without -f, that must refuse path,
    an image blkimg cannot open; out is a target file name."""
    return [
        ([blkimg, "convert", "-O", "raw", path, out], 1),
        ([blkimg, "map", "--output=json", path], 1),
        ([blkimg, "compare", path, path], 2),  # qemu-img compare: 2
        ([blkimg, "dd", "if=" + path, "of=" + out], 1),
        ([blkimg, "measure", "-O", "qcow2", path], 1),
        ([blkimg, "check", path], 1),
        ([blkimg_io, "-c", "write -P 0xab 0 4k", path], 1),
    ]


def named_commands(blkimg, blkimg_io, path, fmt, out):
    """The same refusals with the format named (-f, image options), and
    the rest of the commands that would write."""
    opts = "file.filename=" + path
    # probing through --image-opts sees no file name: dmg is raw there
    probe_opts = [] if fmt == "dmg" else [
        ([blkimg, "info", "--image-opts", opts], 1)]
    return probe_opts + [
        ([blkimg, "convert", "-O", "qcow2", "-f", fmt, path, out], 1),
        ([blkimg, "info", "-f", fmt, path], 1),
        ([blkimg, "info", "--image-opts", "driver=%s,%s" % (fmt, opts)], 1),
        ([blkimg, "resize", path, "2M"], 1),
        ([blkimg, "map", path], 1),
        ([blkimg_io, "-c", "read 0 512", path], 1),
        ([blkimg_io, "-f", fmt, "-c", "write 0 512", path], 1),
        ([blkimg_io, "--image-opts", "-c", "write 0 512",
          "driver=%s,%s" % (fmt, opts)], 1),
    ]


# every refusal takes the same path once the format is known: the named
# variants run on one image of each kind of probe (descriptor text with
# extents, magic, name)
NAMED = ("qed", "dmg.dmg")


@pytest.mark.parametrize("name", [n for n in ALL
                                  if n.split("-")[0] not in OPENS])
def test_every_command_refuses(run, blkimg, blkimg_io, qemu_img, images,
                               tmp_path, name):
    path = str(copy_image(images, name, tmp_path))
    fmt = qemu_format(run, qemu_img, path)
    out = str(tmp_path / "target.out")
    with open(out, "wb") as f:
        f.write(b"keep me")  # an existing target must not be truncated
    before = tree_hashes(tmp_path)
    cmds = refusing_commands(blkimg, blkimg_io, path, out)
    if name in NAMED:
        cmds += named_commands(blkimg, blkimg_io, path, fmt, out)
    for argv, code in cmds:
        cp = run(argv)
        assert cp.returncode == code, (argv, cp.stdout, cp.stderr)
        assert "'%s' is not supported by blkimg yet" % fmt in cp.stderr, argv
        assert len(cp.stderr.splitlines()) == 1, (argv, cp.stderr)
        assert tree_hashes(tmp_path) == before, argv
    os.unlink(out)
    cp = run(blkimg, "convert", "-O", "raw", path, out)
    assert cp.returncode == 1 and not os.path.exists(out)


# ----------------------------------------- formats named on the command line

FOREIGN = ["qcow", "qed", "parallels",
           "dmg", "bochs", "cloop"]


@pytest.mark.parametrize("fmt", FOREIGN)
def test_named_format_refused(run, blkimg, qemu_img, tmp_path, fmt):
    """-f NAME opens nothing; create -f NAME and convert/dd -O NAME make
    no file: qemu-img's words where it refuses too (dmg, bochs, cloop)."""
    raw = tmp_path / "disk.raw"
    raw.write_bytes(b"\xab" * 65536)
    before = tree_hashes(tmp_path)
    cp = run(blkimg, "info", "-f", fmt, raw)
    assert (cp.returncode, cp.stderr) == (1, refusal(raw, fmt))
    new = tmp_path / "new.img"
    nocreate = "Format driver '%s' does not support image creation\n" % fmt
    cases = [
        ([blkimg, "create", "-f", fmt, new, "1M"], "%s: " % new + nocreate),
        ([blkimg, "create", "-f", fmt, "-o", "help"], nocreate),
        ([blkimg, "convert", "-O", fmt, raw, new], nocreate),
        ([blkimg, "dd", "-O", fmt, "if=%s" % raw, "of=%s" % new], nocreate),
    ]
    for argv, msg in cases:
        cp = run(argv)
        assert (cp.returncode, cp.stdout) == (1, ""), argv
        assert cp.stderr == "blkimg: " + msg, argv
        assert not new.exists()
        if fmt in ("dmg", "bochs", "cloop"):
            q = run([qemu_img] + argv[1:])
            lines = [l for l in q.stderr.splitlines() if "module" not in l]
            assert (q.returncode, lines) == (1, ["qemu-img: " + msg.strip()])
    assert tree_hashes(tmp_path) == before


def test_help_lists_formats_that_open(run, blkimg):
    """--help's last line lists the drivers that open, sorted, and none
    of the formats blkimg only recognises."""
    cp = run(blkimg, "--help")
    line = cp.stdout.splitlines()[-1]
    assert line.startswith("Supported formats: ")
    names = line.split()[2:]
    assert names == sorted(names)
    assert {"file", "http", "https", "nbd", "qcow2", "raw"} <= set(names)
    assert not {"qcow", "qed", "parallels", "bochs", "cloop"} & set(names)


def test_backing_format_refused(run, blkimg, qemu_img, images, tmp_path):
    """A qcow2 over a qed backing file: info shows the top (no backing
    opened); anything reading through the chain refuses, naming the
    backing file."""
    base = str(copy_image(images, "qed", tmp_path))
    top = str(tmp_path / "top.qcow2")
    run(qemu_img, "create", "-q", "-f", "qcow2", "-b", base, "-F", "qed",
        top, check=True)
    before = tree_hashes(tmp_path)
    cp = run(blkimg, "info", "--output=json", top, check=True)
    assert json.loads(cp.stdout)["backing-filename-format"] == "qed"
    inner = ("Could not open backing file: Could not open '%s': Image "
             "format 'qed' is not supported by blkimg yet" % base)
    out = str(tmp_path / "out.raw")
    for argv in ([blkimg, "convert", "-O", "raw", top, out],
                 [blkimg, "map", top]):
        cp = run(argv)
        assert cp.returncode == 1
        assert cp.stderr == "blkimg: Could not open '%s': %s\n" % (top, inner)
    cp = run(blkimg, "info", "--backing-chain", top)
    assert (cp.returncode, cp.stderr) == (1, refusal(base, "qed"))
    cp = run(blkimg, "create", "-f", "qcow2", "-b", base, "-F", "qed",
             str(tmp_path / "t2.qcow2"))
    assert cp.returncode == 1 and "'qed' is not supported" in cp.stderr
    assert tree_hashes(tmp_path) == before


# ------------------------------------------- edge cases decided by qemu-img

EDGE = {
    "empty": b"",
    "one-byte": b"x",
    "descriptor": b"# Disk DescriptorFile\nversion=1\nCID=fffffffe\n",
    "descriptor-crlf": b"version=3\r\n",
    "blank-lines": b"   \n  \r\nversion=2\n",
    "bare-lf-first": b"\nversion=1\n",
    "version-4": b"version=4\n",
    "no-line-end": b"version=1",
    "comment-only": b"# version=1\n",
    "text-first": b"createType=\"monolithicFlat\"\nversion=1\n",
    "spaces-then-text": b"   x\nversion=1\n",
    "version-at-512": b"#" + b"x" * 500 + b"\nversion=1\n",
    "version-past-512": b"#" + b"x" * 501 + b"\nversion=1\n",
    "long-comment": b"#" + b"x" * 600 + b"\nversion=1\n",
    "luks2": b"LUKS\xba\xbe\x00\x02" + bytes(1024),
    "qcow-version-0": b"QFI\xfb\x00\x00\x00\x00" + bytes(1024),
    "parallels-v1": b"WithoutFreeSpace\x01\x00\x00\x00" + bytes(1024),
    "vdi-swapped": bytes(64) + b"\xbe\xda\x10\x7f" + bytes(1024),
}


def qemu_verdict(run, qemu_img, path, *opts):
    """raw if qemu-img opens path as raw; else the driver named by its
    error (these files are not valid images of the format it probed)."""
    cp = run(qemu_img, "info", "--output=json", *opts, path)
    if cp.returncode == 0:
        return json.loads(cp.stdout)["format"]
    for key, fmt in (("VMDK", "vmdk"), ("UDIF", "dmg"), ("VDI", "vdi")):
        if key in cp.stderr:
            return fmt
    pytest.fail("qemu-img: " + cp.stderr)


@pytest.mark.parametrize("name", sorted(EDGE))
def test_edge_bytes(run, blkimg, qemu_img, tmp_path, name):
    path = tmp_path / name
    path.write_bytes(EDGE[name])
    want = qemu_verdict(run, qemu_img, str(path))
    cp = run(blkimg, "info", "--output=json", path)
    if want == "raw":
        assert cp.returncode == 0, cp.stderr
        assert json.loads(cp.stdout)["format"] == "raw"
    elif want in OPENS:  # refused by the driver, in qemu-img's words
        q = run(qemu_img, "info", "--output=json", path)
        assert cp.returncode == q.returncode == 1
        assert cp.stderr.split(": ", 1)[1] == q.stderr.split(": ", 1)[1]
    else:
        assert (cp.returncode, cp.stderr) == (1, refusal(path, want))
    assert path.read_bytes() == EDGE[name]


@pytest.mark.parametrize("content", ["raw-data", "empty", "one-byte",
                                     "valid-dmg"])
def test_dmg_is_decided_by_name(run, blkimg, qemu_img, tmp_path, content):
    """QEMU takes any non-empty file named *.dmg for dmg, and nothing else
    (a valid dmg named otherwise is raw); probing through --image-opts
    sees no name."""
    named = tmp_path / "disk.dmg"
    other = tmp_path / "disk.img"
    if content == "valid-dmg":
        craft_dmg(str(named))
    else:
        named.write_bytes({"raw-data": b"\x5a" * 4096, "empty": b"",
                           "one-byte": b"x"}[content])
    shutil.copyfile(named, other)
    for path in (named, other):
        want = qemu_verdict(run, qemu_img, str(path))
        cp = run(blkimg, "info", path)
        if want == "raw":
            assert cp.returncode == 0 and "file format: raw\n" in cp.stdout
        else:
            assert (cp.returncode, cp.stderr) == (1, refusal(path, want))
        opts = "file.filename=%s" % path
        assert qemu_verdict(run, qemu_img, opts, "--image-opts") == "raw"
        cp = run(blkimg, "info", "--image-opts", opts)
        assert cp.returncode == 0 and "file format: raw\n" in cp.stdout
    assert qemu_verdict(run, qemu_img, str(other)) == "raw"
    if content != "empty":
        assert qemu_verdict(run, qemu_img, str(named)) == "dmg"


# ------------------------------------------- block 0 of a probed raw image

SIGNATURES = [
    (0, b"KDMV"),
    (0, b"COWD"),
    (0, b"version=1\n"),
    (0, b"# Disk DescriptorFile\nversion=1\n"),
    (64, b"\x7f\x10\xda\xbe"),  # vdi
    (0, b"conectix"),
    (0, b"vhdxfile"),
    (0, b"QED\x00"),
    (0, b"QFI\xfb\x00\x00\x00\x01"),
    (0, b"LUKS\xba\xbe\x00\x01"),
    (0, b"WithoutFreeSpace\x02\x00\x00\x00"),
    (100, b"version=1\n"),  # not at the start of a line 0: allowed
    (600, b"KDMV"),  # past block 0: allowed
]


def test_probed_raw_block0_guard(run, mask_timing, blkimg_io, qemu_io,
                                 tmp_path):
    """Writes through a probed raw image that would make it probe as
    another format are refused as qemu-io refuses them (EPERM, nothing
    written); -f raw lifts the restriction for both."""
    base = b"\x41" * 4096
    for i, (off, sig) in enumerate(SIGNATURES):
        src = tmp_path / ("sig%d" % i)
        src.write_bytes(sig)
        cmd = "write -s %s %d %d" % (src, off, len(sig))
        outs = []
        for tool, name in ((qemu_io, "q.raw"), (blkimg_io, "b.raw")):
            img = tmp_path / name
            img.write_bytes(base)
            cp = run(tool, "-c", cmd, img)
            outs.append((cp.returncode, mask_timing(cp.stdout),
                         img.read_bytes()))
            if i == 0:
                cp = run(tool, "-f", "raw", "-c", cmd, img)
                assert cp.returncode == 0, (tool, cmd, cp.stdout)
                assert img.read_bytes()[:len(sig)] == sig
        assert outs[0] == outs[1], cmd
        refused = outs[0][1] == "write failed: Operation not permitted\n"
        assert refused == (off < 512 and off != 100), cmd
        assert (outs[0][2] == base) == refused
