# SPDX-License-Identifier: MIT
"""Zero writes to qcow2 v2 (compat=0.10) images as QEMU 7.2 does them: v2
has no zero flag, so without a backing file whole clusters are discarded
(they read as zeroes unallocated), a partial cluster that is unallocated
stays so, one holding data gets zeroes written; with a backing file the
zeroes are written as data. qemu-io and blkimg-io run the same script on
copies of one image; the maps, qemu-img check and the bytes must agree."""
import pytest

pytestmark = pytest.mark.qemu

SCRIPT = [
    "write -P 1 0 192k", "write -c -P 3 1M 64k", "write -P 4 1536k 64k",
    "write -z 4k 4k", "write -z 64k 64k", "write -z 120k 72k",
    "write -z 1M 64k", "write -z 2M 4k", "write -z 1560k 8k",
    "write -z -u 3M 1M", "write -z 4032k 64k",
    "read -P 1 0 4k", "read -P 0 4k 4k", "read -P 0 64k 128k",
    "read -P 0 1M 64k", "read -P 0 1560k 8k", "read -P 4 1568k 8k",
]


@pytest.mark.parametrize("backing", [False, True])
def test_v2_write_zeroes(tmp_path, run, qemu_img, qemu_io, blkimg_io,
                         backing):
    maps, datas = [], []
    for sub, tool in (("q", qemu_io), ("b", blkimg_io)):
        d = tmp_path / sub
        d.mkdir()
        opts = ["-o", "compat=0.10"]
        if backing:
            run(qemu_img, "create", "-q", "-f", "raw", d / "base.raw", "4M",
                check=True)
            run(qemu_io, "-f", "raw", "-c", "write -P 9 0 4M",
                d / "base.raw", check=True)
            opts += ["-b", "base.raw", "-F", "raw"]
        run(qemu_img, "create", "-q", "-f", "qcow2", *opts, d / "w.qcow2",
            "4M", check=True, cwd=d)
        args = []
        for c in SCRIPT:
            args += ["-c", c]
        r = run(tool, *args, "w.qcow2", cwd=d)
        assert r.returncode == 0 and "fail" not in r.stdout, r.stdout
        maps.append(run(qemu_img, "map", "--output=json", "w.qcow2", cwd=d,
                        check=True).stdout)
        run(qemu_img, "check", "w.qcow2", cwd=d, check=True)
        run(qemu_img, "convert", "-O", "raw", "w.qcow2", "w.raw", cwd=d,
            check=True)
        datas.append((d / "w.raw").read_bytes())
    assert maps[1] == maps[0]
    assert datas[1] == datas[0]
