# SPDX-License-Identifier: MIT
"""The json:/--image-opts keys that pipelines put on command lines, each
either working as in qemu-img / qemu-io 7.2 or refused in their words:
host_device and host_cdrom (on a loop device where one can be set up, and
refused on a regular file), file.locking, file.aio, cache.direct,
cache.no-flush, "backing": null, discard and detect-zeroes; and vdsm's
measure command line verbatim (lib/vdsm/storage/qemuimg.py builds it with
json.dumps)."""
import json
import subprocess

import pytest

pytestmark = pytest.mark.qemu

MiB = 1 << 20


def norm(cp, tool):
    """Exit code, stdout and stderr with the program name as QEMU's."""
    err = cp.stderr.replace("blkimg-io:", "qemu-io:").replace(
        "blkimg:", "qemu-img:")
    return cp.returncode, cp.stdout, err


@pytest.fixture
def imgs(tmp_path, run, qemu_img, qemu_io):
    """a.raw (data in the first 2 MiB), ov.qcow2 over it (its own data at
    3 MiB), both 4 MiB."""
    d = tmp_path
    run(qemu_img, "create", "-q", "-f", "raw", d / "a.raw", "4M", check=True)
    run(qemu_io, "-f", "raw", "-c", "write -P 0x11 0 2M", d / "a.raw",
        check=True)
    run(qemu_img, "create", "-q", "-f", "qcow2", "-b", "a.raw", "-F", "raw",
        d / "ov.qcow2", check=True, cwd=d)
    run(qemu_io, "-c", "write -P 0x22 3M 64k", d / "ov.qcow2", check=True)
    return d


OV = "driver=qcow2,file.filename=ov.qcow2,"
OPEN_CASES = [
    OV + "file.locking=bogus", OV + "file.aio=bogus", OV + "locking=off",
    OV + "aio=threads", OV + "discard=bogus", OV + "detect-zeroes=bogus",
    OV + "detect-zeroes=unmap", OV + "discard=unmap,detect-zeroes=unmap",
    OV + "file.locking=auto", OV + "file.locking=off", OV + "file.driver=file",
    OV + "discard=on", OV + "detect-zeroes=on", OV + "cache.direct=maybe",
    OV + "cache.direct=on,cache.no-flush=on,file.aio=threads",
    OV + "cache.direct=on,file.aio=native", OV + "file.aio=native",
    OV + "file.aio=io_uring", OV + "backing=", OV + "backing=foo",
    "driver=file,filename=a.raw,locking=off,aio=threads",
    "driver=file,filename=a.raw,locking=bogus",
    "driver=host_device,filename=a.raw",
    "driver=host_cdrom,filename=a.raw",
    "driver=raw,file.driver=host_device,file.filename=a.raw",
    'json:{"driver": "qcow2", "file": {"driver": "file", "filename": '
    '"ov.qcow2"}, "backing": null}',
    'json:{"driver": "qcow2", "file": {"driver": "file", "filename": '
    '"ov.qcow2"}, "backing": ""}',
    'json:{"file": {"driver": "file", "filename": "ov.qcow2"}, '
    '"backing": "foo"}',
    'json:{"driver": "qcow2", "file": {"driver": "host_device", '
    '"filename": "ov.qcow2"}}',
    'json:{"driver": "qcow2", "file": {"driver": "file", "filename": '
    '"ov.qcow2", "locking": "auto", "aio": "threads"}, "cache": '
    '{"direct": true, "no-flush": false}}',
    # CDI's spelling (json: and a space), with keys file does not take
    'json: {"file.driver": "file", "file.filename": "ov.qcow2", '
    '"file.timeout": 3600}',
    'json: {"file.driver": "host_device", "file.filename": "ov.qcow2"}',
    'json: {"file.driver": "file", "file.filename": "ov.qcow2"}',
]


@pytest.mark.parametrize("spec", OPEN_CASES)
def test_open_keys(imgs, run, qemu_img, qemu_io, blkimg, blkimg_io, spec):
    """info and qemu-io's open: the same output or the same refusal."""
    args = [spec] if spec.startswith("json:") else ["--image-opts", spec]
    q = run(qemu_img, "info", *args, cwd=imgs)
    b = run(blkimg, "info", *args, cwd=imgs)
    assert norm(b, "blkimg") == norm(q, "qemu-img")
    q = run(qemu_io, "-c", "read -v 3M 16", *args, cwd=imgs)
    b = run(blkimg_io, "-c", "read -v 3M 16", *args, cwd=imgs)
    assert b.returncode == q.returncode
    assert norm(b, "blkimg-io")[2] == norm(q, "qemu-io")[2]


def test_backing_null(imgs, run, qemu_img, blkimg):
    """"backing": null: the overlay alone (its backing file's data reads
    as zeroes), for map, convert and measure."""
    name = ('json:{"driver": "qcow2", "file": {"driver": "file", '
            '"filename": "ov.qcow2"}, "backing": null}')
    for args in (["map", "--output=json"], ["measure", "--output=json",
                                            "-O", "qcow2"]):
        q = run(qemu_img, *args, name, cwd=imgs)
        b = run(blkimg, *args, name, cwd=imgs)
        assert norm(b, "blkimg") == norm(q, "qemu-img"), args
    run(qemu_img, "convert", "-O", "raw", name, "q.raw", cwd=imgs,
        check=True)
    run(blkimg, "convert", "-O", "raw", name, "b.raw", cwd=imgs, check=True)
    data = (imgs / "b.raw").read_bytes()
    assert data == (imgs / "q.raw").read_bytes()
    assert data[:2 * MiB] == bytes(2 * MiB)


