# SPDX-License-Identifier: MIT
"""Encrypted qcow2 images (encrypt.format=luks, and the legacy aes) read
and written through encrypt.key-secret, cross-checked with qemu-img and
qemu-io 7.2 on the same files: what one writes the other reads, byte for
byte; `qemu-img check` stays clean; the ciphertext never shows the
plaintext; a missing or wrong secret is refused in QEMU's words, exit 1,
the file unchanged; encrypted backing chains, each layer with its own
secret (backing.encrypt.key-secret)."""
import hashlib
import pathlib
import shutil
import subprocess

import pytest
from conftest import cached_dir, qemu_pbkdf2_retry

pytestmark = pytest.mark.qemu

OBJS = ["--object", "secret,id=s0,data=swordfish",
        "--object", "secret,id=s1,data=tuna",
        "--object", "secret,id=bad,data=herring"]

VARIANTS = {
    "default": "",
    "aes128-cbc-essiv": "encrypt.cipher-alg=aes-128,encrypt.cipher-mode=cbc,"
                        "encrypt.ivgen-alg=essiv,"
                        "encrypt.ivgen-hash-alg=sha256",
    "twofish-sha512": "encrypt.cipher-alg=twofish-256,encrypt.hash-alg=sha512",
    "cast5-ctr-plain": "encrypt.cipher-alg=cast5-128,encrypt.cipher-mode=ctr,"
                       "encrypt.ivgen-alg=plain,encrypt.hash-alg=sha1",
}

# what qemu-io writes into every image the module's fixture makes
PATTERN = ["write -P 0xa5 0 64k", "write -P 0x5a 100k 200k",
           "write -z 1M 128k", "write -P 0x3c 2047k 2k"]


def _qemu_img_create(args):
    cp = qemu_pbkdf2_retry(["qemu-img", "create", "-q", "-f", "qcow2"] +
                           OBJS + args)
    if cp.returncode != 0:
        pytest.fail("qemu-img create failed: " + cp.stderr)


def _qemu_io(opts, cmds):
    args = ["qemu-io"] + OBJS + ["--image-opts", opts]
    for c in cmds:
        args += ["-c", c]
    subprocess.run(args, check=True, capture_output=True)


def _luks_opts(extra, secret="s0"):
    o = "encrypt.format=luks,encrypt.key-secret=%s,encrypt.iter-time=10" % \
        secret
    return o + ("," + extra if extra else "")


def opts(img, secret="s0", extra=""):
    o = "driver=qcow2,file.filename=%s,encrypt.key-secret=%s" % (img, secret)
    return o + ("," + extra if extra else "")


@pytest.fixture(scope="module")
def images():
    """qemu-img's images, made once (PBKDF2 costs time), copied per test:
    one per cipher variant with PATTERN written by qemu-io, an encrypted
    backing chain (base s0, top s1) and a legacy aes image."""
    def build(d):
        d = pathlib.Path(d)
        for name, extra in VARIANTS.items():
            p = d / (name + ".qcow2")
            _qemu_img_create(["-o", _luks_opts(extra), str(p), "4M"])
            _qemu_io(opts(p), PATTERN)
        base, top = d / "base.qcow2", d / "top.qcow2"
        _qemu_img_create(["-o", _luks_opts(""), str(base), "4M"])
        _qemu_io(opts(base), ["write -P 0x11 0 1M"])
        _qemu_img_create(["-o", _luks_opts("", "s1"), "-b", "base.qcow2",
                          "-F", "qcow2", str(top)])
        _qemu_io(opts(top, "s1", "backing.encrypt.key-secret=s0"),
                 ["write -P 0x22 64k 1k"])
        aes = d / "aes.qcow2"
        _qemu_img_create(["-o", "encrypt.format=aes,encrypt.key-secret=s0",
                          str(aes), "4M"])
        _qemu_io(opts(aes), PATTERN)
    return cached_dir("qcow2-encrypt/1|%r|%r|%r" % (VARIANTS, PATTERN, OBJS),
                      build)


def copy(images, tmp_path, name):
    dst = tmp_path / (name + ".qcow2")
    shutil.copyfile(images / (name + ".qcow2"), dst)
    return dst


