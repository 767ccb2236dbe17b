# SPDX-License-Identifier: MIT
"""blkimg dd against qemu-img 7.2: operands, messages, exit codes and the
bytes of the output image (raw and qcow2 output, raw and qcow2 input)."""
import os
import subprocess

import pytest

from test_convert_helpers import MiB, make_raw, norm_err, read

pytestmark = pytest.mark.qemu

CASES = [
    "if=SRC of=OUT",
    "if=SRC of=OUT bs=1M count=3 skip=1",
    "if=SRC of=OUT bs=1M skip=100",
    "if=SRC of=OUT bs=4k skip=7 count=3000",
    "if=SRC of=OUT bs=3000 skip=7",
    "-f raw if=SRC of=OUT bs=64k count=1k",
    "if=SRC of=OUT bs=1M count=0",
    "if=SRC of=OUT bs=3G",
    "if=SRC of=OUT skip=1E",
    "if=SRC of=OUT bs=1M count=3 skip=3",
    "if=QSRC of=OUT bs=1M count=5 skip=1",
    "-O qcow2 if=SRC of=OUT bs=64k",
    "if=SRC",
    "if=SRC of=OUT foo",
    "if=SRC of=OUT foo=1",
    "if=SRC of=OUT bs=0",
    "if=SRC of=OUT bs=x",
    "if=SRC of=OUT count=-1",
    "if=SRC of=OUT skip=x",
    "-O foo if=SRC of=OUT",
    "if=MISSING of=OUT",
    "if=SRC of=/nonexistent-dir/o.raw",
    "-x if=SRC of=OUT",
]


@pytest.mark.parametrize("case", CASES)
def test_dd_matches_qemu(qemu_img, blkimg, tmp_path, case):
    src = make_raw(tmp_path / "s.raw", size=4 * MiB + 1000 * 512, seed=31)
    qsrc = tmp_path / "s.qcow2"
    subprocess.run([qemu_img, "convert", "-O", "qcow2", src, qsrc],
                   check=True)
    res = {}
    for name, tool in (("q", qemu_img), ("b", blkimg)):
        out = tmp_path / ("out." + name)
        argv = [tool, "dd"]
        for a in case.split():
            a = a.replace("QSRC", str(qsrc)).replace("SRC", src)
            a = a.replace("OUT", str(out))
            a = a.replace("MISSING", str(tmp_path / "missing"))
            argv.append(a)
        cp = subprocess.run(argv, capture_output=True)
        err = norm_err(cp.stderr).replace(str(out), "OUT")
        res[name] = (cp.returncode, cp.stdout, err)
        res[name + "_file"] = out
    assert res["b"] == res["q"]
    qo, bo = res["q_file"], res["b_file"]
    assert os.path.exists(qo) == os.path.exists(bo)
    if os.path.exists(qo):
        if "qcow2" in case:
            cp = subprocess.run([qemu_img, "compare", qo, bo],
                                capture_output=True, text=True)
            assert cp.stdout == "Images are identical.\n"
            subprocess.run([qemu_img, "check", bo], check=True,
                           capture_output=True)
        else:
            assert os.path.getsize(bo) == os.path.getsize(qo)
            assert read(bo) == read(qo)


def test_dd_onto_its_input_refused(blkimg, tmp_path):
    """qemu-img dd if=X of=X truncates X (its input) to nothing; blkimg
    refuses, as convert does, and X is intact."""
    src = make_raw(tmp_path / "s.raw", size=4 * MiB, seed=32)
    before = read(src)
    cp = subprocess.run([blkimg, "dd", "if=" + src, "of=" + src],
                        capture_output=True, text=True)
    assert cp.returncode == 1
    assert cp.stderr == ("blkimg: %s: error while creating output image: "
                         "Failed to get \"write\" lock\nIs another process "
                         "using the image [%s]?\n" % (src, src))
    assert read(src) == before
