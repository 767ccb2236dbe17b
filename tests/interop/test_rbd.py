# SPDX-License-Identifier: MIT
"""The rbd protocol driver against a real single-node Ceph cluster (one
monitor, one memstore OSD on 127.0.0.1, started once per run and shared by
the pytest workers: ceph_cluster.py), side by side with qemu-img / qemu-io
7.2 and its rbd driver (qemu-block-extra) on the same images: info (text,
JSON), map, convert both ways, qcow2 on RBD, create and resize as the rbd
CLI sees them, compare, snapshots, and the error lines (missing image or
pool, a cluster that is down). Images are small and named per worker."""
import json
import os
import subprocess
import time

import pytest

import ceph_cluster

pytestmark = [pytest.mark.qemu]

MiB = 1 << 20
REPO = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))


@pytest.fixture(scope="session")
def ceph():
    """The shared cluster's ceph.conf (CEPH_CONF is set for every tool).
    Missing packages are installed as CI does (scripts/deps.sh): the
    tests never skip for want of Ceph."""
    if not ceph_cluster.available():
        subprocess.run(["bash", os.path.join(REPO, "scripts", "deps.sh")],
                       check=False, timeout=600)
    if not ceph_cluster.available():
        pytest.fail("ceph packages missing (scripts/deps.sh failed)")
    conf = ceph_cluster.acquire()
    os.environ["CEPH_CONF"] = conf
    yield conf
    ceph_cluster.release()


_seq = [0]


def name(tag):
    """An image name of this worker's own."""
    _seq[0] += 1
    return "t%d-%s-%d" % (os.getpid(), tag, _seq[0])


