# SPDX-License-Identifier: MIT
"""vdi (VirtualBox) images against QEMU 7.2's qemu-img and qemu-io.

Images qemu-img makes (dynamic and static, written by qemu-io: patterns,
partial blocks, zeroes, runs of blocks) read in blkimg exactly as in QEMU:
`info` (text and JSON), `map --output=json`, `convert` to raw and qcow2,
blkimg-io reads with and without -t none. Damaged headers are refused
with qemu-img's one line; damaged block maps read as QEMU reads them.
"""
import json
import os
import shutil
import struct

import pytest

pytestmark = pytest.mark.qemu

MiB = 1 << 20

# qemu-io scripts run on fresh qemu-img images (name -> create options,
# size, qemu-io commands)
SCRIPTS = {
    "dynamic": ([], "8M", [
        "write -P 0xaa 2M 4096", "write -P 0xbb 512 1024",
        "write -z 5M 1M", "write -P 0xcc 6M 2M"]),
    "static": (["-o", "static=on"], "3M", ["write -P 0x11 1M 64k"]),
    "odd-size": ([], "3000k", ["write -P 0x22 2M 900k"]),
    "empty": ([], "0", []),
}


def qemu_image(run, qemu_img, qemu_io, d, name):
    opts, size, cmds = SCRIPTS[name]
    path = str(d / (name + ".vdi"))
    run(qemu_img, "create", "-q", "-f", "vdi", *opts, path, size, check=True)
    argv = [qemu_io, "-f", "vdi"]
    for c in cmds:
        argv += ["-c", c]
    if cmds:
        run(argv + [path], check=True)
    return path


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    from conftest import run_cmd
    d = tmp_path_factory.mktemp("vdi")
    return {n: qemu_image(run_cmd, "qemu-img", "qemu-io", d, n)
            for n in SCRIPTS}


def copy(src, tmp_path, name=None):
    dst = str(tmp_path / (name or os.path.basename(src)))
    shutil.copyfile(src, dst)
    return dst


def same_output(run, a, b, argv):
    """Runs argv (after the program) with blkimg a and qemu-img b; returns
    the two results (exit code, stdout, stderr with the program's name
    cut)."""
    out = []
    for prog, name in ((a, "blkimg: "), (b, "qemu-img: ")):
        cp = run(prog, *argv)
        out.append((cp.returncode, cp.stdout,
                    cp.stderr.replace(name, "PROG: ")))
    return out


# --------------------------------------------------------------- reading

@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_info_and_map_as_qemu(run, blkimg, qemu_img, images, tmp_path, name):
    path = copy(images[name], tmp_path)
    for argv in (["info", path], ["info", "--output=json", path],
                 ["info", "-f", "vdi", path],
                 ["map", "--output=json", path], ["map", path]):
        mine, theirs = same_output(run, blkimg, qemu_img, argv)
        assert mine == theirs, argv


@pytest.mark.parametrize("name", ["dynamic", "static"])
def test_qemu_io_info_and_map(run, blkimg_io, qemu_io, images, tmp_path,
                              name):
    path = copy(images[name], tmp_path)
    cmds = ["-c", "info", "-c", "map", "-c", "alloc 0 3M", "-c", "length"]
    mine = run(blkimg_io, "-r", *cmds, path)
    theirs = run(qemu_io, "-r", *cmds, path)
    assert (mine.returncode, mine.stdout) == (theirs.returncode,
                                              theirs.stdout)


