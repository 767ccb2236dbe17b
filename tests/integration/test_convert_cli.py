# SPDX-License-Identifier: MIT
"""convert's option-list corner cases against qemu-img 7.2: `-o help`
(with and without a target, with and without -O) and `-o` together with
-n. Output and exit code must be the same, and nothing may be created."""
import os

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
