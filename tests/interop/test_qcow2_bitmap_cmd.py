# SPDX-License-Identifier: MIT
"""blkimg bitmap against qemu-img bitmap (7.2).

Each case runs the same command line with qemu-img on one copy of an
image and with blkimg on another: stdout, stderr (names replaced) and the
exit code must be the same; afterwards both copies must hold the same
bitmaps (qemu-img info, names, flags, granularity and every bit as the
file holds them, cross-checked with qemu-nbd's dirty-bitmap export) and
qemu-img check must find nothing. A command that fails at its first
action must leave the file byte for byte as it was. Also convert
--bitmaps (and --skip-broken-bitmaps) against qemu-img convert."""
import json
import os
import re
import shutil
import subprocess
import time

import pytest

from storage import fill_up

from test_qcow2_bitmaps import (compare_images, info_bitmaps, make_image,
                                session, set_flags, sha)

# Long (hundreds of qemu-img runs): the normal build runs it, the sanitizer
# build skips it (`slow`) to keep `make check` short.
pytestmark = [pytest.mark.qemu, pytest.mark.slow]


def both(run, qemu_img, blkimg, tmp_path, template, args, src=None):
    """Runs bitmap args on a copy each; returns (qemu copy, blkimg copy,
    qemu result)."""
    q = str(tmp_path / "q.qcow2")
    m = str(tmp_path / "m.qcow2")
    shutil.copy(template, q)
    shutil.copy(template, m)
    res = []
    for tool, img in ((qemu_img, q), (blkimg, m)):
        argv = [a.replace("IMG", img) for a in args]
        cp = run(tool, "bitmap", *argv)
        out = (cp.stdout + "|" + cp.stderr).replace(img, "IMG")
        base = os.path.basename(tool)
        out = out.replace(base + ":", "TOOL:")
        out = out.replace("'%s --help'" % base, "'TOOL --help'")
        # QEMU names its node "#blockNNN", blkimg the file
        out = re.sub(r"#block[0-9]+", "IMG", out)
        res.append((cp.returncode, out))
    assert res[1] == res[0], (args, res)
    return q, m, res[0]


def template(run, qemu_img, qemu_io, tmp_path, bitmaps, size="4M", opts="",
             writes=("write 0 4k", "write 1M 64k", "write 3M 1k")):
    t = str(tmp_path / "t.qcow2")
    make_image(run, qemu_img, t, size, bitmaps, opts)
    if writes:
        session(run, qemu_io, t, list(writes))
    return t