def test_detect_zeroes(tmp_path, run, qemu_img, qemu_io, blkimg_io):
    """detect-zeroes=on / unmap: a write of zeroes becomes a zero write,
    so qcow2 allocates no data cluster for it, as with qemu-io."""
    maps = []
    for sub, tool in (("q", qemu_io), ("b", blkimg_io)):
        d = tmp_path / sub
        d.mkdir()
        run(qemu_img, "create", "-q", "-f", "qcow2", d / "z.qcow2", "4M",
            check=True)
        for dz, off in (("on", 0), ("unmap", MiB)):
            run(tool, "-c", "write -P 0 %d 128k" % off, "-c",
                "write -P 5 %d 64k" % (off + 128 * 1024), "--image-opts",
                "driver=qcow2,file.filename=z.qcow2,discard=unmap,"
                "detect-zeroes=" + dz, cwd=d, check=True)
        maps.append(run(qemu_img, "map", "--output=json", d / "z.qcow2",
                        check=True).stdout)
        run(qemu_img, "check", d / "z.qcow2", check=True)
    assert maps[0] == maps[1]
    first = json.loads(maps[0])[0]
    assert first["start"] == 0 and first["data"] is False


@pytest.fixture
def loopdev(tmp_path, run, qemu_img, qemu_io):
    """A loop device over a qcow2 image (1 MiB-aligned file), detached
    afterwards; skips where losetup cannot set one up."""
    img = tmp_path / "lo.qcow2"
    run(qemu_img, "create", "-q", "-f", "qcow2", img, "16M", check=True)
    run(qemu_io, "-c", "write -P 0x44 0 1M", img, check=True)
    with open(img, "r+b") as f:
        f.truncate(-(-img.stat().st_size // MiB) * MiB)
    cp = subprocess.run(["losetup", "-f", "--show", str(img)],
                        capture_output=True, text=True)
    if cp.returncode != 0:
        pytest.skip("no loop device: " + cp.stderr.strip())
    dev = cp.stdout.strip()
    try:
        yield dev
    finally:
        subprocess.run(["losetup", "-d", dev], capture_output=True)


def test_vdsm_measure_verbatim(imgs, loopdev, run, qemu_img, blkimg):
    """vdsm's measure, as its qemuimg.measure() spells it, for a file
    volume and a block volume (host_device), with and without backing."""
    cases = []
    for protocol, image in (("file", str(imgs / "ov.qcow2")),
                            ("host_device", loopdev)):
        for backing in (True, False):
            node = {"file": {"driver": protocol, "filename": image}}
            node["driver"] = "qcow2"
            if not backing:
                node["backing"] = None
            cases.append(["measure", "--output", "json", "-O", "qcow2",
                          "json:" + json.dumps(node)])
    # and the devices refused where QEMU refuses them
    cases.append(["info", "json:" + json.dumps(
        {"driver": "qcow2", "file": {"driver": "file",
                                     "filename": loopdev}})])
    cases.append(["info", "--output=json", "json:" + json.dumps(
        {"driver": "qcow2", "file": {"driver": "host_device",
                                     "filename": loopdev}})])
    cases.append(["info", "-f", "host_device", loopdev])
    for args in cases:
        q = run(qemu_img, *args, cwd=imgs)
        b = run(blkimg, *args, cwd=imgs)
        assert norm(b, "blkimg") == norm(q, "qemu-img"), args


@pytest.mark.parametrize("dz", ["", ",detect-zeroes=on", ",detect-zeroes=bogus",
                                ",discard=bogus"])
def test_convert_target_detect_zeroes(tmp_path, run, qemu_img, blkimg, dz):
    """convert -S 0 writes every block; detect-zeroes on the target makes
    the zero ones zero writes, as in qemu-img."""
    maps = []
    for sub, tool in (("q", qemu_img), ("b", blkimg)):
        d = tmp_path / sub
        d.mkdir()
        (d / "z.raw").write_bytes(bytes(MiB))
        run(qemu_img, "create", "-q", "-f", "qcow2", d / "t.qcow2", "1M",
            check=True)
        r = run(tool, "convert", "-S", "0", "-n", "-f", "raw", "z.raw",
                "--target-image-opts",
                "driver=qcow2,file.filename=t.qcow2" + dz, cwd=d)
        maps.append((norm(r, "")[0], norm(r, "")[2], run(
            qemu_img, "map", "--output=json", d / "t.qcow2",
            check=True).stdout))
    assert maps[1] == maps[0]


def test_host_cdrom_without_disc(imgs, loopdev, run, qemu_img, qemu_io,
                                 blkimg, blkimg_io):
    """host_cdrom on a device that is no CD drive: it opens (info shows
    its size), its reads fail with "No medium found", as in QEMU."""
    spec = "driver=raw,file.driver=host_cdrom,file.filename=" + loopdev
    q = run(qemu_img, "info", "-f", "host_cdrom", loopdev)
    b = run(blkimg, "info", "-f", "host_cdrom", loopdev)
    assert norm(b, "blkimg") == norm(q, "qemu-img")
    q = run(qemu_io, "-c", "read 0 512", "--image-opts", spec)
    b = run(blkimg_io, "-c", "read 0 512", "--image-opts", spec)
    assert (b.returncode, b.stdout) == (q.returncode, q.stdout)
    assert q.stdout == "read failed: No medium found\n"
