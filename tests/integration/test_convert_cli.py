# SPDX-License-Identifier: MIT
"""convert's option-list corner cases against qemu-img 7.2: `-o help`
(with and without a target, with and without -O) and `-o` together with
-n. Output and exit code must be the same, and nothing may be created."""
import hashlib
import json
import os
import subprocess

import pytest

from test_convert_helpers import make_raw, same_output

pytestmark = pytest.mark.qemu

CASES = [  # (arguments, exit code)
    (["-O", "qcow2", "-o", "help"], 0),
    (["-O", "qcow2", "-o", "?"], 0),
    (["-O", "qcow2", "-o", "help", "SRC", "x"], 0),
    (["-O", "raw", "-o", "help"], 0),
    (["-o", "help", "SRC", "x"], 0),
    (["-O", "qcow2", "-o", "cluster_size=4k,help", "SRC"], 0),
    (["-O", "qcow2", "-o", "compat=1.1", "-o", "help", "SRC", "x"], 0),
    (["-O", "foo", "-o", "help"], 1),
    (["--target-image-opts", "-n", "-o", "help", "SRC", "x"], 1),
    (["-n", "-o", "cluster_size=4k", "-O", "qcow2", "SRC", "x"], 1),
    (["-n", "--target-is-zero", "-o", "preallocation=off", "SRC", "x"], 1),
]


@pytest.mark.parametrize("args,rc", CASES, ids=lambda a: " ".join(a)
                         if isinstance(a, list) else str(a))
def test_option_help_matches_qemu(qemu_img, blkimg, tmp_path, args, rc):
    src = make_raw(tmp_path / "src.raw")
    args = ["convert"] + [src if a == "SRC" else a for a in args]

    def clean():
        if os.path.exists(tmp_path / "x"):
            os.unlink(tmp_path / "x")

    rq, rb = same_output(qemu_img, blkimg, args, tmp_path, clean)
    assert rb == rq
    assert rb[0] == rc
    assert not os.path.exists(tmp_path / "x")
    if rc == 0:
        assert b"options:" in rb[1]


# ---------------------------------------------------------- -l snapshot


def _q(*args):
    subprocess.run([str(a) for a in args], check=True, capture_output=True)


@pytest.fixture
def snap_image(tmp_path):
    """A qcow2 with three states: snapshot s1 (1 MiB: pattern 1, a
    compressed cluster), s2 (grown to 2 MiB, pattern 2 and 3, zeroes
    over part of s1's data) and the active state, shrunk to 768 KiB."""
    img = tmp_path / "sn.qcow2"
    _q("qemu-img", "create", "-q", "-f", "qcow2", img, "1M")
    _q("qemu-io", "-c", "write -P 1 0 192k", "-c",
       "write -c -P 5 256k 64k", img)
    _q("qemu-img", "snapshot", "-c", "s1", img)
    _q("qemu-img", "resize", "-q", img, "2M")
    _q("qemu-io", "-c", "write -P 2 64k 64k", "-c", "write -P 3 1M 128k",
       "-c", "write -z 128k 64k", img)
    _q("qemu-img", "snapshot", "-c", "s2", img)
    _q("qemu-img", "resize", "-q", "--shrink", img, "768k")
    _q("qemu-io", "-c", "write -P 4 0 32k", img)
    return img


def _sha(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


@pytest.mark.parametrize("sel", ["s1", "1", "s2", "snapshot.name=s2",
                                 "snapshot.id=1,snapshot.name=s1"])
@pytest.mark.parametrize("fmt", ["raw", "qcow2"])
def test_convert_from_snapshot(qemu_img, blkimg, tmp_path, snap_image, sel,
                               fmt):
    before = _sha(snap_image)
    outs = {}
    for tool, name in ((qemu_img, "q.out"), (blkimg, "b.out")):
        cp = subprocess.run([tool, "convert", "-l", sel, "-O", fmt,
                             snap_image, tmp_path / name],
                            capture_output=True, text=True)
        assert cp.returncode == 0, cp.stderr
        assert cp.stdout == "" and cp.stderr == ""
        outs[tool] = tmp_path / name
    assert _sha(snap_image) == before
    # same guest bytes, same allocation map, same size (the image's)
    cp = subprocess.run([qemu_img, "compare", "-f", fmt, "-F", fmt,
                         outs[qemu_img], outs[blkimg]],
                        capture_output=True, text=True)
    assert cp.returncode == 0, cp.stdout
    maps = [subprocess.run([qemu_img, "map", "--output=json", "-f", fmt,
                            outs[t]], capture_output=True, text=True,
                           check=True).stdout for t in (qemu_img, blkimg)]
    if fmt == "qcow2":
        maps = [json.dumps([{k: v for k, v in e.items() if k != "offset"}
                            for e in json.loads(m)]) for m in maps]
        subprocess.run([qemu_img, "check", outs[blkimg]], check=True,
                       capture_output=True)
    assert maps[0] == maps[1]
    info = json.loads(subprocess.run(
        [qemu_img, "info", "--output=json", "-f", fmt, outs[blkimg]],
        capture_output=True, text=True, check=True).stdout)
    assert info["virtual-size"] == 768 * 1024
    # and the content is the snapshot's, not the active state's
    pat = "1" if sel in ("s1", "1") or "s1" in sel else "2"
    off = "0" if pat == "1" else "64k"
    subprocess.run(["qemu-io", "-f", fmt, "-c",
                    "read -P %s %s 32k" % (pat, off), outs[blkimg]],
                   check=True, capture_output=True)


SNAP_ERRORS = [
    ["-l", "snapshot.id=3"],
    ["-l", "nope"],
    ["-l", "foo=bar"],
    ["-l", "snapshot.id=1,snapshot.name=s2"],
    ["-l", "snapshot.foo=1"],
    ["-l", "snapshot.id=1,bar=2"],
    ["-l", "snapshot.id"],
    ["-l", "s1", "-f", "raw"],
    ["-s", "s1"],
    ["-l", "s1", "SRC"],
]


@pytest.mark.parametrize("args", SNAP_ERRORS, ids=" ".join)
def test_convert_snapshot_errors_match_qemu(qemu_img, blkimg, tmp_path,
                                            snap_image, args):
    before = _sha(snap_image)
    args = ["convert"] + [str(snap_image) if a == "SRC" else a
                          for a in args] + ["-O", "raw", snap_image, "x"]

    def clean():
        if os.path.exists(tmp_path / "x"):
            os.unlink(tmp_path / "x")

    rq, rb = same_output(qemu_img, blkimg, args, tmp_path, clean)
    assert rb == rq
    assert rb[0] == 1
    assert not os.path.exists(tmp_path / "x")
    assert _sha(snap_image) == before