def rbd_cli(*args):
    out = subprocess.run(["rbd"] + list(args), capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


def rbd_size(img):
    return json.loads(rbd_cli("info", "--format", "json",
                              "rbd/" + img))["size"]


def same(run, blkimg, qemu_img, *args, rc=0):
    """Runs blkimg and qemu-img with args; both outputs and exit codes
    must be equal (the program name aside). Returns blkimg's stdout."""
    b = run(blkimg, *args)
    q = run(qemu_img, *args)
    assert (b.returncode, b.stdout) == (q.returncode, q.stdout)
    assert b.stderr.replace("blkimg:", "qemu-img:") == q.stderr
    assert b.returncode == rc, b.stderr
    return b.stdout


@pytest.fixture(scope="session")
def src_raw(ceph, tmp_path_factory):
    """A 20 MiB raw file: data at 0 and from 9 MiB, zeroes between."""
    p = tmp_path_factory.mktemp("rbd") / "src.raw"
    with open(p, "wb") as f:
        f.write(b"\x07" * MiB)
        f.seek(9 * MiB)
        f.write(bytes(range(256)) * (3 * MiB // 256))
        f.truncate(20 * MiB)
    return p


@pytest.fixture(scope="session")
def shared_img(ceph, src_raw):
    """An RBD image holding src_raw (made by qemu-img) with snapshot
    "s1"; after the snapshot its first MiB was overwritten."""
    img = name("shared")
    subprocess.run(["qemu-img", "convert", "-f", "raw", "-O", "raw",
                    str(src_raw), "rbd:rbd/" + img], check=True, timeout=60)
    rbd_cli("snap", "create", "rbd/%s@s1" % img)
    subprocess.run(["qemu-io", "-f", "raw", "-c", "write -P 0x55 0 1M",
                    "rbd:rbd/" + img], check=True, timeout=60,
                   capture_output=True)
    return img


def test_info_text_and_json(run, blkimg, qemu_img, shared_img):
    for spec in ("rbd:rbd/" + shared_img,
                 "rbd:rbd/%s@s1" % shared_img,
                 "rbd:rbd/%s:id=admin:rbd_cache=false" % shared_img,
                 "rbd:rbd/%s:conf=%s" % (shared_img, os.environ["CEPH_CONF"])):
        for out in ("human", "json"):
            txt = same(run, blkimg, qemu_img, "info", "-f", "raw",
                       "--output=" + out, spec)
        assert '"cluster-size": 4194304' in txt
        assert '"name": "s1"' in txt
    for opts in ("driver=rbd,pool=rbd,image=%s,snapshot=s1" % shared_img,
                 "driver=raw,file.driver=rbd,file.pool=rbd,file.image=%s,"
                 "file.user=admin" % shared_img):
        for out in ("human", "json"):
            same(run, blkimg, qemu_img, "info", "--output=" + out,
                 "--image-opts", opts)


def test_map(run, blkimg, qemu_img, shared_img):
    out = same(run, blkimg, qemu_img, "map", "-f", "raw", "--output=json",
               "rbd:rbd/" + shared_img)
    m = json.loads(out)
    # whole objects: data in objects 0 and 2, zeroes elsewhere
    assert [(e["start"], e["data"]) for e in m] == [
        (0, True), (4 * MiB, False), (8 * MiB, True), (12 * MiB, False)]
    same(run, blkimg, qemu_img, "map", "-f", "raw", "--output=json",
         "rbd:rbd/%s@s1" % shared_img)


def test_convert_both_ways(run, blkimg, qemu_img, src_raw, tmp_path, ceph):
    img = name("conv")
    run(blkimg, "convert", "-f", "raw", "-O", "raw", src_raw,
        "rbd:rbd/" + img, check=True)
    assert rbd_size(img) == 20 * MiB
    run(qemu_img, "compare", "-f", "raw", "-F", "raw", src_raw,
        "rbd:rbd/" + img, check=True)
    back = tmp_path / "back.raw"
    run(blkimg, "convert", "-f", "raw", "-O", "raw", "rbd:rbd/" + img, back,
        check=True)
    assert back.read_bytes() == src_raw.read_bytes()
    # -n into an image qemu-img made, over old contents
    img2 = name("conv-n")
    run(qemu_img, "create", "-f", "raw", "rbd:rbd/" + img2, "20M",
        check=True)
    run("qemu-io", "-f", "raw", "-c", "write -P 0xee 4M 2M",
        "rbd:rbd/" + img2, check=True)
    run(blkimg, "convert", "-n", "-f", "raw", "-O", "raw", src_raw,
        "rbd:rbd/" + img2, check=True)
    same(run, blkimg, qemu_img, "compare", "-f", "raw", "-F", "raw",
         src_raw, "rbd:rbd/" + img2)


def test_qcow2_on_rbd(run, blkimg, blkimg_io, qemu_img, ceph):
    img, qimg = "rbd:rbd/" + name("qcow2"), "rbd:rbd/" + name("qcow2")
    b = run(blkimg, "create", "-f", "qcow2", img, "32M", check=True)
    q = run(qemu_img, "create", "-f", "qcow2", qimg, "32M", check=True)
    assert b.stdout == q.stdout.replace(qimg, img)
    run(blkimg_io, "-f", "qcow2", "-c", "write -P 0x3c 1M 2M", img,
        check=True)
    run("qemu-io", "-f", "qcow2", "-c", "write -P 0x4d 8M 64k", img,
        check=True)
    for out in ("human", "json"):
        same(run, blkimg, qemu_img, "info", "--output=" + out, img)
    same(run, blkimg, qemu_img, "map", "--output=json", img)
    same(run, blkimg, qemu_img, "check", img)
    r = run("qemu-io", "-f", "qcow2", "-c", "read -P 0x3c 1M 2M", img)
    assert "Pattern verification failed" not in r.stdout


def test_create_and_resize(run, blkimg, qemu_img, ceph):
    img = name("cr")
    spec = "rbd:rbd/" + img
    out = run(blkimg, "create", "-f", "raw", spec, "8M", check=True).stdout
    assert out == "Formatting '%s', fmt=raw size=8388608\n" % spec
    assert rbd_size(img) == 8 * MiB
    info = json.loads(rbd_cli("info", "--format", "json", "rbd/" + img))
    assert info["order"] == 22
    # creating it again fails as in qemu-img
    same(run, blkimg, qemu_img, "create", "-f", "raw", spec, "8M", rc=1)
    run(blkimg, "resize", "-f", "raw", spec, "12M", check=True)
    assert rbd_size(img) == 12 * MiB
    run(blkimg, "resize", "-f", "raw", "--shrink", spec, "4M", check=True)
    assert rbd_size(img) == 4 * MiB
    info = json.loads(run(qemu_img, "info", "-f", "raw", "--output=json",
                          spec, check=True).stdout)
    assert info["virtual-size"] == 4 * MiB
    # shrinking without --shrink is refused alike
    same(run, blkimg, qemu_img, "resize", "-f", "raw", spec, "2M", rc=1)


def test_create_object_size(run, blkimg, qemu_img, ceph):
    img = name("cs")
    b = run(blkimg, "create", "-f", "raw", "-o", "cluster_size=8M",
            "rbd:rbd/" + img, "16M", check=True)
    assert b.stdout == ("Formatting 'rbd:rbd/%s', fmt=raw size=16777216 "
                        "cluster_size=8388608\n" % img)
    info = json.loads(rbd_cli("info", "--format", "json", "rbd/" + img))
    assert info["order"] == 23
    # refused alike: not a power of 2, too small, too big (librbd)
    for cs in ("1000", "2048", "64M"):
        same(run, blkimg, qemu_img, "create", "-f", "raw", "-o",
             "cluster_size=" + cs, "rbd:rbd/" + name("cs-bad"), "16M", rc=1)
    same(run, blkimg, qemu_img, "create", "-f", "raw", "-o",
         "preallocation=full", "rbd:rbd/" + name("cs-bad"), "16M", rc=1)


def test_convert_object_size(run, blkimg, qemu_img, src_raw, ceph):
    img = name("cv-cs")
    run(blkimg, "convert", "-f", "raw", "-O", "raw", "-o", "cluster_size=1M",
        src_raw, "rbd:rbd/" + img, check=True)
    info = json.loads(rbd_cli("info", "--format", "json", "rbd/" + img))
    assert info["order"] == 20
    same(run, blkimg, qemu_img, "convert", "-f", "raw", "-O", "raw", "-o",
         "cluster_size=1000", src_raw, "rbd:rbd/" + name("cv-bad"), rc=1)


def test_compare(run, blkimg, qemu_img, src_raw, shared_img):
    # the head differs from src in its first MiB, the snapshot does not
    same(run, blkimg, qemu_img, "compare", "-f", "raw", "-F", "raw",
         src_raw, "rbd:rbd/" + shared_img, rc=1)
    same(run, blkimg, qemu_img, "compare", "-f", "raw", "-F", "raw",
         src_raw, "rbd:rbd/%s@s1" % shared_img)


def test_snapshot_source(run, blkimg, qemu_img, src_raw, shared_img,
                         tmp_path):
    out = tmp_path / "snap.raw"
    run(blkimg, "convert", "-f", "raw", "-O", "raw",
        "rbd:rbd/%s@s1" % shared_img, out, check=True)
    assert out.read_bytes() == src_raw.read_bytes()
    # a snapshot does not open for writing
    same(run, blkimg, qemu_img, "resize", "-f", "raw",
         "rbd:rbd/%s@s1" % shared_img, "30M", rc=1)


def test_errors(run, blkimg, qemu_img, ceph):
    for spec in ("rbd:rbd/no-such-image", "rbd:no-such-pool/x", "rbd:rbd",
                 "rbd:rbd/x:novalue", "rbd:rbd/x:bogus_opt=1",
                 "rbd:rbd/x:conf=/nonexistent", "rbd:rbd/a\\@b:id=x",
                 "rbd:rbd/a\\/b@c\\@d:id=x"):
        same(run, blkimg, qemu_img, "info", "-f", "raw", spec, rc=1)
    for opts in ("driver=rbd,pool=rbd", "driver=rbd,pool=rbd,image=x,"
                 "key-secret=sec0"):
        same(run, blkimg, qemu_img, "info", "--image-opts", opts, rc=1)
    r = run(blkimg, "info", "-f", "raw", "rbd:rbd/no-such-image")
    assert r.stderr == ("blkimg: Could not open 'rbd:rbd/no-such-image': "
                        "error reading header from no-such-image: No such "
                        "file or directory\n")


def test_key_secret(run, blkimg, qemu_img, ceph, shared_img):
    """key-secret names a secret object whose bytes librados gets as the
    key, in base64, as QEMU hands them over (the test cluster runs without
    cephx, so any key is taken); a secret that is not defined, or is not
    a secret, is refused in qemu-img's words."""
    key = "AQBzNnZlAAAAABAAyH5Zx3Xc9S2Jm3tUOn3A0w=="
    opts = "driver=rbd,pool=rbd,image=%s,key-secret=sec0" % shared_img
    for obj in ("secret,id=sec0,data=" + key,
                "secret,id=sec0,format=base64,data=" + key.rstrip("=")):
        out = same(run, blkimg, qemu_img, "info", "--object", obj,
                   "--image-opts", opts)
        assert "virtual size: " in out
    for objs in ([], ["--object", "secret,id=other,data=x"],
                 ["--object", "tls-creds-psk,id=sec0,dir=/nonexistent,"
                  "endpoint=client"]):
        same(run, blkimg, qemu_img, "info", *objs, "--image-opts", opts,
             rc=1)


def test_cluster_down(run, blkimg, qemu_img, ceph):
    spec = "rbd:rbd/x:mon_host=127.0.0.1\\:1:client_mount_timeout=2"
    t = time.monotonic()
    r = run(blkimg, "info", "-f", "raw", spec, timeout=30)
    assert time.monotonic() - t < 20  # fails fast, no hang
    assert r.returncode == 1
    assert r.stderr == ("blkimg: Could not open '%s': error connecting: "
                        "Connection timed out\n" % spec)
    q = run(qemu_img, "info", "-f", "raw", spec, timeout=30)
    assert q.stderr == r.stderr.replace("blkimg:", "qemu-img:")


def test_zeroes_discard_flush(run, blkimg, blkimg_io, qemu_img, ceph):
    img = "rbd:rbd/" + name("io")
    run(qemu_img, "create", "-f", "raw", img, "16M", check=True)
    run(blkimg_io, "-f", "raw", "-c", "write -P 0x61 0 12M",
        "-c", "write -z 1M 1M", "-c", "discard 4M 4M",
        "-c", "write -z -u 8M 4M", "-c", "flush", img, check=True)
    for cmd in ("read -P 0x61 0 1M", "read -P 0 1M 1M",
                "read -P 0x61 2M 2M", "read -P 0 4M 8M",
                "read -P 0 12M 4M"):
        r = run("qemu-io", "-f", "raw", "-c", cmd, img, check=True)
        assert "Pattern verification failed" not in r.stdout, cmd
    m = json.loads(same(run, blkimg, qemu_img, "map", "-f", "raw",
                        "--output=json", img))
    # the discarded and unmapped objects are holes again
    assert [(e["start"], e["data"]) for e in m] == [(0, True), (4 * MiB,
                                                                False)]


def test_snapshot_create_apply_delete(run, blkimg, qemu_img, ceph):
    """qemu-img snapshot -c/-a/-d/-l on RBD: the same outputs, errors and
    exit codes from both tools, and the same image states after each
    (one tool's snapshot applied and deleted by the other)."""
    img = name("snap")
    spec = "rbd:rbd/" + img
    # qemu-img snapshot has no -f: the raw format named, not probed
    raw = "driver=raw,file.driver=rbd,file.pool=rbd,file.image=" + img

    def snap(*args):
        return ("snapshot", "--image-opts") + args + (raw,)
    run(qemu_img, "create", "-f", "raw", spec, "4M", check=True)
    try:
        io = ("qemu-io", "-f", "raw", "-c")
        run(*io, "write -P 0x11 0 1M", spec, check=True)
        run(blkimg, *snap("-c", "s1"), check=True)
        run(qemu_img, *snap("-c", "s2"), check=True)
        listing = same(run, blkimg, qemu_img, *snap("-l"))
        assert [ln.split()[0] for ln in listing.splitlines()[2:]] == \
            ["s1", "s2"], listing
        for tool, other in ((blkimg, qemu_img), (qemu_img, blkimg)):
            run(*io, "write -P 0x22 0 1M", spec, check=True)
            run(tool, *snap("-a", "s1"), check=True)
            run(*io, "read -P 0x11 0 1M", spec, check=True)
        # the errors: a taken name, an empty and an over-long one, and a
        # snapshot that is not there; the longest name there can be
        for args in (("-c", "s1"), ("-c", ""), ("-c", "x" * 128),
                     ("-a", "nosuch"), ("-d", "nosuch")):
            same(run, blkimg, qemu_img, *snap(*args), rc=1)
        run(blkimg, *snap("-c", "y" * 127), check=True)
        run(qemu_img, *snap("-d", "y" * 127), check=True)
        r = run(blkimg, *snap("-c", "s1"))
        assert r.stderr == ("blkimg: failed to create snap: File exists\n"
                            "blkimg: Could not create snapshot 's1': -17 "
                            "(File exists)\n"), r.stderr
        run(blkimg, *snap("-d", "s1"), check=True)
        run(qemu_img, *snap("-d", "s2"), check=True)
        assert same(run, blkimg, qemu_img, *snap("-l")) == ""
        # the protocol node itself, as --image-opts names it
        opts = "driver=rbd,pool=rbd,image=" + img
        run(blkimg, "snapshot", "--image-opts", "-c", "s3", opts, check=True)
        assert "s3" in run(qemu_img, *snap("-l")).stdout
        run(blkimg, "snapshot", "--image-opts", "-d", "s3", opts, check=True)
        same(run, blkimg, qemu_img, "snapshot", "--image-opts", "-d", "s3",
             opts, rc=1)
        # a snapshot opens read-only: no snapshot of it
        same(run, blkimg, qemu_img, "snapshot", "--image-opts", "-c", "s4",
             raw + ",file.snapshot=s1", rc=1)
    finally:
        subprocess.run(["rbd", "snap", "purge", "rbd/" + img],
                       capture_output=True, timeout=60)
        subprocess.run(["rbd", "rm", "rbd/" + img], capture_output=True,
                       timeout=60)
