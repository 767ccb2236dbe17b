# SPDX-License-Identifier: MIT
"""Helpers for the rebase / commit / amend tests: image chains built by
qemu-img and qemu-io in two identical directories, one per tool, and the
views of an image that must come out the same (guest bytes, allocation
map without host offsets, qemu-img check)."""
import json
import os
import shutil
import subprocess

from test_convert_helpers import run2

QEMU_IO = shutil.which("qemu-io") or "qemu-io"


def sh(*cmd, cwd=None):
    subprocess.run([str(c) for c in cmd], check=True, capture_output=True,
                   cwd=cwd)


def qio(img, *cmds, fmt=None, cwd=None):
    args = [QEMU_IO]
    if fmt:
        args += ["-f", fmt]
    for c in cmds:
        args += ["-c", c]
    sh(*args, img, cwd=cwd)


def twin_dirs(tmp_path, build):
    """build(dir) makes the images in a directory; returns (q, b): the
    directory qemu-img works in and the one blkimg works in."""
    q = tmp_path / "q"
    b = tmp_path / "b"
    # built twice rather than copied: a copy would not keep raw files
    # sparse, and their allocation shows in the maps
    for d in (q, b):
        d.mkdir()
        build(d)
    return q, b


def guest_bytes(qemu_img, img, tmp_path, fmt=None):
    out = tmp_path / ("view-%d.raw" % len(os.listdir(tmp_path)))
    args = [qemu_img, "convert", "-U", "-O", "raw"]
    if fmt:
        args += ["-f", fmt]
    sh(*args, img, out)
    with open(out, "rb") as f:
        data = f.read()
    os.unlink(out)
    return data


def layout(qemu_img, img, file_holes=False):
    """qemu-img map --output=json without host offsets (allocation order
    may differ) and without file names, adjacent equal runs merged."""
    cp = subprocess.run([qemu_img, "map", "-U", "--output=json", str(img)],
                        capture_output=True, text=True, check=True)
    out = []
    for e in json.loads(cp.stdout):
        e.pop("offset", None)
        e.pop("filename", None)
        if file_holes and e["data"]:
            # a hole in the host file inside an allocated cluster reads as
            # zeroes: which clusters have one depends on host allocation
            e["zero"] = False
        # runs split only where host offsets jump are merged
        if out and all(out[-1][k] == e[k] for k in e
                       if k not in ("start", "length")) and \
                out[-1]["start"] + out[-1]["length"] == e["start"]:
            out[-1]["length"] += e["length"]
        else:
            out.append(e)
    return out


def check_ok(qemu_img, img):
    cp = subprocess.run([qemu_img, "check", "-U", str(img)],
                        capture_output=True, text=True)
    return cp.returncode, cp.stdout + cp.stderr


def info_lines(qemu_img, img):
    """qemu-img info lines, the image's directory replaced by DIR."""
    d = os.path.dirname(os.path.abspath(str(img)))
    cp = subprocess.run([qemu_img, "info", "-U", str(img)],
                        capture_output=True, text=True, check=True)
    return [l.replace(d, "DIR") for l in cp.stdout.splitlines()
            if not l.startswith(("image:", "disk size:"))]


def run_both(qemu_img, blkimg, args, q, b):
    """Runs the same relative command line in each directory."""
    return run2(qemu_img, args, cwd=q), run2(blkimg, args, cwd=b)