CASES = {
    # args (IMG: the image), bitmaps of the template
    "add": (["--add", "IMG", "n"], [("b0",)]),
    "add-first": (["--add", "IMG", "n"], []),
    "add-granularity": (["--add", "-g", "4k", "IMG", "n"], [("b0",)]),
    "add-g-512": (["--add", "-g", "512", "IMG", "n"], []),
    "add-g-2G": (["--add", "-g", "2G", "IMG", "n"], []),
    "add-g-0": (["--add", "-g", "0", "IMG", "n"], []),
    "add-disabled": (["--add", "--disable", "IMG", "n"], [("b0",)]),
    "add-twice": (["--add", "--add", "IMG", "n"], [("b0",)]),
    "remove": (["--remove", "IMG", "b0"], [("b0",), ("b1", "4k")]),
    "remove-last": (["--remove", "IMG", "b0"], [("b0",)]),
    "remove-add": (["--remove", "--add", "IMG", "b0"], [("b0", "512")]),
    "clear": (["--clear", "IMG", "b1"], [("b0",), ("b1", "4k")]),
    "disable": (["--disable", "IMG", "b0"], [("b0",)]),
    "enable": (["--enable", "IMG", "d"], [("b0",), ("d", "", True)]),
    "disable-twice": (["--disable", "--disable", "IMG", "b0"], [("b0",)]),
    "merge": (["--merge", "b1", "IMG", "b0"], [("b0",), ("b1", "512")]),
    "merge-coarse": (["--merge", "c", "IMG", "b0"],
                     [("b0", "4k"), ("c", "2M")]),
    "merge-two": (["--merge", "b1", "--merge", "c", "IMG", "b0"],
                  [("b0",), ("b1", "512"), ("c", "1M")]),
    "merge-into-disabled": (["--merge", "b0", "IMG", "d"],
                            [("b0",), ("d", "8k", True)]),
    "merge-into-new": (["--add", "-g", "1M", "--merge", "b0", "--clear",
                        "--merge", "b0", "IMG", "n"], [("b0", "4k")]),
    "many-in-order": (["--add", "--disable", "--enable", "--clear",
                       "--remove", "--add", "IMG", "n"], [("b0",)]),
    "small-clusters": (["--add", "--merge", "b0", "IMG", "n"],
                       [("b0", "512")], "cluster_size=512"),
    # errors
    "no-action": (["IMG", "b0"], [("b0",)]),
    "no-name": (["--add", "IMG"], [("b0",)]),
    "extra-arg": (["--add", "IMG", "a", "b"], [("b0",)]),
    "exists": (["--add", "IMG", "b0"], [("b0",)]),
    "empty-name": (["--add", "IMG", ""], [("b0",)]),
    "long-name": (["--add", "IMG", "x" * 1024], [("b0",)]),
    "name-1023": (["--add", "IMG", "y" * 1023], [("b0",)]),
    "g-not-pow2": (["--add", "-g", "1000", "IMG", "n"], [("b0",)]),
    "g-too-small": (["--add", "-g", "256", "IMG", "n"], [("b0",)]),
    "g-too-big": (["--add", "-g", "4G", "IMG", "n"], [("b0",)]),
    "g-garbage": (["--add", "-g", "abc", "IMG", "n"], [("b0",)]),
    "g-without-add": (["--remove", "-g", "64k", "IMG", "b0"], [("b0",)]),
    "b-without-merge": (["--add", "-b", "x", "IMG", "n"], [("b0",)]),
    "F-without-b": (["--merge", "b0", "-F", "qcow2", "IMG", "n"],
                    [("b0",)]),
    "remove-missing": (["--remove", "IMG", "nope"], [("b0",)]),
    "clear-missing": (["--clear", "IMG", "nope"], [("b0",)]),
    "enable-missing": (["--enable", "IMG", "nope"], []),
    "disable-missing": (["--disable", "IMG", "nope"], [("b0",)]),
    "merge-missing-src": (["--merge", "nope", "IMG", "b0"], [("b0",)]),
    "merge-missing-dst": (["--merge", "b0", "IMG", "nope"], [("b0",)]),
    "fail-midway": (["--add", "--clear", "--add", "IMG", "n"], [("b0",)]),
    "unknown-option": (["--bogus", "IMG", "n"], [("b0",)]),
    "v2-image": (["--add", "IMG", "n"], [], "compat=0.10"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_like_qemu_img(run, qemu_img, qemu_io, blkimg, tmp_path, name):
    args, bitmaps = CASES[name][:2]
    opts = CASES[name][2] if len(CASES[name]) > 2 else ""
    t = template(run, qemu_img, qemu_io, tmp_path, bitmaps, opts=opts)
    before = sha(t)
    q, m, (rc, out) = both(run, qemu_img, blkimg, tmp_path, t, args)
    if "compat=0.10" in opts:
        assert sha(m) == before
        return
    compare_images(run, qemu_img, q, m)
    if rc != 0 and name != "fail-midway" and name != "add-twice":
        assert sha(m) == before, name


def test_in_use_bitmap(run, qemu_img, qemu_io, blkimg, tmp_path):
    t = template(run, qemu_img, qemu_io, tmp_path,
                 [("stale",), ("good", "4k")])
    set_flags(t, "stale", 3)  # in use + auto
    before = sha(t)
    for args in (["--clear", "IMG", "stale"], ["--enable", "IMG", "stale"],
                 ["--disable", "IMG", "stale"],
                 ["--merge", "stale", "IMG", "good"],
                 ["--merge", "good", "IMG", "stale"]):
        q, m, (rc, out) = both(run, qemu_img, blkimg, tmp_path, t, args)
        assert rc == 1 and "inconsistent" in out, out
        assert sha(m) == before, args
    # removing it is allowed; its clusters are given back
    q, m, (rc, out) = both(run, qemu_img, blkimg, tmp_path, t,
                           ["--remove", "IMG", "stale"])
    assert rc == 0, out
    compare_images(run, qemu_img, q, m)


def test_merge_from_other_image(run, qemu_img, qemu_io, blkimg, tmp_path):
    o = str(tmp_path / "o.qcow2")
    make_image(run, qemu_img, o, "4M", [("ob", "512")])
    session(run, qemu_io, o, ["write 2M 3k", "write 5k 1"])
    osha = sha(o)
    t = template(run, qemu_img, qemu_io, tmp_path, [("b0",)])
    q, m, (rc, out) = both(run, qemu_img, blkimg, tmp_path, t,
                           ["--merge", "ob", "-b", o, "IMG", "b0"])
    assert rc == 0, out
    compare_images(run, qemu_img, q, m)
    assert sha(o) == osha
    before = sha(t)
    for extra in (["-F", "qcow2"], ["-F", "raw"]):
        for src in ("ob", "nope"):
            q, m, (rc, out) = both(
                run, qemu_img, blkimg, tmp_path, t,
                ["--merge", src, "-b", o, *extra, "IMG", "b0"])
            if rc:
                assert sha(m) == before
            else:
                compare_images(run, qemu_img, q, m)
    # a raw source has no bitmaps; a missing one fails to open
    r = str(tmp_path / "r.img")
    run(qemu_img, "create", "-q", "-f", "raw", r, "4M", check=True)
    for src in (r, str(tmp_path / "missing.qcow2")):
        q, m, (rc, out) = both(run, qemu_img, blkimg, tmp_path, t,
                               ["--merge", "ob", "-b", src, "IMG", "b0"])
        assert rc == 1
        assert sha(m) == before


def test_raw_image(run, qemu_img, blkimg, tmp_path):
    r = str(tmp_path / "r.img")
    run(qemu_img, "create", "-q", "-f", "raw", r, "1M", check=True)
    before = sha(r)
    for args in (["--remove", "-f", "raw", "IMG", "x"],
                 ["--merge", "y", "-f", "raw", "IMG", "x"]):
        q, m, (rc, out) = both(run, qemu_img, blkimg, tmp_path, r, args)
        assert rc == 1 and sha(m) == before
    # the error of --add names QEMU's node ("#blockNNN"): compare the rest
    for tool in (qemu_img, blkimg):
        img = str(tmp_path / "c.img")
        shutil.copy(r, img)
        cp = run(tool, "bitmap", "--add", "-f", "raw", img, "x")
        assert cp.returncode == 1
        assert "Operation add on bitmap x failed: Can't store persistent " \
            "bitmaps to " in cp.stderr
        assert cp.stderr.endswith(": Operation not supported\n")
        assert sha(img) == before


def nbd_dirty(run, qemu_img, img, name, tmp_path):
    """Dirty byte ranges of bitmap name as qemu-nbd exports them."""
    sock = str(tmp_path / ("s-%s.sock" % name))
    p = subprocess.Popen(["qemu-nbd", "-r", "-f", "qcow2", "-B", name,
                          "--socket=" + sock, img],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        for _ in range(100):
            if os.path.exists(sock):
                break
            time.sleep(0.05)
        opts = ("driver=nbd,server.type=unix,server.path=%s,export=,"
                "x-dirty-bitmap=qemu:dirty-bitmap:%s" % (sock, name))
        cp = run(qemu_img, "map", "--output=json", "--image-opts", opts,
                 check=True)
    finally:
        p.terminate()
        p.wait(timeout=10)
    return [(e["start"], e["length"]) for e in json.loads(cp.stdout)
            if not e["data"]]


def test_nbd_contents(run, qemu_img, qemu_io, blkimg, tmp_path):
    """What qemu-nbd exports of bitmaps blkimg merged, cleared and added
    is what it exports of qemu-img's copy."""
    t = template(run, qemu_img, qemu_io, tmp_path,
                 [("b0", "4k"), ("c", "1M"), ("d", "512", True)],
                 writes=("write 0 4k", "write 1M 64k", "write 3M 1k",
                         "write 3500k 7k"))
    q, m, (rc, out) = both(run, qemu_img, blkimg, tmp_path, t,
                           ["--add", "-g", "64k", "--merge", "b0",
                            "--merge", "c", "IMG", "n"])
    assert rc == 0, out
    run(qemu_img, "bitmap", "--merge", "n", q, "d", check=True)
    run(blkimg, "bitmap", "--merge", "n", m, "d", check=True)
    compare_images(run, qemu_img, q, m)
    for name in ("b0", "c", "d", "n"):
        dq = nbd_dirty(run, qemu_img, q, name, tmp_path)
        dm = nbd_dirty(run, qemu_img, m, name, tmp_path)
        assert dm == dq, name
        assert dm, name


# ------------------------------------------------------ convert --bitmaps

def convert_both(run, qemu_img, blkimg, tmp_path, args, target_from=None):
    """convert args (OUT: the target) with both tools; returns targets."""
    res, outs = [], []
    for tool, tag in ((qemu_img, "q"), (blkimg, "m")):
        out = str(tmp_path / ("out-%s.qcow2" % tag))
        if os.path.exists(out):
            os.unlink(out)
        if target_from:
            shutil.copy(target_from, out)
        cp = run(tool, "convert", *[a.replace("OUT", out) for a in args])
        text = (cp.stdout + "|" + cp.stderr).replace(out, "OUT")
        base = os.path.basename(tool)
        text = text.replace(base + ":", "TOOL:")
        res.append((cp.returncode, text))
        outs.append(out)
    assert res[1] == res[0], (args, res)
    return outs[0], outs[1], res[0]


def test_convert_bitmaps(run, qemu_img, qemu_io, blkimg, tmp_path):
    t = template(run, qemu_img, qemu_io, tmp_path,
                 [("b0",), ("d", "4k", True), ("f", "512"), ("c", "2M")])
    for extra in ([], ["--skip-broken-bitmaps"], ["-c"],
                  ["-o", "cluster_size=4k"]):
        q, m, (rc, out) = convert_both(
            run, qemu_img, blkimg, tmp_path,
            ["--bitmaps", *extra, "-O", "qcow2", t, "OUT"])
        assert rc == 0, out
        compare_images(run, qemu_img, q, m)
        assert len(info_bitmaps(run, qemu_img, m)) == 4


def test_convert_bitmaps_errors(run, qemu_img, qemu_io, blkimg, tmp_path):
    t = template(run, qemu_img, qemu_io, tmp_path, [("b0",), ("d", "4k")])
    r = str(tmp_path / "r.raw")
    run(qemu_img, "create", "-q", "-f", "raw", r, "4M", check=True)
    none = str(tmp_path / "none.qcow2")
    run(qemu_img, "create", "-q", "-f", "qcow2", none, "4M", check=True)
    for args in (["--bitmaps", "-O", "raw", t, "OUT"],
                 ["--bitmaps", "-O", "qcow2", r, "OUT"],
                 ["--bitmaps", "-O", "qcow2", "-o", "compat=0.10", t, "OUT"],
                 ["--skip-broken-bitmaps", "-O", "qcow2", t, "OUT"],
                 ["--bitmaps", "-O", "qcow2", t, t, "OUT"]):
        q, m, (rc, out) = convert_both(run, qemu_img, blkimg, tmp_path, args)
        assert rc == 1, (args, out)
    # no bitmaps at all: fine, none copied
    q, m, (rc, out) = convert_both(run, qemu_img, blkimg, tmp_path,
                                   ["--bitmaps", "-O", "qcow2", none, "OUT"])
    assert rc == 0 and info_bitmaps(run, qemu_img, m) is None
    # -n onto a target that already has the bitmaps
    q, m, (rc, out) = convert_both(run, qemu_img, blkimg, tmp_path,
                                   ["--bitmaps", "-n", "-O", "qcow2", t,
                                    "OUT"], target_from=t)
    assert rc == 1 and "already exists" in out, out
    # -n onto an empty qcow2 target
    q, m, (rc, out) = convert_both(run, qemu_img, blkimg, tmp_path,
                                   ["--bitmaps", "-n", "-O", "qcow2", t,
                                    "OUT"], target_from=none)
    assert rc == 0, out
    compare_images(run, qemu_img, q, m)


def test_convert_inconsistent_bitmap(run, qemu_img, qemu_io, blkimg,
                                     tmp_path):
    t = template(run, qemu_img, qemu_io, tmp_path,
                 [("b0",), ("stale", "4k"), ("b2", "1M")])
    set_flags(t, "stale", 3)
    q, m, (rc, out) = convert_both(run, qemu_img, blkimg, tmp_path,
                                   ["--bitmaps", "-O", "qcow2", t, "OUT"])
    assert rc == 1 and "inconsistent" in out, out
    q, m, (rc, out) = convert_both(
        run, qemu_img, blkimg, tmp_path,
        ["--bitmaps", "--skip-broken-bitmaps", "-O", "qcow2", t, "OUT"])
    assert rc == 0 and "Skipping inconsistent bitmap 'stale'" in out, out
    compare_images(run, qemu_img, q, m)
    assert [b["name"] for b in info_bitmaps(run, qemu_img, m)] == \
        ["b0", "b2"]


@pytest.mark.parametrize("opts", ["cluster_size=2M", "extended_l2=on",
                                  "lazy_refcounts=on", "refcount_bits=1",
                                  "cluster_size=4k,refcount_bits=64"])
def test_image_options(run, qemu_img, qemu_io, blkimg, tmp_path, opts):
    t = template(run, qemu_img, qemu_io, tmp_path, [("b0", "4k")], size="9M",
                 opts=opts)
    q, m, (rc, out) = both(run, qemu_img, blkimg, tmp_path, t,
                           ["--add", "--merge", "b0", "IMG", "n"])
    assert rc == 0, out
    compare_images(run, qemu_img, q, m)
    t2 = str(tmp_path / "t2.qcow2")
    shutil.copy(m, t2)
    q, m, (rc, out) = both(run, qemu_img, blkimg, tmp_path, t2,
                           ["--remove", "IMG", "b0"])
    assert rc == 0, out
    compare_images(run, qemu_img, q, m)


def test_other_bitmap_in_use(run, qemu_img, qemu_io, blkimg, tmp_path):
    """Actions on other bitmaps leave an in-use one as it is."""
    t = template(run, qemu_img, qemu_io, tmp_path, [("stale",), ("b0",)])
    set_flags(t, "stale", 3)
    for args in (["--add", "IMG", "n"], ["--add", "-g", "0", "IMG", "n"],
                 ["--clear", "IMG", "b0"],
                 ["--remove", "IMG", "b0"], ["--disable", "IMG", "b0"]):
        q, m, (rc, out) = both(run, qemu_img, blkimg, tmp_path, t, args)
        assert rc == 0, out
        compare_images(run, qemu_img, q, m)


def test_writes_after_bitmap_command(run, qemu_img, qemu_io, blkimg,
                                     blkimg_io, tmp_path):
    """A bitmap added by blkimg tracks later writes (qemu-io on one copy,
    blkimg-io on the other)."""
    t = template(run, qemu_img, qemu_io, tmp_path, [])
    q, m, (rc, out) = both(run, qemu_img, blkimg, tmp_path, t,
                           ["--add", "-g", "4k", "IMG", "n"])
    assert rc == 0, out
    session(run, qemu_io, q, ["write 2M 5k", "write -z 100k 4k"])
    session(run, blkimg_io, m, ["write 2M 5k", "write -z 100k 4k"])
    compare_images(run, qemu_img, q, m)


def test_no_space(run, qemu_img, qemu_io, blkimg, tmp_path, small_tmpfs):
    """File system full: each action fails with exit code 1, the bitmaps
    stay as they were and the image stays clean; with space again the same
    command works as qemu-img's."""
    from test_qcow2_bitmaps import check_clean, summary
    t = template(run, qemu_img, qemu_io, tmp_path,
                 [("b0", "512"), ("b1", "4k")], size="64M",
                 writes=("write 0 4M", "write 40M 3M"))
    # no free clusters inside the file: every update needs new space
    c = str(tmp_path / "c.qcow2")
    run(qemu_img, "convert", "--bitmaps", "-O", "qcow2", t, c, check=True)
    t = c
    mnt = small_tmpfs("16M")
    img = str(mnt / "full.qcow2")
    shutil.copy(t, img)
    filler = str(mnt / "filler")
    fill_up(filler)
    before = summary(img)
    for args in (["--add", "-g", "512", img, "n"],
                 ["--clear", img, "b0"],
                 ["--merge", "b0", img, "b1"],
                 ["--remove", img, "b0"]):
        cp = run(blkimg, "bitmap", *args)
        assert cp.returncode == 1, (args, cp.stdout, cp.stderr)
        assert cp.stderr.count("\n") == 1, cp.stderr
        check_clean(run, qemu_img, img)
        assert summary(img) == before
    os.unlink(filler)
    q = str(tmp_path / "q.qcow2")
    shutil.copy(t, q)
    args = ["--add", "-g", "512", "--merge", "b1", "--clear", "--merge",
            "b0"]
    run(qemu_img, "bitmap", *args, q, "n", check=True)
    run(blkimg, "bitmap", *args, img, "n", check=True)
    compare_images(run, qemu_img, q, img)