def test_image_opts(run, blkimg, blkimg_io, images, tmp_path):
    path = copy(images["dynamic"], tmp_path)
    opts = "driver=vdi,file.filename=" + path
    cp = run(blkimg, "info", "--image-opts", opts, check=True)
    assert "file format: vdi\n" in cp.stdout
    cp = run(blkimg_io, "--image-opts", "-c", "write -P 0x42 3M 4k", "-c",
             "read -P 0x42 3M 4k", opts, check=True)
    assert "Pattern verification failed" not in cp.stdout


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_convert_as_qemu(run, blkimg, qemu_img, images, tmp_path, name):
    path = copy(images[name], tmp_path)
    for fmt in ("raw", "qcow2"):
        mine = str(tmp_path / ("b." + fmt))
        theirs = str(tmp_path / ("q." + fmt))
        run(blkimg, "convert", "-O", fmt, path, mine, check=True)
        run(qemu_img, "convert", "-O", fmt, path, theirs, check=True)
        if fmt == "raw":
            with open(mine, "rb") as f, open(theirs, "rb") as g:
                assert f.read() == g.read()
        cp = run(qemu_img, "compare", "-f", "vdi", "-F", fmt, path, mine)
        assert cp.returncode == 0, cp.stdout
        run(blkimg, "compare", path, theirs, check=True)


def test_reads_direct_io(run, blkimg_io, images, tmp_path):
    path = copy(images["dynamic"], tmp_path)
    for cache in ([], ["-t", "none"]):
        cp = run(blkimg_io, "-r", *cache, "-c", "read -P 0 0 512",
                 "-c", "read -P 0xbb 512 1024", "-c", "read -P 0 1536 2095616",
                 "-c", "read -P 0xaa 2M 4096", "-c", "read -P 0 3M 3M",
                 "-c", "read -P 0xcc 6M 2M", "-c", "read -P 0 2047k 1k",
                 path)
        assert cp.returncode == 0 and "Pattern verification failed" \
            not in cp.stdout, (cache, cp.stdout)


def io_calls(run, blkimg_io, path, cmd, rw=False):
    ro = [] if rw else ["-r"]
    cp = run(blkimg_io, "--stats", *ro, "-c", cmd, path, check=True)
    line = [l for l in (cp.stdout + cp.stderr).splitlines()
            if l.strip().startswith("io calls:")]
    return int(line[0].split(":")[1])


def test_contiguous_blocks_one_io(run, blkimg_io, images, tmp_path):
    """Blocks 5 to 7 sit in host blocks 2 to 4: one read; an unallocated
    block reads none."""
    path = copy(images["dynamic"], tmp_path)
    base = io_calls(run, blkimg_io, path, "read -P 0 1M 1M")
    assert io_calls(run, blkimg_io, path, "read 5M 3M") == base + 1
    assert io_calls(run, blkimg_io, path, "read 0 3M") == base + 2
    # in place: one write; two new blocks: one data write, header, map
    inplace = io_calls(run, blkimg_io, path, "write 0 512", rw=True)
    assert inplace == base + 1
    assert io_calls(run, blkimg_io, path, "write 3M 2M", rw=True) == \
        base + 3


# --------------------------------------------------------------- hostile

# (offset, struct format, value) written into a qemu-img image
HOSTILE = {
    "signature-f": (0x40, "<I", 0x12345678),
    "version": (0x44, "<I", 0x00010002),
    "major-version": (0x44, "<I", 0x00020001),
    "bmap-unaligned": (0x154, "<I", 0x201),
    "bmap-huge": (0x154, "<I", 0xffffff00),
    "data-unaligned": (0x158, "<I", 0x201),
    "sector-size": (0x168, "<I", 4096),
    "disk-size-room": (0x170, "<Q", 0x100000001),
    "disk-size-max": (0x170, "<Q", 0xfffffffffffff000),
    "block-size": (0x178, "<I", 4096),
    "few-blocks": (0x180, "<I", 7),
    "too-many-blocks": (0x180, "<I", 0x40000000),
    "all-blocks": (0x180, "<I", 0xffffffff),
    "link-uuid": (0x1a8, "<I", 1),
    "parent-uuid": (0x1b8, "<I", 1),
}


def damage(src, dst, off, fmt, value):
    shutil.copyfile(src, dst)
    with open(dst, "r+b") as f:
        f.seek(off)
        f.write(struct.pack(fmt, value))


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_header_refused(run, blkimg, blkimg_io, qemu_img, images,
                                tmp_path, case):
    path = str(tmp_path / "bad.vdi")
    damage(images["dynamic"], path, *HOSTILE[case])
    with open(path, "rb") as f:
        before = f.read()
    mine, theirs = same_output(run, blkimg, qemu_img,
                               ["info", "-f", "vdi", path])
    assert mine == theirs
    assert mine[0] == 1 and len(mine[2].splitlines()) == 1
    cp = run(blkimg_io, "-f", "vdi", "-c", "write 0 512", path)
    assert cp.returncode == 1 and len(cp.stderr.splitlines()) == 1
    with open(path, "rb") as f:
        assert f.read() == before


