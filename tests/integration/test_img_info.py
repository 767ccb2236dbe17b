# SPDX-License-Identifier: MIT
"""blkimg info vs qemu-img 7.2 info on the same files: human and JSON
output (key order included), backing chains, snapshots, option parsing,
errors and exit codes."""
import json
import os

import pytest

from test_img_helpers import compare, qemu, qemu_io, run

pytestmark = pytest.mark.qemu


@pytest.fixture(scope="module")
def imgs(qemu_img, tmp_path_factory):
    d = tmp_path_factory.mktemp("img")
    qemu(qemu_img, "create", "-q", "-f", "raw", d / "a.raw", "1G")
    qemu(qemu_img, "create", "-q", "-f", "raw", d / "small.raw", "1536")
    qemu(qemu_img, "create", "-q", "-f", "raw", d / "empty.raw", "0")
    qemu(qemu_img, "create", "-q", "-f", "qcow2", d / "b.qcow2", "1G")
    qemu(qemu_img, "create", "-q", "-f", "qcow2", "-o",
         "compat=0.10,cluster_size=4k", d / "v2.qcow2", "3M")
    qemu(qemu_img, "create", "-q", "-f", "qcow2", "-o",
         "lazy_refcounts=on,refcount_bits=64,extended_l2=on,cluster_size=128k",
         d / "opts.qcow2", "100M")
    qemu(qemu_img, "create", "-q", "-f", "qcow2", "-b", "a.raw", "-F", "raw",
         d / "c.qcow2")
    qemu(qemu_img, "create", "-q", "-f", "qcow2", "-b", "c.qcow2", "-F",
         "qcow2", d / "d.qcow2", "2G")
    qemu(qemu_img, "create", "-q", "-f", "qcow2", "-u", "-b", "missing.raw",
         "-F", "raw", d / "orphan.qcow2", "1M")
    qemu(qemu_img, "create", "-q", "-f", "qcow2", "-b", str(d / "a.raw"),
         "-F", "raw", d / "abs.qcow2")
    qemu(qemu_img, "create", "-q", "-f", "qcow2", "-u", "-b", "sub/x.raw",
         "-F", "raw", d / "rel.qcow2", "1M")
    qemu_io("-f", "qcow2", "-c", "write -P 1 0 64k", "-c",
            "write -P 2 1M 128k", d / "b.qcow2")
    qemu_io("-f", "raw", "-c", "write -P 3 0 1M", d / "a.raw")
    qemu(qemu_img, "create", "-q", "-f", "qcow2", d / "snap.qcow2", "16M")
    qemu(qemu_img, "snapshot", "-c", "first", d / "snap.qcow2")
    qemu(qemu_img, "snapshot", "-c", "a longer snapshot name",
         d / "snap.qcow2")
    return d


CASES = [
    ["a.raw"],
    ["small.raw"],
    ["empty.raw"],
    ["b.qcow2"],
    ["v2.qcow2"],
    ["opts.qcow2"],
    ["c.qcow2"],
    ["d.qcow2"],
    ["orphan.qcow2"],
    ["abs.qcow2"],
    ["rel.qcow2"],
    ["snap.qcow2"],
    ["--output=json", "a.raw"],
    ["--output=json", "b.qcow2"],
    ["--output=json", "v2.qcow2"],
    ["--output=json", "opts.qcow2"],
    ["--output=json", "d.qcow2"],
    ["--output=json", "orphan.qcow2"],
    ["--output=json", "snap.qcow2"],
    ["--output=human", "b.qcow2"],
    ["--output", "json", "-U", "a.raw"],
    ["b.qcow2", "--force-share", "--output=json"],
    ["-f", "raw", "b.qcow2"],
    ["-f", "qcow2", "b.qcow2"],
    ["--format=qcow2", "b.qcow2"],
    ["--backing-chain", "d.qcow2"],
    ["--backing-chain", "--output=json", "d.qcow2"],
    ["--backing-chain", "--output=json", "a.raw"],
    ["--backing-chain", "orphan.qcow2"],
    ["--image-opts", "driver=qcow2,file.filename=b.qcow2"],
    ["--image-opts", "file.filename=b.qcow2"],
    ["--image-opts", "driver=raw,file.driver=file,file.filename=a.raw"],
    ["--image-opts", "--output=json",
     "driver=raw,file.filename=a.raw,cache.direct=on"],
    # errors
    ["nonexist"],
    [],
    ["a.raw", "b.qcow2"],
    ["--output=xml", "a.raw"],
    ["-f", "qcow2", "a.raw"],
    ["-f", "bogus", "a.raw"],
    ["-Z", "a.raw"],
    ["--nonsense", "a.raw"],
    ["-f"],
    ["a.raw", "--output"],
    ["--image-opts", "-f", "raw", "driver=raw,file.filename=a.raw"],
    ["--image-opts", "driver=raw,file.filename=nonexist"],
    ["--image-opts", "filename=a.raw"],
    ["--image-opts", "driver=raw,file.filename=a.raw,foo=bar"],
    ["--image-opts", "-U", "driver=raw,file.filename=a.raw,force-share=off"],
    ["--backing-chain", "--output=json", "orphan.qcow2"],
]


