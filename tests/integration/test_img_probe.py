# SPDX-License-Identifier: MIT
"""blkimg probe (no qemu-img twin): the protocol node's limits and where
they came from, page size, file system, sector sizes and cache mode, on
real storage; JSON keys exactly as documented; option errors."""
import json
import os

import pytest

from storage import any_storage, make, sector_sizes  # noqa: F401
from test_img_helpers import qemu, run

KEYS = ["request-alignment", "request-alignment-source", "min-mem-alignment",
        "opt-mem-alignment", "mem-alignment-source", "max-transfer",
        "opt-transfer", "page-size", "filesystem", "logical-sector-size",
        "physical-sector-size", "cache"]

HUMAN = ["request alignment", "request alignment source",
         "min mem alignment", "opt mem alignment", "mem alignment source",
         "max transfer", "opt transfer", "page size", "filesystem", "logical sector size",
         "physical sector size", "cache"]

PAGE = os.sysconf("SC_PAGESIZE")


def make_image(qemu_img, st):
    img = st.path("p.img")
    if not st.is_block_device:
        qemu(qemu_img, "create", "-q", "-f", "raw", img, "16M")
    return img


def probe_json(blkimg, *args):
    cp = run([blkimg, "probe", "--output=json"] + list(args))
    assert cp.returncode == 0, cp.stderr
    assert cp.stderr == ""
    return cp, json.loads(cp.stdout)


@pytest.mark.qemu
def test_probe_direct_on_real_storage(qemu_img, blkimg, any_storage):
    st = any_storage
    img = make_image(qemu_img, st)
    cp, j = probe_json(blkimg, "-t", "none", "-f", "raw", img)
    assert list(j) == KEYS
    logical, physical = sector_sizes(st)
    assert j["cache"] == "none"
    assert j["page-size"] == PAGE
    assert j["opt-mem-alignment"] >= PAGE
    assert j["opt-mem-alignment"] % j["min-mem-alignment"] == 0
    if st.kind == "tmpfs":
        assert j["filesystem"] == "tmpfs"
        assert j["request-alignment"] >= 1
    else:
        # what the kernel states, never a blind fallback
        assert j["request-alignment"] == logical, j
        assert j["request-alignment-source"] in ("statx", "BLKSSZGET",
                                                 "XFS_IOC_DIOINFO"), j
        assert j["logical-sector-size"] == logical
        assert j["physical-sector-size"] == physical
    if st.filesystem and st.kind != "loop-4k":
        assert j["filesystem"] == st.filesystem
    if st.kind == "loop-4k":
        assert j["filesystem"] == "block device"
    # the human form says the same, one "key: value" line each
    hp = run([blkimg, "probe", "-t", "none", "-f", "raw", img])
    assert hp.returncode == 0, hp.stderr
    lines = hp.stdout.splitlines()
    assert [l.split(": ")[0] for l in lines] == HUMAN
    human = dict(l.split(": ", 1) for l in lines)
    assert human["request alignment"] == str(j["request-alignment"])
    assert human["request alignment source"] == j["request-alignment-source"]
    assert human["filesystem"] == j["filesystem"]
    assert human["cache"] == "none"


@pytest.mark.qemu
def test_probe_buffered_needs_no_alignment(qemu_img, blkimg, tmp_path):
    qemu(qemu_img, "create", "-q", "-f", "raw", tmp_path / "a.raw", "1M")
    for extra in ([], ["-t", "writeback"], ["-t", "unsafe"]):
        _, j = probe_json(blkimg, *extra, str(tmp_path / "a.raw"))
        assert j["request-alignment"] == 1
        assert j["request-alignment-source"] == "buffered"
        assert j["min-mem-alignment"] == 1
        assert j["opt-mem-alignment"] >= PAGE
        assert j["cache"] == (extra[1] if extra else "writeback")


@pytest.mark.qemu
def test_probe_qcow2_shows_its_file(qemu_img, blkimg, tmp_path):
    qemu(qemu_img, "create", "-q", "-f", "qcow2", tmp_path / "a.qcow2", "1M")
    qemu(qemu_img, "create", "-q", "-f", "raw", tmp_path / "a.raw", "1M")
    _, jq = probe_json(blkimg, "-t", "none", str(tmp_path / "a.qcow2"))
    _, jr = probe_json(blkimg, "-t", "none", "-f", "raw",
                       str(tmp_path / "a.raw"))
    assert jq == jr
    _, ji = probe_json(blkimg, "-t", "none", "--image-opts",
                       "driver=qcow2,file.filename=%s" % (tmp_path /
                                                          "a.qcow2"))
    assert ji == jq
    _, jd = probe_json(blkimg, "--image-opts",
                       "driver=raw,file.filename=%s,cache.direct=on" %
                       (tmp_path / "a.raw"))
    assert jd["request-alignment"] == jr["request-alignment"]
    assert jd["cache"] == "none"


@pytest.mark.root
def test_probe_ramfs_refuses_direct(blkimg):
    with make("ramfs") as st:
        p = st.path("a.img")
        with open(p, "wb") as f:
            f.truncate(1 << 20)
        cp = run([blkimg, "probe", "-t", "none", "-f", "raw", p])
        assert cp.returncode == 1
        assert cp.stdout == ""
        lines = cp.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("blkimg: "), cp.stderr
        assert p in lines[0]
        ok = run([blkimg, "probe", "-t", "writeback", "-f", "raw", p])
        assert ok.returncode == 0, ok.stderr


@pytest.mark.parametrize("args,err", [
    ([], "blkimg: Expecting one image file name\n"
         "Try 'blkimg --help' for more information\n"),
    (["a", "b"], "blkimg: Expecting one image file name\n"
                 "Try 'blkimg --help' for more information\n"),
    (["--output=xml", "x"],
     "blkimg: --output must be used with human or json as argument.\n"),
    (["-t", "bogus", "x"], "blkimg: Invalid cache option: bogus\n"),
    (["-Z", "x"], "blkimg: unrecognized option '-Z'\n"
                  "Try 'blkimg --help' for more information\n"),
    (["-t"], "blkimg: missing argument for option '-t'\n"
             "Try 'blkimg --help' for more information\n"),
    (["nonexist.img"], "blkimg: Could not open 'nonexist.img': Could not "
                       "open 'nonexist.img': No such file or directory\n"),
])
def test_probe_errors(blkimg, tmp_path, args, err):
    cp = run([blkimg, "probe"] + args, cwd=tmp_path)
    assert (cp.returncode, cp.stdout, cp.stderr) == (1, "", err)