def test_short_file(run, blkimg, qemu_img, images, tmp_path):
    path = str(tmp_path / "short.vdi")
    with open(images["dynamic"], "rb") as f:
        head = f.read(300)
    with open(path, "wb") as f:
        f.write(head)
    mine, theirs = same_output(run, blkimg, qemu_img, ["info", path])
    assert mine == theirs and mine[0] == 1


def test_block_map_beyond_file_refused(run, blkimg, images, tmp_path):
    """QEMU reads a block map past the end of the file as zeroes; blkimg
    refuses it rather than allocate a map for blocks the file cannot
    hold."""
    path = str(tmp_path / "bad.vdi")
    damage(images["dynamic"], path, 0x154, "<I", 0x10000000)
    cp = run(blkimg, "info", path)
    assert cp.returncode == 1
    assert cp.stderr == ("blkimg: Could not open '%s': VDI block map (8 "
                         "entries at offset 0x10000000) lies beyond the end "
                         "of the file\n" % path)


def bad_map(src, dst, entries):
    """A copy of src with block map entries replaced ({block: entry})."""
    shutil.copyfile(src, dst)
    with open(dst, "r+b") as f:
        f.seek(0x154)
        bmap = struct.unpack("<I", f.read(4))[0]
        for block, entry in entries.items():
            f.seek(bmap + 4 * block)
            f.write(struct.pack("<I", entry))


# entries pointing past the file, far past it, shared and discarded
BAD_MAPS = {
    "past-end": {1: 7},
    "far": {1: 0x3ffffff0},
    "shared": {3: 2},
    "discarded": {2: 0xfffffffe},
    "data-offset": {},
}


@pytest.mark.parametrize("case", sorted(BAD_MAPS))
def test_bad_map_reads_as_qemu(run, blkimg, blkimg_io, qemu_img, images,
                               tmp_path, case):
    path = str(tmp_path / "bad.vdi")
    bad_map(images["dynamic"], path, BAD_MAPS[case])
    if case == "data-offset":
        damage(path, str(tmp_path / "t.vdi"), 0x158, "<I", 0x10000000)
        os.replace(str(tmp_path / "t.vdi"), path)
    with open(path, "rb") as f:
        before = f.read()
    mine, theirs = same_output(run, blkimg, qemu_img,
                               ["map", "--output=json", path])
    assert mine == theirs
    b, q = str(tmp_path / "b.raw"), str(tmp_path / "q.raw")
    run(blkimg, "convert", "-O", "raw", path, b, check=True)
    run(qemu_img, "convert", "-O", "raw", path, q, check=True)
    with open(b, "rb") as f, open(q, "rb") as g:
        assert f.read() == g.read()
    with open(path, "rb") as f:
        assert f.read() == before


# --------------------------------------------------------------- writing

# qemu-io commands run by qemu-io on one copy and blkimg-io on another:
# allocating writes (whole, partial, across blocks, past allocated ones),
# overwrites in place, zero writes (QEMU allocates them), discards (no-op)
WRITES = [
    "write -P 0xaa 2M 4096", "write -P 0xbb 512 1024", "write -z 5M 1M",
    "write -P 0xcc 6M 2M", "write -P 0xdd 1000k 100k",
    "write -P 0xee 2M 512", "write -P 0x5a 1536k 3M", "discard 0 64k",
    "write -z 6M 4k", "write -P 0x77 7M 1M",
]


def qemu_io_cmds(cmds):
    out = []
    for c in cmds:
        out += ["-c", c]
    return out


@pytest.mark.parametrize("name,cache", [("dynamic", []),
                                        ("dynamic", ["-t", "none"]),
                                        ("static", []),
                                        ("odd-size", [])])
