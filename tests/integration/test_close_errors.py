# SPDX-License-Identifier: MIT
"""What a qcow2 image writes when it is closed (metadata, dirty bitmaps,
the clean flag) can fail; the failure reaches the user as one line naming
the file and the cause, with a non-zero exit code, and leaves an image
that qemu-img check finds consistent."""
import json
import os
import subprocess
import time

import pytest

from storage import fill_up

pytestmark = [pytest.mark.qemu, pytest.mark.root]


def test_bitmap_store_fails_at_close(blkimg_io, small_tmpfs):
    mnt = small_tmpfs("4M")
    img = mnt / "a.qcow2"
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", img, "8M"],
                   check=True)
    subprocess.run(["qemu-img", "bitmap", "--add", img, "b0"], check=True)
    p = subprocess.Popen([blkimg_io, "-c", "write -P 1 0 1M", "-c",
                          "sleep 1500", str(img)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    time.sleep(0.8)
    fill_up(mnt / "filler")  # no room left to store the bitmap
    out, err = p.communicate(timeout=60)
    assert p.returncode == 1
    assert "wrote 1048576/1048576 bytes at offset 0" in out
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0] == ("blkimg-io: Failed to close '%s': No space left on "
                        "device" % img)
    os.unlink(mnt / "filler")
    cp = subprocess.run(["qemu-img", "check", img], capture_output=True,
                        text=True)
    assert cp.returncode == 0, cp.stdout
    info = json.loads(subprocess.run(["qemu-img", "info", "--output=json",
                                      img], capture_output=True, text=True,
                                     check=True).stdout)
    # the bitmap could not be stored: QEMU sees it in use (inconsistent)
    bm = info["format-specific"]["data"]["bitmaps"]
    assert bm[0]["name"] == "b0" and "in-use" in bm[0]["flags"]
    cp = subprocess.run(["qemu-io", "-r", "-c", "read -P 1 0 1M", img],
                        capture_output=True, text=True)
    assert "failed" not in cp.stdout and cp.returncode == 0
