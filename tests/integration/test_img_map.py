# SPDX-License-Identifier: MIT
"""blkimg map vs qemu-img 7.2 map on the same files: human and JSON output
(7.2's keys and layout), backing chains, --start-offset/--max-length,
errors and exit codes."""
import json
import os

import pytest

from test_img_helpers import compare, qemu, qemu_io, run

pytestmark = pytest.mark.qemu


@pytest.fixture(scope="module")
def imgs(qemu_img, tmp_path_factory):
    d = tmp_path_factory.mktemp("img")
    qemu(qemu_img, "create", "-q", "-f", "raw", d / "a.raw", "64M")
    qemu_io("-f", "raw", "-c", "write -P 3 1M 1M", "-c", "write -P 4 5M 4k",
            "-c", "write -P 5 63M 1M", d / "a.raw")
    qemu(qemu_img, "create", "-q", "-f", "raw", d / "hole.raw", "1M")
    with open(d / "hole.raw", "r+b") as f:  # block 0 a hole
        f.truncate(0)
        f.truncate(1 << 20)
    qemu(qemu_img, "create", "-q", "-f", "raw", d / "empty.raw", "0")
    qemu(qemu_img, "create", "-q", "-f", "raw", d / "odd.raw", "1000")
    qemu(qemu_img, "create", "-q", "-f", "qcow2", d / "b.qcow2", "1G")
    qemu_io("-f", "qcow2", "-c", "write -P 1 0 64k", "-c",
            "write -P 2 1M 128k", "-c", "write -z 2M 64k", "-c",
            "write -P 7 3M 64k", "-c", "write -z 3M 4k", d / "b.qcow2")
    qemu(qemu_img, "create", "-q", "-f", "qcow2", "-b", "a.raw", "-F", "raw",
         d / "c.qcow2")
    qemu_io("-f", "qcow2", "-c", "write -P 9 1M 64k", "-c",
            "write -z 8M 1M", d / "c.qcow2")
    qemu(qemu_img, "create", "-q", "-f", "qcow2", "-b", "c.qcow2", "-F",
         "qcow2", d / "d.qcow2", "80M")
    qemu_io("-f", "qcow2", "-c", "write -P 8 2M 64k", d / "d.qcow2")
    qemu(qemu_img, "create", "-q", "-f", "qcow2", "-o", "cluster_size=4k",
         d / "small.qcow2", "1M")
    qemu_io("-f", "qcow2", "-c", "write -P 1 0 12k", "-c", "write -P 2 20k 4k",
            d / "small.qcow2")
    return d


IMAGES = ["a.raw", "hole.raw", "empty.raw", "odd.raw", "b.qcow2", "c.qcow2",
          "d.qcow2", "small.qcow2"]

CASES = []
for _img in IMAGES:
    CASES.append([_img])
    CASES.append(["--output=json", _img])
CASES += [
    ["-f", "raw", "b.qcow2"],
    ["--output", "json", "-f", "raw", "b.qcow2"],
    ["-U", "--output=json", "c.qcow2"],
    ["c.qcow2", "--force-share"],
    ["--start-offset=1M", "--max-length=100k", "--output=json", "b.qcow2"],
    ["--start-offset", "1M", "--max-length", "100k", "b.qcow2"],
    ["--start-offset=1.5k", "--max-length=0x1000", "a.raw"],
    ["--start-offset=2G", "a.raw"],
    ["--start-offset=2G", "--output=json", "a.raw"],
    ["--max-length=0", "--output=json", "a.raw"],
    ["--start-offset=5M", "--output=json", "d.qcow2"],
    ["--start-offset=3000", "--max-length=5000", "--output=json",
     "small.qcow2"],
    ["--image-opts", "driver=qcow2,file.filename=d.qcow2"],
    ["--image-opts", "--output=json", "file.filename=c.qcow2"],
    # errors
    ["nonexist"],
    [],
    ["a.raw", "b.qcow2"],
    ["--output=foo", "a.raw"],
    ["-f", "qcow2", "a.raw"],
    ["--start-offset=abc", "a.raw"],
    ["--max-length=-1", "a.raw"],
    ["--start-offset=9E", "a.raw"],
    ["--max-length=1x", "a.raw"],
    ["-s", "1", "a.raw"],
    ["--start-offset"],
    ["-Z", "a.raw"],
]