def test_writes_as_qemu(run, blkimg, blkimg_io, qemu_img, qemu_io, tmp_path,
                        name, cache):
    """The same writes leave byte-identical files (header and map
    included): blocks appended in QEMU's order, whole blocks written."""
    opts = SCRIPTS[name][0]
    base = str(tmp_path / "base.vdi")
    run(qemu_img, "create", "-q", "-f", "vdi", *opts, base, "8M", check=True)
    if name == "odd-size":  # as VBoxManage convertfromraw makes them
        damage(base, base + ".t", 0x170, "<Q", 8 * MiB - 100)
        os.replace(base + ".t", base)
    mine = copy(base, tmp_path, "mine.vdi")
    theirs = copy(base, tmp_path, "theirs.vdi")
    run(qemu_io, "-f", "vdi", *qemu_io_cmds(WRITES), theirs, check=True)
    cp = run(blkimg_io, "-f", "vdi", *cache, *qemu_io_cmds(WRITES), mine)
    assert cp.returncode == 0 and "failed" not in cp.stdout, cp.stdout
    with open(mine, "rb") as f, open(theirs, "rb") as g:
        assert f.read() == g.read()
    cp = run(qemu_img, "check", mine)
    assert (cp.returncode, cp.stdout) == (0, "No errors were found on the "
                                             "image.\n")


def test_blkimg_writes_read_by_qemu(run, blkimg_io, qemu_img, qemu_io,
                                    tmp_path):
    """Concurrent allocating writes (aio) and direct I/O: qemu-io reads
    what blkimg wrote, qemu-img check is clean, after a reopen too."""
    path = str(tmp_path / "w.vdi")
    run(qemu_img, "create", "-q", "-f", "vdi", path, "16M", check=True)
    cp = run(blkimg_io, "-f", "vdi", "-c", "aio_write -P 1 0 1M",
             "-c", "aio_write -P 2 3M 2M", "-c", "aio_write -P 3 1536k 1M",
             "-c", "aio_flush", path)
    assert cp.returncode == 0, cp.stderr
    cp = run(blkimg_io, "-f", "vdi", "-t", "none",
             "-c", "write -P 7 7M 3000", "-c", "write -P 8 15M 1M",
             "-c", "write -P 9 3M 512", path)
    assert cp.returncode == 0, cp.stderr
    reads = ["read -P 1 0 1M", "read -P 0 1M 512k", "read -P 3 1536k 1M",
             "read -P 0 2560k 512k", "read -P 9 3M 512",
             "read -P 2 3146240 2096640", "read -P 0 5M 2M",
             "read -P 7 7M 3000", "read -P 0 7343032 1045576",
             "read -P 8 15M 1M"]
    for tool in (qemu_io, blkimg_io):
        cp = run(tool, "-r", "-f", "vdi", *qemu_io_cmds(reads), path)
        assert cp.returncode == 0, cp.stderr
        assert "Pattern verification failed" not in cp.stdout, tool
    cp = run(qemu_img, "check", path)
    assert cp.returncode == 0, cp.stdout + cp.stderr


@pytest.mark.parametrize("case", ["shared", "far", "data-offset"])
def test_bad_map_refuses_writes(run, blkimg_io, images, tmp_path, case):
    """A map whose next block would be shared, or out of range, takes no
    write at all (QEMU's would overwrite data or the map)."""
    path = str(tmp_path / "bad.vdi")
    bad_map(images["dynamic"], path, BAD_MAPS[case])
    if case == "data-offset":  # the data area overlaps the block map
        damage(path, str(tmp_path / "t.vdi"), 0x158, "<I", 0x200)
        os.replace(str(tmp_path / "t.vdi"), path)
    with open(path, "rb") as f:
        before = f.read()
    for off in ("0", "1M", "4M"):
        cp = run(blkimg_io, "-f", "vdi", "-c", "write -P 1 %s 512" % off,
                 path)
        assert cp.stdout == "write failed: Input/output error\n"
    with open(path, "rb") as f:
        assert f.read() == before


# -------------------------------------------------------------- creating

