# SPDX-License-Identifier: MIT
"""blkimg measure against qemu-img 7.2: required and fully allocated sizes
for raw and qcow2 targets (every cluster size, refcount width, extended L2,
preallocation, backing file), from --size or from an image, human and JSON
output, and the error messages."""
import subprocess

import pytest

from test_convert_helpers import MiB, make_raw, run2

pytestmark = pytest.mark.qemu


@pytest.fixture
def imgs(tmp_path):
    raw = make_raw(tmp_path / "s.raw", size=64 * MiB, seed=11)
    q = tmp_path / "s.qcow2"
    subprocess.run(["qemu-img", "convert", "-O", "qcow2", raw, q], check=True)
    q2 = tmp_path / "z.qcow2"
    subprocess.run(["qemu-img", "create", "-f", "qcow2", q2, "100M"],
                   check=True, capture_output=True)
    subprocess.run(["qemu-io", "-c", "write -P 1 0 3M", "-c",
                    "write -z 8M 1M", "-c", "write -P 2 50M 100k", q2],
                   check=True, capture_output=True)
    odd = tmp_path / "odd.raw"
    odd.write_bytes(b"\x01" * 1001)
    # persistent bitmaps count in "bitmaps size" (v3 sources only)
    bm = tmp_path / "bm.qcow2"
    v2 = tmp_path / "v2.qcow2"
    subprocess.run(["qemu-img", "create", "-f", "qcow2", bm, "300M"],
                   check=True, capture_output=True)
    subprocess.run(["qemu-img", "create", "-f", "qcow2", "-o", "compat=0.10",
                    v2, "10M"], check=True, capture_output=True)
    for name, gran in (("b1", "65536"), ("a-much-longer-bitmap-name", "512")):
        subprocess.run(["qemu-img", "bitmap", "--add", "-g", gran, bm, name],
                       check=True, capture_output=True)
    return {"RAW": raw, "QCOW": str(q), "ZQ": str(q2), "ODD": str(odd),
            "BM": str(bm), "V2": str(v2)}


CASES = [
    "-O qcow2 RAW",
    "-O qcow2 QCOW",
    "-O qcow2 ZQ",
    "--output=json -O qcow2 RAW",
    "--output=json -O qcow2 QCOW",
    "--output json -O qcow2 -f qcow2 QCOW",
    "-O raw RAW",
    "-O raw QCOW",
    "--output=json -O raw ZQ",
    "-O qcow2 ODD",
    "-O raw ODD",
    "-f raw -O qcow2 QCOW",
    "-O qcow2 -o cluster_size=4k RAW",
    "-O qcow2 -o cluster_size=2M QCOW",
    "-O qcow2 -o cluster_size=512,refcount_bits=64 ZQ",
    "-O qcow2 -o compat=0.10 QCOW",
    "-O qcow2 -o preallocation=full RAW",
    "-O qcow2 -o preallocation=metadata ZQ",
    "-O qcow2 -o backing_file=RAW,backing_fmt=raw QCOW",
    "-O qcow2 -o extended_l2=on ZQ",
    "-O qcow2 BM",
    "--output=json -O qcow2 -o cluster_size=4k BM",
    "-O qcow2 -o compat=0.10 BM",
    "-O qcow2 V2",
    "-O raw BM",
    "--size 1G -O qcow2",
    "--size 1G",
    "--size 0 -O qcow2",
    "--size 7 -O qcow2",
    "--size 12345 -O raw",
    "--size 1.5G --output=json -O qcow2",
    "--size 1P -O qcow2",
    "--size 100T -O qcow2 -o cluster_size=2M,refcount_bits=64",
    "--size 5T -O qcow2 -o cluster_size=1k,refcount_bits=2",
    "--size 1G -O qcow2 -o cluster_size=4k,refcount_bits=1",
    "--size 1G -O qcow2 -o preallocation=falloc",
    "--size 1G -O qcow2 -o preallocation=metadata",
    "--size 1G -O qcow2 -o extended_l2=on",
    "--size 1G -O qcow2 -o extended_l2=on,cluster_size=2M",
    "--size 1G -O qcow2 -o size=5G",
    "--size 1G -O qcow2 -o lazy_refcounts=on,compression_type=zstd",
    "--size 1G -O qcow2 -o backing_file=x.img",
    # errors
    "--size 1G -O qcow2 RAW",
    "-O qcow2",
    "--size -1 -O qcow2",
    "--size 1x -O qcow2",
    "--size 1G -O foo",
    "--size 1P -O qcow2 -o cluster_size=512",
    "--size 1G -O qcow2 -o compat=0.10,refcount_bits=8",
    "--size 1G -O qcow2 -o extended_l2=on,cluster_size=4k",
    "--size 1G -O qcow2 -o cluster_size=3k",
    "--size 1G -O qcow2 -o compat=2",
    "--size 1G -O qcow2 -o refcount_bits=3",
    "--size 1G -O qcow2 -o preallocation=xx",
    "--size 1G -O qcow2 -o bogus=1",
    "--output=xml --size 1G",
    "--size 1G -f raw",
    "RAW QCOW",
    "-O qcow2 missing.img",
]


@pytest.mark.parametrize("case", CASES)
def test_measure_matches_qemu(qemu_img, blkimg, tmp_path, imgs, case):
    argv = ["measure"]
    for a in case.split():
        for k, v in imgs.items():
            a = a.replace(k, v)
        argv.append(a)
    rq = run2(qemu_img, argv, cwd=tmp_path)
    rb = run2(blkimg, argv, cwd=tmp_path)
    assert rb == rq


def test_measure_required_fits_converted_image(qemu_img, blkimg, tmp_path,
                                               imgs):
    """The required size is enough for the image convert makes."""
    rc, out, _ = run2(blkimg, ["measure", "--output=json", "-O", "qcow2",
                               imgs["RAW"]])
    assert rc == 0
    import json
    req = json.loads(out)["required"]
    dst = tmp_path / "c.qcow2"
    subprocess.run([qemu_img, "convert", "-O", "qcow2", imgs["RAW"], dst],
                   check=True)
    import os
    assert os.path.getsize(dst) <= req