@pytest.mark.parametrize("args", CASES, ids=lambda a: " ".join(a) or "none")
def test_map_same_as_qemu(qemu_img, blkimg, imgs, args):
    compare(qemu_img, blkimg, ["map"] + args, cwd=imgs)


def test_map_absolute_path(qemu_img, blkimg, imgs):
    for extra in ([], ["--output=json"]):
        compare(qemu_img, blkimg, ["map"] + extra + [str(imgs / "d.qcow2")],
                cwd="/")


def test_map_json_is_json(blkimg, imgs):
    cp = run([blkimg, "map", "--output=json", "d.qcow2"], cwd=imgs)
    assert cp.returncode == 0
    entries = json.loads(cp.stdout)
    assert entries[0]["start"] == 0
    total = sum(e["length"] for e in entries)
    assert total == 80 << 20
    for e in entries:
        assert list(e)[:6] == ["start", "length", "depth", "present", "zero",
                               "data"]


@pytest.mark.parametrize("out", ["human", "json"])
def test_map_compressed_and_data_file(qemu_img, blkimg, tmp_path, out):
    """Compressed clusters (the human form refuses them, as qemu) and an
    external raw data file."""
    d = tmp_path
    qemu(qemu_img, "create", "-q", "-f", "raw", d / "src.raw", "1M")
    qemu_io("-f", "raw", "-c", "write -P 1 0 512k", d / "src.raw")
    qemu(qemu_img, "convert", "-c", "-O", "qcow2", d / "src.raw",
         d / "compressed.qcow2")
    qemu(qemu_img, "create", "-q", "-f", "qcow2", "-o",
         "data_file=df.raw,data_file_raw=on", d / "datafile.qcow2", "1M",
         cwd=d)
    for name in ("compressed.qcow2", "datafile.qcow2"):
        compare(qemu_img, blkimg, ["map", "--output=" + out, name], cwd=d)


@pytest.mark.loop
def test_info_and_map_on_a_block_device(qemu_img, blkimg):
    """A 4096-byte-sector loop device as a raw image."""
    from storage import make
    with make("loop-4k") as st:
        dev = st.path()
        qemu_io("-f", "raw", "-t", "none", "-c", "write -P 1 0 64k", dev)
        for args in (["info"], ["info", "--output=json"], ["map"],
                     ["map", "--output=json"]):
            compare(qemu_img, blkimg, args + ["-f", "raw", dev], cwd="/")


@pytest.mark.root
@pytest.mark.parametrize("kind", ["disk", "ext4-4k", "xfs-4k", "tmpfs"])
def test_map_on_real_storage(qemu_img, blkimg, kind):
    """Holes and data as each file system reports them (SEEK_DATA /
    SEEK_HOLE granularity differs), raw and qcow2, as qemu-img sees them."""
    from storage import make
    with make(kind) as st:
        d = st.dir
        qemu(qemu_img, "create", "-q", "-f", "raw", os.path.join(d, "h.raw"),
             "8M")
        with open(os.path.join(d, "h.raw"), "r+b") as f:
            f.truncate(0)  # block 0 a hole, then islands of data
            f.truncate(8 << 20)
            for off, n in ((4096, 512), (1 << 20, 70000), (7 << 20, 4096)):
                f.seek(off)
                f.write(b"\x55" * n)
        qemu(qemu_img, "create", "-q", "-f", "qcow2",
             os.path.join(d, "q.qcow2"), "8M")
        qemu_io("-f", "qcow2", "-c", "write -P 1 64k 64k", "-c",
                "write -z 1M 64k", os.path.join(d, "q.qcow2"))
        for name, fmt in (("h.raw", "raw"), ("q.qcow2", "qcow2")):
            for args in (["map"], ["map", "--output=json"]):
                compare(qemu_img, blkimg, args + ["-f", fmt, name], cwd=d)