UUIDS = slice(0x188, 0x1a8)  # image and last-snapshot UUIDs: random


def without_uuids(data):
    return data[:UUIDS.start] + data[UUIDS.stop:]


# (size, extra arguments): the files and the output must be qemu-img's
CREATES = [
    ("3M", []), ("3M", ["-o", "static=on"]), ("0", []),
    ("1000", []), ("3000k", []), ("129M", []),
    ("5M", ["-o", "static=off,preallocation=full"]),
    ("5M", ["-o", "preallocation=falloc"]), ("1M", ["-o", "static"]),
    ("2M", ["-o", "static=on,nocow=on"]), (None, ["-o", "size=4M"]),
    # refused
    ("1M", ["-o", "static=maybe"]), ("1M", ["-o", "cluster_size=1M"]),
    ("1M", ["-b", "base.vdi", "-F", "vdi"]), ("600T", []), (None, []),
    ("5M", ["-o", "preallocation=metadata"]),
]


@pytest.mark.parametrize("size,args", CREATES,
                         ids=["%s%s" % (c[0], "".join(c[1])) for c in CREATES])
def test_create_as_qemu(run, blkimg, qemu_img, tmp_path, size, args):
    outs = []
    for prog, name in ((qemu_img, "q.vdi"), (blkimg, "b.vdi")):
        path = str(tmp_path / name)
        argv = [prog, "create", "-f", "vdi"] + args + [path]
        cp = run(argv + ([size] if size else []), cwd=str(tmp_path))
        text = (cp.stdout + cp.stderr).replace(path, "X")
        text = text.replace("qemu-img: ", "").replace("blkimg: ", "")
        content = None
        if cp.returncode == 0:
            with open(path, "rb") as f:
                content = without_uuids(f.read())
        outs.append((cp.returncode, text, content))
    assert outs[0] == outs[1]
    if outs[0][0] == 0:
        path = str(tmp_path / "b.vdi")
        cp = run(qemu_img, "check", path)
        assert cp.returncode == 0, cp.stdout + cp.stderr
        with open(path, "rb") as f:
            uuids = f.read()[UUIDS]
        assert uuids[7] >> 4 == 4 and uuids[8] >> 6 == 2  # version 4


def test_create_help_as_qemu(run, blkimg, qemu_img):
    mine, theirs = same_output(run, blkimg, qemu_img,
                               ["create", "-f", "vdi", "-o", "help"])
    assert mine == theirs


@pytest.mark.parametrize("args", [[], ["-o", "static=on"]])
def test_convert_to_vdi_as_qemu(run, blkimg, qemu_img, qemu_io, tmp_path,
                                args):
    src = str(tmp_path / "src.qcow2")
    run(qemu_img, "create", "-q", "-f", "qcow2", src, "10M", check=True)
    run(qemu_io, "-c", "write -P 1 0 100k", "-c", "write -P 2 3M 1500k",
        "-c", "write -z 6M 1M", "-c", "write -P 3 9M 4k", src, check=True)
    q, b = str(tmp_path / "q.vdi"), str(tmp_path / "b.vdi")
    run(qemu_img, "convert", "-O", "vdi", *args, src, q, check=True)
    run(blkimg, "convert", "-O", "vdi", *args, src, b, check=True)
    with open(q, "rb") as f, open(b, "rb") as g:
        assert without_uuids(f.read()) == without_uuids(g.read())
    d = str(tmp_path / "d.vdi")
    run(blkimg, "convert", "-t", "none", "-O", "vdi", *args, src, d,
        check=True)
    cp = run(qemu_img, "compare", src, d)
    assert cp.returncode == 0, cp.stdout
    assert run(qemu_img, "check", d).returncode == 0


def test_no_measure_no_resize(run, blkimg, qemu_img, images, tmp_path):
    """qemu-img 7.2 measures no vdi and resizes none: neither does
    blkimg, in the same words."""
    path = copy(images["dynamic"], tmp_path)
    for argv in (["measure", "-O", "vdi", "--size", "10M"],
                 ["measure", "-O", "vdi", path], ["resize", path, "16M"],
                 ["resize", "-f", "vdi", "--shrink", path, "4M"]):
        mine, theirs = same_output(run, blkimg, qemu_img, argv)
        assert mine == theirs and mine[0] == 1, argv