def sha(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def to_raw(run, tool, opt, out):
    run([tool, "convert"] + OBJS + ["--image-opts", opt, "-O", "raw", out],
        check=True)
    return out.read_bytes()


@pytest.mark.parametrize("name", list(VARIANTS) + ["aes"])
def test_read_qemu_image(run, qemu_img, blkimg, blkimg_io, images, tmp_path,
                         name):
    img = copy(images, tmp_path, name)
    o = opts(img)
    b = to_raw(run, blkimg, o, tmp_path / "b.raw")
    q = to_raw(run, qemu_img, o, tmp_path / "q.raw")
    assert b == q
    assert b[:65536] == b"\xa5" * 65536
    assert b[100 * 1024:300 * 1024] == b"\x5a" * 200 * 1024
    cmds = []
    for c in ["read -P 0xa5 0 64k", "read -P 0x5a 100k 200k",
              "read -P 0 1M 128k", "read -P 0x3c 2047k 2k",
              "read -P 0 3M 1M"]:
        cmds += ["-c", c]
    r = run([blkimg_io] + OBJS + ["--image-opts", o] + cmds)
    assert r.returncode == 0 and "Pattern verification failed" not in \
        r.stdout, r.stdout + r.stderr
    # map as qemu-img: no host offsets (the data is ciphertext), which
    # the human output refuses
    for cmd in (["map"], ["map", "--output=json"]):
        q = run([qemu_img] + cmd + OBJS + ["--image-opts", o])
        b = run([blkimg] + cmd + OBJS + ["--image-opts", o])
        assert (b.returncode, b.stdout) == (q.returncode, q.stdout)
        assert b.stderr == q.stderr.replace("qemu-img:", "blkimg:")
    c = run([blkimg, "compare"] + OBJS +
            ["--image-opts", o,
             "driver=raw,file.filename=%s" % (tmp_path / "q.raw")])
    assert c.returncode == 0 and c.stdout == "Images are identical.\n"


@pytest.mark.parametrize("name", ["default", "aes128-cbc-essiv", "aes"])
def test_qemu_reads_what_blkimg_writes(run, qemu_img, qemu_io, blkimg_io,
                                       images, tmp_path, name):
    img = copy(images, tmp_path, name)
    o = opts(img)
    cmds = ["write -P 0x61 3M 64k",       # new cluster
            "write -P 0x62 130560 1024",  # COW head and tail, in place
            "write -P 0x63 2100k 3k",     # allocating, COW from zeroes
            "write -z 0 4k", "discard 192k 64k", "write -P 0x64 1152k 1k"]
    args = [blkimg_io] + OBJS + ["--image-opts", o]
    for c in cmds:
        args += ["-c", c]
    run(args, check=True)
    ref = tmp_path / "ref.qcow2"
    shutil.copyfile(images / (name + ".qcow2"), ref)
    qargs = [qemu_io] + OBJS + ["--image-opts", opts(ref)]
    for c in cmds:
        qargs += ["-c", c]
    run(qargs, check=True)
    assert to_raw(run, qemu_img, o, tmp_path / "a.raw") == \
        to_raw(run, qemu_img, opts(ref), tmp_path / "b.raw")
    ck = run([qemu_img, "check"] + OBJS + ["--image-opts", o])
    assert ck.returncode == 0, ck.stdout + ck.stderr
    assert "No errors were found" in ck.stdout


def test_plaintext_not_in_file(run, blkimg_io, images, tmp_path):
    img = copy(images, tmp_path, "default")
    run([blkimg_io] + OBJS + ["--image-opts", opts(img), "-c",
                              "write -P 0x41 2M 64k"], check=True)
    data = img.read_bytes()
    assert b"\x41" * 512 not in data
    assert b"\xa5" * 512 not in data and b"\x5a" * 512 not in data


@pytest.mark.parametrize("off,length", [(1, 1), (511, 2), (65535, 3),
                                        (4097, 70000)])
def test_unaligned_writes_direct(run, qemu_img, blkimg_io, qemu_io, images,
                                 tmp_path, off, length):
    img = copy(images, tmp_path, "default")
    ref = tmp_path / "ref.qcow2"
    shutil.copyfile(img, ref)
    cmd = "write -P 0x77 %d %d" % (off, length)
    b = run([blkimg_io, "-t", "none"] + OBJS +
            ["--image-opts", opts(img), "-c", cmd,
             "-c", "read -P 0x77 %d %d" % (off, length)])
    assert b.returncode == 0 and "verification failed" not in b.stdout, \
        b.stdout + b.stderr
    run([qemu_io] + OBJS + ["--image-opts", opts(ref), "-c", cmd], check=True)
    assert to_raw(run, qemu_img, opts(img), tmp_path / "a.raw") == \
        to_raw(run, qemu_img, opts(ref), tmp_path / "b.raw")


def test_backing_chain(run, qemu_img, blkimg, blkimg_io, images, tmp_path):
    base = copy(images, tmp_path, "base")
    top = copy(images, tmp_path, "top")
    o = opts(top, "s1", "backing.encrypt.key-secret=s0")
    b = to_raw(run, blkimg, o, tmp_path / "b.raw")
    q = to_raw(run, qemu_img, o, tmp_path / "q.raw")
    assert b == q
    assert b[:65536] == b"\x11" * 65536 and b[65536:66560] == b"\x22" * 1024
    # a partial write into a cluster of the encrypted base: COW from it
    run([blkimg_io] + OBJS + ["--image-opts", o, "-c",
                              "write -P 0x33 200k 512"], check=True)
    q = to_raw(run, qemu_img, o, tmp_path / "q2.raw")
    assert q[200 * 1024:200 * 1024 + 512] == b"\x33" * 512
    assert q[192 * 1024:200 * 1024] == b"\x11" * 8192
    assert q[200 * 1024 + 512:256 * 1024] == b"\x11" * (56 * 1024 - 512)
    # without the backing file's secret: QEMU's words
    o2 = opts(top, "s1")
    q = run([qemu_img, "convert"] + OBJS +
            ["--image-opts", o2, "-O", "raw", tmp_path / "x.raw"])
    b = run([blkimg, "convert"] + OBJS +
            ["--image-opts", o2, "-O", "raw", tmp_path / "y.raw"])
    assert q.returncode == b.returncode == 1
    assert b.stderr.endswith("Could not open backing file: Parameter "
                             "'encrypt.key-secret' is required for cipher\n")
    assert sha(base) == sha(images / "base.qcow2")


@pytest.mark.parametrize("cmd", [
    ["info"], ["map", "--output=json"], ["check"], ["snapshot", "-l"],
    ["compare"],
    ["rebase", "-u", "-b", "base.qcow2", "-F", "qcow2"],
    ["convert", "-O", "raw"]])
@pytest.mark.parametrize("img", ["top", "default"])
def test_backing_secret_where_qemu_takes_it(run, qemu_img, blkimg, images,
                                            tmp_path, cmd, img):
    """backing.encrypt.key-secret is taken where qemu-img opens the backing
    file (convert, map, check, snapshot, compare), refused as a left-over
    option where it does not (info, rebase -u), and refused for an image
    with no backing file: same exit code and words as qemu-img."""
    copy(images, tmp_path, "base")
    src = copy(images, tmp_path, img)
    o = opts(src, "s1" if img == "top" else "s0",
             "backing.encrypt.key-secret=s0")
    tail = {"compare": [o], "convert": [tmp_path / "out.raw"]}.get(cmd[0],
                                                                    [])
    res = []
    for tool in (qemu_img, blkimg):
        res.append(run([tool] + cmd + OBJS + ["--image-opts", o] + tail,
                       cwd=tmp_path))
    q, b = res
    assert (b.returncode, b.stderr.replace("blkimg:", "qemu-img:")) == \
        (q.returncode, q.stderr), cmd
    if img == "default" or cmd[0] in ("info", "rebase"):
        # compare's exit code for an error is 2
        assert b.returncode == (2 if cmd[0] == "compare" else 1)
        assert len(b.stderr.splitlines()) == 1
    else:
        assert b.returncode == 0


@pytest.mark.parametrize("how", ["missing", "wrong", "wrong-format"])
@pytest.mark.parametrize("tool", ["img", "io"])
def test_secret_refused(run, qemu_img, qemu_io, blkimg, blkimg_io, images,
                        tmp_path, how, tool):
    img = copy(images, tmp_path, "default")
    before = sha(img)
    if how == "missing":
        target = ["--image-opts", "driver=qcow2,file.filename=%s" % img]
    elif how == "wrong":
        target = ["--image-opts", opts(img, "bad")]
    else:
        target = ["--image-opts", opts(img, "s0", "encrypt.format=aes")]
    if tool == "img":
        cmd = lambda t: [t, "convert"] + OBJS + target + \
            ["-O", "raw", tmp_path / "o.raw"]
        q, b = run(cmd(qemu_img)), run(cmd(blkimg))
        assert b.stderr == q.stderr.replace("qemu-img:", "blkimg:", 1)
    else:
        cmd = lambda t: [t] + OBJS + target + ["-c", "write 0 4k"]
        q, b = run(cmd(qemu_io)), run(cmd(blkimg_io))
        assert b.stderr == q.stderr.replace("qemu-io:", "blkimg-io:", 1)
    assert b.returncode == q.returncode == 1
    assert b.stdout == ""
    assert sha(img) == before
    if how == "missing" and tool == "img":
        # by file name, as qemu-img says it
        q = run([qemu_img, "check", img])
        b = run([blkimg, "check", img])
        assert (b.returncode, b.stderr) == \
            (q.returncode, q.stderr.replace("qemu-img:", "blkimg:", 1))


def test_info_with_secret(run, qemu_img, blkimg, images, tmp_path):
    img = copy(images, tmp_path, "default")
    for out in ([], ["--output=json"]):
        q = run([qemu_img, "info"] + out + OBJS +
                ["--image-opts", opts(img)], check=True)
        b = run([blkimg, "info"] + out + OBJS + ["--image-opts", opts(img)])
        assert (b.returncode, b.stdout) == (0, q.stdout)


def header_fields(path):
    """crypt_method, L1 offset, refcount table offset and the crypto
    header extension's (offset, length) of a qcow2 file."""
    import struct
    d = path.read_bytes()[:65536]
    ver = struct.unpack(">I", d[4:8])[0]
    crypt, l1 = struct.unpack(">I", d[32:36])[0], struct.unpack(
        ">Q", d[40:48])[0]
    rt = struct.unpack(">Q", d[48:56])[0]
    off = struct.unpack(">I", d[100:104])[0] if ver == 3 else 72
    ext = None
    while True:
        t, ln = struct.unpack(">II", d[off:off + 8])
        if t == 0:
            break
        if t == 0x0537be77:
            ext = struct.unpack(">QQ", d[off + 8:off + 24])
        off += 8 + ((ln + 7) & ~7)
    return crypt, l1, rt, ext


def test_create_as_qemu(run, qemu_img, qemu_io, blkimg, images, tmp_path):
    img = tmp_path / "new.qcow2"
    b = run([blkimg, "create", "-f", "qcow2"] + OBJS +
            ["-o", _luks_opts(""), img, "4M"])
    assert b.returncode == 0, b.stderr
    assert b.stdout == (
        "Formatting '%s', fmt=qcow2 encrypt.format=luks "
        "encrypt.key-secret=s0 encrypt.iter-time=10 cluster_size=65536 "
        "extended_l2=off compression_type=zlib size=4194304 "
        "lazy_refcounts=off refcount_bits=16\n" % img)
    # QEMU's layout: the LUKS header in the clusters after the L1 table
    assert header_fields(img) == header_fields(images / "default.qcow2")
    for out in ([], ["--output=json"]):
        q = run([qemu_img, "info"] + out + [img], check=True)
        bi = run([blkimg, "info"] + out + [img])
        assert (bi.returncode, bi.stdout) == (0, q.stdout)
    ck = run([qemu_img, "check"] + OBJS + ["--image-opts", opts(img)])
    assert ck.returncode == 0 and "No errors were found" in ck.stdout
    # qemu-io reads and writes it with the same secret
    r = run([qemu_io] + OBJS + ["--image-opts", opts(img), "-c",
                                "write -P 0x12 1M 64k", "-c",
                                "read -P 0x12 1M 64k", "-c",
                                "read -P 0 0 1M"])
    assert r.returncode == 0 and "verification failed" not in r.stdout


@pytest.mark.parametrize("extra", [
    "encrypt.cipher-alg=aes-128,encrypt.cipher-mode=cbc,"
    "encrypt.ivgen-alg=essiv,encrypt.ivgen-hash-alg=sha256",
    "encrypt.cipher-alg=serpent-256,encrypt.hash-alg=sha512",
    "cluster_size=512",
    "compat=0.10",
], ids=["aes128-cbc-essiv", "serpent-sha512", "clusters-512", "v2"])
def test_create_variants_qemu_reads(run, qemu_img, qemu_io, blkimg,
                                    blkimg_io, tmp_path, extra):
    img = tmp_path / "new.qcow2"
    run([blkimg, "create", "-q", "-f", "qcow2"] + OBJS +
        ["-o", _luks_opts(extra), img, "4M"], check=True)
    run([blkimg_io] + OBJS + ["--image-opts", opts(img), "-c",
                              "write -P 0x21 4k 100k", "-c",
                              "write -P 0x22 3M 512"], check=True)
    r = run([qemu_io] + OBJS + ["--image-opts", opts(img), "-c",
                                "read -P 0x21 4k 100k", "-c",
                                "read -P 0x22 3M 512", "-c",
                                "read -P 0 0 4k"])
    assert r.returncode == 0 and "verification failed" not in r.stdout, \
        r.stdout + r.stderr
    ck = run([qemu_img, "check"] + OBJS + ["--image-opts", opts(img)])
    assert ck.returncode == 0 and "No errors were found" in ck.stdout
    q = run([qemu_img, "info", "--output=json", img], check=True)
    b = run([blkimg, "info", "--output=json", img])
    assert b.stdout == q.stdout


@pytest.mark.parametrize("o", [
    "encrypt.format=luks,encrypt.key-secret=s0,encrypt.cipher-alg=foo",
    "encrypt.format=luks",
    "encrypt.format=luks,encrypt.key-secret=s0,encrypt.iter-time=x",
    "encrypt.format=foo",
    "encrypt.key-secret=s0",
    "encryption=on,encrypt.format=luks",
    "encrypt.format=aes",
    "encrypt.format=luks,encrypt.key-secret=nope",
])
def test_create_refused(run, qemu_img, blkimg, tmp_path, o):
    img = tmp_path / "e.qcow2"
    q = run([qemu_img, "create", "-q", "-f", "qcow2"] + OBJS +
            ["-o", o, img, "1M"])
    assert not img.exists()
    b = run([blkimg, "create", "-q", "-f", "qcow2"] + OBJS +
            ["-o", o, img, "1M"])
    assert (b.returncode, b.stdout) == (q.returncode, q.stdout) and \
        b.returncode == 1
    assert b.stderr == q.stderr.replace("qemu-img:", "blkimg:")
    assert not img.exists()


@pytest.mark.parametrize("o", [
    "encrypt.format=luks,encrypt.key-secret=s0",
    "encrypt.format=luks,encrypt.key-secret=s0,encrypt.cipher-alg=aes-128,"
    "encrypt.cipher-mode=cbc",
    "encrypt.format=luks,encrypt.key-secret=s0,cluster_size=4k",
    "encrypt.format=luks,encrypt.key-secret=s0,preallocation=full",
    "encrypt.format=aes",
    "encrypt.format=luks",
    "encrypt.format=luks,encrypt.key-secret=nope",
])
@pytest.mark.parametrize("src", [None, "image"])
def test_measure(run, qemu_img, blkimg, images, tmp_path, o, src):
    what = ["--size", "1G"] if src is None else \
        ["--image-opts", opts(copy(images, tmp_path, "default"))]
    if "key-secret=s0" in o:
        # PBKDF2's timing costs qemu-img seconds; the size ignores it
        o += ",encrypt.iter-time=10"
    # text for a size, JSON for an image: each output form once per case
    for out in ([] if src is None else ["--output=json"],):
        args = ["measure"] + out + OBJS + ["-O", "qcow2", "-o", o] + what
        q = qemu_pbkdf2_retry([qemu_img] + args)
        b = run([blkimg] + args)
        assert (b.returncode, b.stdout) == (q.returncode, q.stdout), \
            q.stderr + b.stderr
        assert b.stderr == q.stderr.replace("qemu-img:", "blkimg:")


def test_convert_both_ways(run, qemu_img, blkimg, images, tmp_path):
    src = copy(images, tmp_path, "default")
    ref = to_raw(run, qemu_img, opts(src), tmp_path / "ref.raw")
    # encrypted to plain
    plain = tmp_path / "plain.qcow2"
    run([blkimg, "convert"] + OBJS + ["--image-opts", opts(src), "-O",
                                      "qcow2", plain], check=True)
    c = run([qemu_img, "compare", "-f", "qcow2", "-F", "raw", plain,
             tmp_path / "ref.raw"])
    assert c.returncode == 0, c.stdout
    # plain to encrypted, and raw to encrypted with other ciphers
    for i, extra in enumerate(["", VARIANTS["aes128-cbc-essiv"]]):
        enc = tmp_path / ("enc%d.qcow2" % i)
        run([blkimg, "convert"] + OBJS +
            ["-O", "qcow2", "-o", _luks_opts(extra, "s1"), plain, enc],
            check=True)
        assert to_raw(run, qemu_img, opts(enc, "s1"),
                      tmp_path / "out.raw") == ref
        ck = run([qemu_img, "check"] + OBJS + ["--image-opts",
                                               opts(enc, "s1")])
        assert ck.returncode == 0, ck.stdout
        assert b"\x5a" * 4096 not in enc.read_bytes()
    # -n into an existing encrypted image, named by its options
    run([blkimg, "convert", "-n"] + OBJS +
        ["--target-image-opts", "-f", "raw", tmp_path / "ref.raw",
         opts(tmp_path / "enc1.qcow2", "s1")], check=True)
    assert to_raw(run, qemu_img, opts(tmp_path / "enc1.qcow2", "s1"),
                  tmp_path / "out2.raw") == ref


def test_convert_compressed_refused(run, qemu_img, blkimg, tmp_path):
    src = tmp_path / "src.raw"
    src.write_bytes(b"\x01" * 65536)
    args = ["convert", "-c"] + OBJS + ["-f", "raw", "-O", "qcow2", "-o",
                                       _luks_opts(""), src]
    # qemu-img creates the target (timing PBKDF2) before it refuses
    q = qemu_pbkdf2_retry([qemu_img] + args + [tmp_path / "q.qcow2"])
    b = run([blkimg] + args + [tmp_path / "b.qcow2"])
    assert b.returncode == q.returncode == 1
    assert b.stderr == q.stderr.replace("qemu-img:", "blkimg:")


def test_aes_convert_and_write(run, qemu_img, qemu_io, blkimg, blkimg_io,
                               images, tmp_path):
    """The legacy AES: qemu-img's image converts to the same bytes; one
    blkimg creates (as qemu-img 7.2 still does) reads back in qemu-io."""
    src = copy(images, tmp_path, "aes")
    b = to_raw(run, blkimg, opts(src), tmp_path / "b.raw")
    assert b == to_raw(run, qemu_img, opts(src), tmp_path / "q.raw")
    img = tmp_path / "new-aes.qcow2"
    run([blkimg, "create", "-q", "-f", "qcow2"] + OBJS +
        ["-o", "encrypt.format=aes,encrypt.key-secret=s0", img, "1M"],
        check=True)
    assert header_fields(img)[0] == 1
    run([blkimg_io] + OBJS + ["--image-opts", opts(img), "-c",
                              "write -P 0x31 1k 70k"], check=True)
    r = run([qemu_io] + OBJS + ["--image-opts", opts(img), "-c",
                                "read -P 0x31 1k 70k", "-c",
                                "read -P 0 0 1k"])
    assert r.returncode == 0 and "verification failed" not in r.stdout
    assert b"\x31" * 512 not in img.read_bytes()


AMEND = [
    ("encrypt.state=active,encrypt.new-secret=s1,encrypt.iter-time=10",
     "s0"),
    ("encrypt.state=active,encrypt.new-secret=s1,encrypt.keyslot=5,"
     "encrypt.iter-time=10", "s0"),
    ("encrypt.state=active,encrypt.new-secret=s1,encrypt.keyslot=0,"
     "encrypt.iter-time=10", "s0"),
    ("encrypt.state=inactive,encrypt.keyslot=0", "s0"),
    ("encrypt.state=inactive,encrypt.old-secret=s0", "s0"),
    ("encrypt.state=active", "s0"),
    ("encrypt.new-secret=s1", "s0"),
    ("encrypt.state=active,encrypt.new-secret=s1,encrypt.iter-time=10",
     "bad"),
]


@pytest.mark.parametrize("o,secret", AMEND)
def test_amend_keyslots(run, qemu_img, blkimg, images, tmp_path, o, secret):
    img = copy(images, tmp_path, "default")
    ref = tmp_path / "ref.qcow2"
    shutil.copyfile(img, ref)
    args = lambda p: ["amend"] + OBJS + ["--image-opts", opts(p, secret),
                                         "-o", o]
    q = qemu_pbkdf2_retry([qemu_img] + args(ref))
    b = run([blkimg] + args(img))
    assert (b.returncode, b.stdout) == (q.returncode, q.stdout)
    assert b.stderr == q.stderr.replace("qemu-img:", "blkimg:").replace(
        str(ref), str(img))
    qi = run([qemu_img, "info", "--output=json", ref], check=True).stdout
    bi = run([qemu_img, "info", "--output=json", img], check=True).stdout
    import json
    slots = lambda t: [s["active"] for s in json.loads(t)[
        "format-specific"]["data"]["encrypt"]["slots"]]
    assert slots(bi) == slots(qi)
    if b.returncode == 0 and "new-secret" in o:
        # the new passphrase opens the image (to the same data)
        assert to_raw(run, qemu_img, opts(img, "s1"), tmp_path / "a.raw") \
            == to_raw(run, qemu_img, opts(ref, "s0"), tmp_path / "b.raw")


def test_amend_aes_and_plain_refused(run, qemu_img, blkimg, images,
                                     tmp_path):
    img = copy(images, tmp_path, "aes")
    plain = tmp_path / "plain.qcow2"
    run([qemu_img, "create", "-q", "-f", "qcow2", plain, "1M"], check=True)
    for p, o in ((img, opts(img)),
                 (plain, "driver=qcow2,file.filename=%s" % plain)):
        before = sha(p)
        args = ["amend"] + OBJS + ["--image-opts", o, "-o",
                                   "encrypt.state=inactive,encrypt.keyslot=0"]
        q, b = run([qemu_img] + args), run([blkimg] + args)
        assert b.returncode == q.returncode != 0
        assert b.stderr == q.stderr.replace("qemu-img:", "blkimg:")
        assert sha(p) == before


@pytest.mark.parametrize("compat", ["1.1", "0.10"])
def test_unaligned_zero_writes(run, qemu_img, qemu_io, blkimg, blkimg_io,
                               tmp_path, compat):
    """Zero writes off encryption sectors: the sectors around them are
    rewritten encrypted (v2 images have no zero clusters at all)."""
    img, ref = tmp_path / "z.qcow2", tmp_path / "ref.qcow2"
    run([blkimg, "create", "-q", "-f", "qcow2"] + OBJS +
        ["-o", _luks_opts("compat=" + compat), img, "1M"], check=True)
    shutil.copyfile(img, ref)
    cmds = []
    for c in ["write -P 0x55 0 128k", "write -z 100 200",
              "write -z 65000 70000", "write -z 200k 3k",
              "discard 0 4k"]:
        cmds += ["-c", c]
    run([blkimg_io] + OBJS + ["--image-opts", opts(img)] + cmds, check=True)
    run([qemu_io] + OBJS + ["--image-opts", opts(ref)] + cmds, check=True)
    assert to_raw(run, qemu_img, opts(img), tmp_path / "a.raw") == \
        to_raw(run, qemu_img, opts(ref), tmp_path / "b.raw")
    ck = run([qemu_img, "check"] + OBJS + ["--image-opts", opts(img)])
    assert ck.returncode == 0, ck.stdout
