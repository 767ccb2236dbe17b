# SPDX-License-Identifier: MIT
"""blkimg-io's OFFSET / COUNT arguments against qemu-io 7.2: bad numbers,
lengths over the 2 GiB limit (write -z -n may exceed it), the same
message and status, and nothing written where qemu-io writes nothing."""
import hashlib
import shutil
import subprocess

import pytest

pytestmark = pytest.mark.qemu

CASES = [
    "read 0 3G", "write 0 3G", "write -z 0 3G", "discard 0 3G",
    "read x 1", "read 0 y", "read -1 512", "write 0 -5", "discard 1k 1q",
    "readv 0x 512", "writev 0 512z", "readv 1k", "write -z -n 0 3G",
]


def sha(p):
    with open(p, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


@pytest.mark.parametrize("cmd", CASES)
def test_offset_count_errors_match_qemu(blkimg_io, tmp_path, cmd):
    img = tmp_path / "a.raw"
    with open(img, "wb") as f:
        f.write(b"\x5a" * 65536)
    out = []
    for tool in ("qemu-io", blkimg_io):
        p = tmp_path / ("%d.raw" % len(out))
        shutil.copyfile(img, p)
        cp = subprocess.run([tool, "-f", "raw", "-c", cmd, str(p)],
                            capture_output=True, text=True)
        out.append((cp.returncode, cp.stdout.replace(str(p), "IMG"),
                    cp.stderr.replace("qemu-io", "PROG")
                    .replace("blkimg-io", "PROG").replace(str(p), "IMG"),
                    sha(p)))
    assert out[1] == out[0]