@pytest.mark.parametrize("args", CASES, ids=lambda a: " ".join(a) or "none")
def test_info_same_as_qemu(qemu_img, blkimg, imgs, args):
    compare(qemu_img, blkimg, ["info"] + args, cwd=imgs)


def test_info_absolute_paths(qemu_img, blkimg, imgs):
    for name in ("c.qcow2", "abs.qcow2", "rel.qcow2"):
        for extra in ([], ["--output=json"], ["--backing-chain"]):
            compare(qemu_img, blkimg, ["info"] + extra + [str(imgs / name)],
                    cwd="/")


@pytest.mark.parametrize("flags", [1, 2, 3])
def test_info_dirty_and_corrupt_flags(qemu_img, blkimg, tmp_path, flags):
    """Header flags show in both outputs as qemu shows them."""
    img = tmp_path / "b.qcow2"
    qemu(qemu_img, "create", "-q", "-f", "qcow2", img, "1M")
    with open(img, "r+b") as f:
        f.seek(72)  # incompatible features: dirty (bit 0), corrupt (bit 1)
        f.write(flags.to_bytes(8, "big"))
    compare(qemu_img, blkimg, ["info", "-U", "b.qcow2"], cwd=tmp_path)
    compare(qemu_img, blkimg, ["info", "-U", "--output=json", "b.qcow2"],
            cwd=tmp_path)


def test_info_backing_in_subdirectories(qemu_img, blkimg, tmp_path):
    """Relative backing names resolve against the overlay's directory (a
    colon after a slash is no protocol prefix)."""
    sub = tmp_path / "sub"
    (sub / "d").mkdir(parents=True)
    qemu(qemu_img, "create", "-q", "-f", "raw", sub / "d" / "a:b.raw", "1M")
    qemu(qemu_img, "create", "-q", "-f", "qcow2", "-b", "d/a:b.raw", "-F",
         "raw", sub / "mid.qcow2")
    qemu(qemu_img, "create", "-q", "-f", "qcow2", "-b", "mid.qcow2", "-F",
         "qcow2", sub / "top.qcow2")
    for extra in ([], ["--backing-chain"], ["--output=json"],
                  ["--backing-chain", "--output=json"]):
        compare(qemu_img, blkimg, ["info"] + extra + ["sub/top.qcow2"],
                cwd=tmp_path)


def test_info_backing_loop(qemu_img, blkimg, tmp_path):
    qemu(qemu_img, "create", "-q", "-f", "qcow2", tmp_path / "l1.qcow2", "1M")
    qemu(qemu_img, "create", "-q", "-f", "qcow2", "-b", "l1.qcow2", "-F",
         "qcow2", tmp_path / "l2.qcow2")
    qemu(qemu_img, "rebase", "-u", "-b", "l2.qcow2", "-F", "qcow2",
         tmp_path / "l1.qcow2")
    compare(qemu_img, blkimg, ["info", "--backing-chain", "l2.qcow2"],
            cwd=tmp_path)


def test_info_json_parses_and_matches(blkimg, imgs):
    cp = run([blkimg, "info", "--output=json", "snap.qcow2"], cwd=imgs)
    assert cp.returncode == 0
    j = json.loads(cp.stdout)
    assert j["format"] == "qcow2"
    assert [s["name"] for s in j["snapshots"]] == [
        "first", "a longer snapshot name"]