# ---------------------------------------------------------------- check

# block map damage check must find: {block: entry}, and a header count
CHECKS = {
    "clean": ({}, None),
    "past-end": ({1: 7}, None),
    "far": ({1: 0x3ffffff0}, None),
    "shared": ({3: 2, 4: 2}, None),
    "discarded": ({2: 0xfffffffe}, 4),
    "count": ({}, 9),
    "everything": ({0: 5, 1: 0xfffffffd, 4: 5}, 0),
}


@pytest.mark.parametrize("case", sorted(CHECKS))
def test_check_as_qemu(run, blkimg, qemu_img, images, tmp_path, case):
    entries, count = CHECKS[case]
    path = str(tmp_path / "c.vdi")
    bad_map(images["dynamic"], path, entries)
    if count is not None:
        damage(path, str(tmp_path / "t.vdi"), 0x184, "<I", count)
        os.replace(str(tmp_path / "t.vdi"), path)
    for opts in ([], ["--output=json"], ["-r", "all"], ["-r", "leaks"],
                 ["-q"]):
        mine, theirs = same_output(run, blkimg, qemu_img,
                                   ["check"] + opts + [path])
        assert mine == theirs, opts
    assert mine[0] == (0 if case in ("clean", "discarded") else 2)


# fields QEMU does not check, or rounds: images that still open
ACCEPTED = {
    "image-type": (0x4c, "<I", 3),
    "header-size": (0x48, "<I", 0),
    "odd-disk-size": (0x170, "<Q", 8 * MiB - 100),
    "free-text": (0, "<Q", 0x4141414141414141),
}


@pytest.mark.parametrize("case", sorted(ACCEPTED))
def test_accepted_fields_as_qemu(run, blkimg, qemu_img, images, tmp_path,
                                 case):
    path = str(tmp_path / "odd.vdi")
    damage(images["dynamic"], path, *ACCEPTED[case])
    for argv in (["info", "--output=json", path],
                 ["map", "--output=json", path], ["check", path]):
        mine, theirs = same_output(run, blkimg, qemu_img, argv)
        assert mine == theirs and mine[0] == 0, argv
    b, q = str(tmp_path / "b.raw"), str(tmp_path / "q.raw")
    run(blkimg, "convert", "-O", "raw", path, b, check=True)
    run(qemu_img, "convert", "-O", "raw", path, q, check=True)
    with open(b, "rb") as f, open(q, "rb") as g:
        assert f.read() == g.read()


def test_backing_file_and_commit(run, blkimg, qemu_img, qemu_io, images,
                                 tmp_path):
    """A qcow2 overlay over a vdi reads and maps as in QEMU; committing
    it writes into the vdi, which qemu-img then finds clean."""
    base = copy(images["dynamic"], tmp_path)
    top = str(tmp_path / "top.qcow2")
    run(qemu_img, "create", "-q", "-f", "qcow2", "-b", base, "-F", "vdi",
        top, check=True)
    run(qemu_io, "-c", "write -P 0x99 1M 64k", "-c", "write -P 0x98 5M 1k",
        top, check=True)
    for argv in (["map", "--output=json", top],
                 ["info", "--backing-chain", top]):
        mine, theirs = same_output(run, blkimg, qemu_img, argv)
        assert mine == theirs, argv
    b, q = str(tmp_path / "b.raw"), str(tmp_path / "q.raw")
    run(blkimg, "convert", "-O", "raw", top, b, check=True)
    run(qemu_img, "convert", "-O", "raw", top, q, check=True)
    with open(b, "rb") as f, open(q, "rb") as g:
        assert f.read() == g.read()
    run(blkimg, "commit", top, check=True)
    assert run(qemu_img, "check", base).returncode == 0
    cp = run(qemu_img, "compare", "-f", "vdi", "-F", "raw", base, q)
    assert cp.returncode == 0, cp.stdout
