# SPDX-License-Identifier: MIT
"""blkimg resize against qemu-img 7.2: messages, exit codes and the
resulting image (size, bytes, allocation; qcow2 checked and compared)."""
import os
import shutil
import subprocess

import pytest

from test_convert_helpers import MiB, blocks, make_raw, read, run2

pytestmark = pytest.mark.qemu

RAW_CASES = [
    "IMG 20M",
    "IMG -5M",
    "IMG xyz",
    "IMG",
    "--shrink IMG -5M",
    "--shrink -f raw IMG -5M",
    "--preallocation=full -f raw IMG 10M",
    "--preallocation=foo IMG +1M",
    "--preallocation=falloc -f raw IMG +1M",
    "--preallocation=full -f raw IMG +3M",
    "--preallocation=off -f raw IMG +3M",
    "-f raw IMG -- -100M",
    "-f raw IMG 0",
    "-q -f raw IMG 12M",
    "-q -f raw IMG 2M",
    "-f qcow2 IMG 12M",
    "-f raw IMG +1.5M",
    "-f raw IMG 1E",
    "-f raw MISSING 1G",
    "-f raw IMG 10000001",
    "-f raw IMG 2G",
    "-f raw IMG +0",
    "-f raw IMG 10M",
    "-x -f raw IMG 10M",
    "-f raw IMG 10M 11M",
    "resize",
]


def _argv(case, img, tmp_path):
    out = ["resize"]
    for a in case.split():
        if a == "resize":
            continue
        out.append(img if a == "IMG" else
                   str(tmp_path / "missing") if a == "MISSING" else a)
    return out


def same_bytes(qemu_img, a, b):
    """Byte equality; large sparse files through qemu-img compare, which
    skips holes instead of reading gigabytes of zeroes."""
    if os.path.getsize(a) <= 64 * MiB:
        return read(a) == read(b)
    cp = subprocess.run([qemu_img, "compare", "-q", "-f", "raw", "-F", "raw",
                         str(a), str(b)])
    return cp.returncode == 0


@pytest.mark.parametrize("case", RAW_CASES)
def test_resize_raw_matches_qemu(qemu_img, blkimg, tmp_path, case):
    src = make_raw(tmp_path / "src.raw", size=10 * MiB, seed=21)
    q = tmp_path / "q.raw"
    b = tmp_path / "b.raw"
    shutil.copy(src, q)
    shutil.copy(src, b)
    rq = run2(qemu_img, _argv(case, str(q), tmp_path))
    rb = run2(blkimg, _argv(case, str(b), tmp_path))
    rb = (rb[0], rb[1], rb[2].replace(str(b), str(q)))
    assert rb == rq
    assert os.path.getsize(b) == os.path.getsize(q)
    assert same_bytes(qemu_img, b, q)
    if "preallocation=full" in case or "preallocation=falloc" in case:
        assert blocks(b) == blocks(q)


def test_resize_real_stack(qemu_img, blkimg, tmp_path):
    img = tmp_path / "i.raw"
    with open(img, "wb") as f:
        f.write(b"\x5a" * 4096)
    assert run2(blkimg, ["resize", "-f", "raw", img, "2G"]) == \
        (0, b"Image resized.\n", "")
    assert os.path.getsize(img) == 2 << 30
    assert read(img)[:4096] == b"\x5a" * 4096


@pytest.mark.parametrize("case", ["IMG 20M", "IMG +7M", "IMG -5M",
                                  "--shrink IMG -5M",
                                  "--shrink -f qcow2 IMG 5M",
                                  "--shrink -f qcow2 IMG 3000k",
                                  "-f qcow2 IMG 1T",
                                  "-f qcow2 IMG 0"])
def test_resize_qcow2(qemu_img, blkimg, tmp_path, case):
    base = tmp_path / "base.qcow2"
    subprocess.run([qemu_img, "create", "-f", "qcow2", base, "10M"],
                   check=True, capture_output=True)
    subprocess.run(["qemu-io", "-c", "write -P 1 0 9M", base], check=True,
                   capture_output=True)
    q = tmp_path / "q.qcow2"
    b = tmp_path / "b.qcow2"
    shutil.copy(base, q)
    shutil.copy(base, b)
    rq = run2(qemu_img, _argv(case, str(q), tmp_path))
    rb = run2(blkimg, _argv(case, str(b), tmp_path))
    assert rb == rq
    cp = subprocess.run([qemu_img, "check", b], capture_output=True,
                        text=True)
    assert cp.returncode == 0, cp.stdout
    cp = subprocess.run([qemu_img, "compare", "-s", q, b],
                        capture_output=True, text=True)
    assert cp.stdout == "Images are identical.\n"