def test_info_refuses_object(blkimg, imgs):
    cp = run([blkimg, "info", "--object", "throttle-group,id=t", "a.raw"],
             cwd=imgs)
    assert (cp.returncode, cp.stdout) == (1, "")
    assert cp.stderr == "blkimg: --object is not supported\n"


@pytest.fixture(scope="module")
def special(qemu_img, tmp_path_factory):
    """qcow2 images with optional features, made by qemu-img."""
    d = tmp_path_factory.mktemp("special")
    qemu(qemu_img, "create", "-q", "-f", "qcow2", "-o",
         "compression_type=zstd", d / "zstd.qcow2", "1M")
    qemu(qemu_img, "create", "-q", "-f", "qcow2", "-o",
         "data_file=df.raw,data_file_raw=on", d / "datafile.qcow2", "1M",
         cwd=d)
    qemu(qemu_img, "create", "-q", "-f", "qcow2", d / "bitmaps.qcow2", "1M")
    qemu(qemu_img, "bitmap", "--add", d / "bitmaps.qcow2", "b0")
    qemu(qemu_img, "bitmap", "--add", "-g", "128k", d / "bitmaps.qcow2", "b1")
    qemu(qemu_img, "bitmap", "--disable", d / "bitmaps.qcow2", "b1")
    qemu(qemu_img, "create", "-q", "-f", "raw", d / "src.raw", "1M")
    qemu_io("-f", "raw", "-c", "write -P 1 0 512k", d / "src.raw")
    qemu(qemu_img, "convert", "-c", "-O", "qcow2", d / "src.raw",
         d / "compressed.qcow2")
    qemu(qemu_img, "create", "-q", "-f", "qcow2", "--object",
         "secret,id=s0,data=abc", "-o",
         "encrypt.format=aes,encrypt.key-secret=s0", d / "aes.qcow2", "1M")
    return d


SPECIAL = ["zstd.qcow2", "datafile.qcow2", "bitmaps.qcow2",
           "compressed.qcow2", "aes.qcow2"]


@pytest.mark.parametrize("out", ["human", "json"])
@pytest.mark.parametrize("name", SPECIAL)
def test_info_special_qcow2(qemu_img, blkimg, special, name, out):
    compare(qemu_img, blkimg, ["info", "--output=" + out, name], cwd=special)


def test_info_map_bench_on_an_image_qemu_holds(qemu_img, blkimg, tmp_path):
    """QEMU's image locks: a qcow2 open read-write in qemu-io is refused
    without -U, with qemu-img's two-line message; -U reads it."""
    import subprocess
    import time
    qemu(qemu_img, "create", "-q", "-f", "qcow2", tmp_path / "lk.qcow2",
         "1M")
    holder = subprocess.Popen(["qemu-io", "lk.qcow2"], cwd=tmp_path,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE)
    try:
        time.sleep(0.5)
        for args in (["info", "lk.qcow2"], ["map", "lk.qcow2"],
                     ["info", "-U", "lk.qcow2"],
                     ["map", "-U", "--output=json", "lk.qcow2"],
                     ["bench", "-c", "1", "lk.qcow2"],
                     ["bench", "-c", "1", "-w", "lk.qcow2"]):
            compare(qemu_img, blkimg, args, cwd=tmp_path,
                    mask=lambda s: s.split("Run completed")[0])
    finally:
        holder.communicate(b"quit\n", timeout=30)


def test_info_many_bitmaps(qemu_img, blkimg, tmp_path):
    """A bitmap list far longer than a fixed buffer shows whole, names
    with quotes and backslashes escaped as qemu escapes them."""
    img = tmp_path / "bm.qcow2"
    qemu(qemu_img, "create", "-q", "-f", "qcow2", img, "64M")
    for i in range(40):
        qemu(qemu_img, "bitmap", "--add", img,
             "bitmap-with-a-rather-long-name-number-%d" % i)
    qemu(qemu_img, "bitmap", "--add", "--disable", "-g", "1M", img,
         'quote"and\\back')
    for extra in ([], ["--output=json"]):
        cq, cb = compare(qemu_img, blkimg, ["info"] + extra + ["bm.qcow2"],
                         cwd=tmp_path)
    bitmaps = json.loads(cb.stdout)["format-specific"]["data"]["bitmaps"]
    assert len(bitmaps) == 41
    assert bitmaps[-1]["name"] == 'quote"and\\back'
