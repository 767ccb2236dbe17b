# SPDX-License-Identifier: MIT
"""The luks format (raw LUKS1) against qemu-img and qemu-io 7.2.

Images qemu-img makes, one per cipher/mode/IV generator/hash combination
QEMU accepts (a reasonable sample), are read by blkimg exactly as qemu-io
reads them; images blkimg makes are read by qemu-io; `info` (text and
JSON) and `measure` equal qemu-img's; key slots added or removed by one
tool open (or no longer open) with the other; secrets as data, file,
base64 and AES-encrypted with a keyid unlock the same images; a wrong or
missing secret, a damaged key-slot area and a header pointing outside
the file are refused in qemu-img's words with exit 1 and the file
unchanged; a plaintext pattern written through blkimg never reaches the
file; writes at unaligned offsets with -t none (O_DIRECT) land where
qemu-io reads them.

qemu-img times PBKDF2 on the CPU and sometimes finds no usable reading
("Unable to get accurate CPU usage"): its commands that time it are
retried (conftest.qemu_pbkdf2_retry).
"""
import base64
import hashlib
import json
import os
import pathlib
import shutil
import subprocess

import pytest
from conftest import cached_dir, qemu_pbkdf2_retry

pytestmark = pytest.mark.qemu

PW = "correct horse"
SECRET = ["--object", "secret,id=s0,data=" + PW]
MiB = 1 << 20

# (cipher-alg, cipher-mode, ivgen-alg, ivgen-hash-alg, hash-alg); None:
# QEMU's default. QEMU 7.2 itself asserts on 192-bit keys outside xts
# (key material not a whole number of sectors), so those stay xts.
COMBOS = [
    (None, None, None, None, None),
    ("aes-128", "cbc", "essiv", "sha256", "sha1"),
    ("aes-128", "ecb", "plain", None, "sha256"),
    ("aes-256", "ctr", "plain64", None, "sha512"),
    ("aes-192", "xts", "plain64", None, "sha224"),
    ("serpent-256", "xts", "plain64", None, "sha256"),
    ("serpent-128", "cbc", "essiv", "sha256", "ripemd160"),
    ("serpent-192", "xts", "plain", None, "sha384"),
    ("twofish-256", "cbc", "plain", None, "sha384"),
    ("twofish-128", "xts", "essiv", "sha256", "md5"),
    ("cast5-128", "cbc", "plain64", None, "md5"),
    ("cast5-128", "ctr", "essiv", "md5", "sha256"),
]

# guest patterns: (offset, length, byte)
PATTERNS = [(0, 65536, 0xab), (100000, 3333, 0xcd), (3 * MiB - 4096, 4096,
                                                      0x5e)]


def combo_id(c):
    return "-".join(x for x in c if x) or "default"


def combo_opts(c, secret="s0", iter_time=10):
    keys = ("cipher-alg", "cipher-mode", "ivgen-alg", "ivgen-hash-alg",
            "hash-alg")
    opts = ["key-secret=%s" % secret, "iter-time=%d" % iter_time]
    opts += ["%s=%s" % (k, v) for k, v in zip(keys, c) if v]
    return ",".join(opts)


def sha(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def json_name(path, secret="s0"):
    return 'json:{"driver": "luks", "key-secret": "%s", "file": ' \
           '{"driver": "file", "filename": "%s"}}' % (secret, path)


def image_opts(path, secret="s0"):
    return "driver=luks,key-secret=%s,file.filename=%s" % (secret, path)


def qemu_create(qemu_img, path, opts, size="3M", extra=()):
    cp = qemu_pbkdf2_retry([qemu_img, "create", "-q"] + list(extra) + SECRET +
                           ["-f", "luks", "-o", opts, str(path), size])
    if cp.returncode != 0:
        pytest.fail("qemu-img create failed: %s" % cp.stderr)


def io_cmds(patterns, verb):
    cmds = []
    for off, ln, byte in patterns:
        cmds += ["-c", "%s -P 0x%x %d %d" % (verb, byte, off, ln)]
    return cmds


@pytest.fixture(scope="module")
def qemu_images(qemu_img, qemu_io, tmp_path_factory):
    """One image per combination, made by qemu-img, patterns written by
    qemu-io; built once per worker."""

    def build(d):
        d = pathlib.Path(d)
        for c in COMBOS:
            p = d / ("%s.luks" % combo_id(c))
            qemu_create(qemu_img, p, combo_opts(c))
            subprocess.run([qemu_io] + SECRET + ["--image-opts"] +
                           io_cmds(PATTERNS, "write") + [image_opts(p)],
                           check=True, capture_output=True)

    return cached_dir("luks-qemu-%s" % qemu_img, build)


@pytest.mark.parametrize("combo", COMBOS, ids=combo_id)
def test_reads_qemu_images(run, blkimg, blkimg_io, qemu_img, qemu_images,
                           tmp_path, combo):
    img = qemu_images / ("%s.luks" % combo_id(combo))
    before = sha(img)
    # blkimg-io finds qemu-io's patterns, and zeroes elsewhere? no: the
    # rest of a new LUKS image is ciphertext of nothing in particular, so
    # only the patterns are checked
    b = run([blkimg_io, "-r"] + SECRET + ["--image-opts"] +
            io_cmds(PATTERNS, "read") + [image_opts(img)])
    assert b.returncode == 0, b.stderr
    assert "Pattern verification failed" not in b.stdout, b.stdout
    # the whole guest disk decrypts as qemu-img decrypts it
    qraw, braw = tmp_path / "q.raw", tmp_path / "b.raw"
    run([qemu_img, "convert"] + SECRET + ["-O", "raw", json_name(img), qraw],
        check=True)
    b = run([blkimg, "convert"] + SECRET + ["-O", "raw", json_name(img),
                                             braw])
    assert b.returncode == 0, b.stderr
    assert sha(qraw) == sha(braw)
    # info without a key, text and JSON, and with one
    for out in ([], ["--output=json"]):
        q = run([qemu_img, "info"] + out + [img], check=True)
        b = run([blkimg, "info"] + out + [img])
        assert (b.returncode, b.stdout) == (0, q.stdout), b.stderr
    q = run([qemu_img, "info"] + SECRET + [json_name(img)], check=True)
    b = run([blkimg, "info"] + SECRET + [json_name(img)])
    assert b.stdout == q.stdout
    assert sha(img) == before


def blkimg_create(run, blkimg, path, opts, size="3M", extra=()):
    cp = run([blkimg, "create"] + list(extra) + SECRET +
             ["-f", "luks", "-o", opts, path, size])
    assert cp.returncode == 0, cp.stderr
    return cp


# blkimg's images: a sample of the combinations (one per cipher family
# and mode at least)
BLKIMG_COMBOS = [COMBOS[i] for i in (0, 1, 8, 11)]


@pytest.mark.parametrize("combo", BLKIMG_COMBOS, ids=combo_id)
def test_qemu_reads_blkimg_images(run, blkimg, blkimg_io, qemu_img, qemu_io,
                                  tmp_path, combo):
    img = tmp_path / "b.luks"
    qemu_create(qemu_img, tmp_path / "dry.luks", combo_opts(combo))
    b = blkimg_create(run, blkimg, img, combo_opts(combo))
    # the "Formatting" line: the options in QEMU's order
    keys = ("key-secret", "cipher-alg", "cipher-mode", "ivgen-alg",
            "ivgen-hash-alg", "hash-alg", "iter-time")
    given = dict(kv.split("=") for kv in combo_opts(combo).split(","))
    line = " ".join("%s=%s" % (k, given[k]) for k in keys if k in given)
    assert b.stdout == "Formatting '%s', fmt=luks size=3145728 %s\n" % (
        img, line)
    assert os.path.getsize(img) == os.path.getsize(tmp_path / "dry.luks")
    w = run([blkimg_io] + SECRET + ["--image-opts"] +
            io_cmds(PATTERNS, "write") + [image_opts(img)])
    assert w.returncode == 0, w.stderr
    r = run([qemu_io, "-r"] + SECRET + ["--image-opts"] +
            io_cmds(PATTERNS, "read") + [image_opts(img)])
    assert r.returncode == 0, r.stderr
    assert "Pattern verification failed" not in r.stdout, r.stdout
    for out in ([], ["--output=json"]):
        q = run([qemu_img, "info"] + out + [img], check=True)
        b = run([blkimg, "info"] + out + [img])
        assert (b.returncode, b.stdout) == (0, q.stdout), b.stderr
    info = json.loads(b.stdout)["format-specific"]["data"]
    assert [s["active"] for s in info["slots"]] == [True] + [False] * 7
    assert info["slots"][0]["iters"] >= 1000
    assert info["master-key-iters"] >= 1000


def test_convert_to_and_from_luks(run, blkimg, qemu_img, tmp_path):
    src = tmp_path / "src.raw"
    data = os.urandom(2 * MiB + 4096)
    src.write_bytes(data)
    out = tmp_path / "out.luks"
    b = run([blkimg, "convert"] + SECRET +
            ["-f", "raw", "-O", "luks", "-o",
             "key-secret=s0,iter-time=10,cipher-alg=twofish-128", src, out])
    assert b.returncode == 0, b.stderr
    q = run([qemu_img, "compare"] + SECRET + ["-f", "raw", src,
                                               json_name(out)])
    assert q.returncode == 0, q.stdout + q.stderr
    back = tmp_path / "back.raw"
    b = run([blkimg, "convert"] + SECRET + ["-O", "raw", json_name(out),
                                             back])
    assert b.returncode == 0, b.stderr
    assert back.read_bytes() == data
    b = run([blkimg, "compare"] + SECRET + ["-f", "raw", src,
                                             json_name(out)])
    assert (b.returncode, b.stdout) == (0, "Images are identical.\n")
    # a qcow2 from the luks image
    qc = tmp_path / "x.qcow2"
    b = run([blkimg, "convert"] + SECRET + ["-O", "qcow2", json_name(out),
                                             qc])
    assert b.returncode == 0, b.stderr
    q = run([qemu_img, "compare", "-f", "raw", src, qc])
    assert q.returncode == 0, q.stdout


def test_convert_sparse_source(run, blkimg, qemu_img, tmp_path):
    """Zeroes of the source are written: a new LUKS image's unwritten
    sectors decrypt to noise, not zeroes (QEMU's has_zero_init is 0)."""
    src = tmp_path / "sparse.raw"
    with open(src, "wb") as f:
        f.truncate(4 * MiB)
        f.seek(1000000)
        f.write(b"hello")
    out = tmp_path / "sparse.luks"
    b = run([blkimg, "convert"] + SECRET +
            ["-f", "raw", "-O", "luks", "-o", "key-secret=s0,iter-time=10",
             src, out])
    assert b.returncode == 0, b.stderr
    q = run([qemu_img, "compare"] + SECRET + ["-f", "raw", src,
                                               json_name(out)])
    assert (q.returncode, q.stdout) == (0, "Images are identical.\n")


def test_plaintext_never_reaches_the_file(run, blkimg, blkimg_io, tmp_path):
    img = tmp_path / "p.luks"
    blkimg_create(run, blkimg, img, "key-secret=s0,iter-time=10", "2M")
    marker = b"PLAINTEXT-MARKER-0123456789abcdef"
    pat = tmp_path / "pat.raw"
    pat.write_bytes(marker * (MiB // len(marker)))
    b = run([blkimg, "convert"] + SECRET +
            ["-n", "-f", "raw", "-O", "luks", pat, json_name(img)])
    assert b.returncode == 0, b.stderr
    w = run([blkimg_io] + SECRET + ["--image-opts", "-c",
                                    "write -P 0x5a 1M 512k",
                                    image_opts(img)])
    assert w.returncode == 0, w.stderr
    raw = img.read_bytes()
    assert marker not in raw
    assert b"\x5a" * 64 not in raw
    # and the guest sees it
    r = run([blkimg_io, "-r"] + SECRET + ["--image-opts", "-c",
                                          "read -P 0x5a 1M 512k",
                                          image_opts(img)])
    assert "verification failed" not in r.stdout and r.returncode == 0


def test_unaligned_writes_direct(run, blkimg, blkimg_io, qemu_io, tmp_path):
    """Writes that start and end inside encryption sectors, through
    O_DIRECT (-t none), keep their neighbours and land where qemu-io
    reads them."""
    img = tmp_path / "u.luks"
    blkimg_create(run, blkimg, img, "key-secret=s0,iter-time=10", "1M")
    base = [(0, MiB, 0x11)]
    writes = [(1, 5, 0x22), (511, 2, 0x33), (4095, 4099, 0x44),
              (70001, 1000, 0x55), (MiB - 3, 3, 0x66)]
    model = bytearray([0x11]) * MiB
    for off, ln, byte in writes:
        model[off:off + ln] = bytes([byte]) * ln
    w = run([blkimg_io, "-t", "none"] + SECRET + ["--image-opts"] +
            io_cmds(base + writes, "write") + [image_opts(img)])
    assert w.returncode == 0, w.stderr
    out = tmp_path / "model.raw"
    out.write_bytes(bytes(model))
    got = tmp_path / "got.raw"
    # qemu-img's view of every byte
    run(["qemu-img", "convert"] + SECRET + ["-O", "raw", json_name(img), got],
        check=True)
    assert got.read_bytes() == bytes(model)
    # blkimg's own, through O_DIRECT too
    b = run([blkimg, "compare", "-T", "none"] + SECRET +
            ["-f", "raw", out, json_name(img)])
    assert (b.returncode, b.stdout) == (0, "Images are identical.\n")
    r = run([qemu_io, "-r", "-t", "none"] + SECRET + ["--image-opts"] +
            io_cmds(writes, "read") + [image_opts(img)])
    assert "verification failed" not in r.stdout and r.returncode == 0


# ------------------------------------------------------------ key slots


def test_key_slots_across_tools(run, blkimg, blkimg_io, qemu_img, qemu_io,
                                tmp_path):
    img = tmp_path / "k.luks"
    blkimg_create(run, blkimg, img, "key-secret=s0,iter-time=10", "1M")
    s1 = ["--object", "secret,id=s1,data=second"]
    s2 = ["--object", "secret,id=s2,data=third"]
    # blkimg adds slot 3; qemu opens with it
    b = run([blkimg, "amend"] + SECRET + s1 +
            ["--image-opts", image_opts(img), "-o",
             "state=active,new-secret=s1,keyslot=3,iter-time=10"])
    assert b.returncode == 0, b.stderr
    q = run([qemu_io, "-r"] + s1 + ["--image-opts", "-c", "read 0 512",
                                    image_opts(img, "s1")])
    assert q.returncode == 0 and "read 512/512" in q.stdout, q.stderr
    # qemu adds the next free slot (1); blkimg opens with it
    q = qemu_pbkdf2_retry([qemu_img, "amend"] + SECRET + s2 +
                          ["--image-opts", image_opts(img), "-o",
                           "state=active,new-secret=s2,iter-time=10"])
    assert q.returncode == 0, q.stderr
    b = run([blkimg_io, "-r"] + s2 + ["--image-opts", "-c", "read 0 512",
                                      image_opts(img, "s2")])
    assert b.returncode == 0 and "read 512/512" in b.stdout, b.stderr
    q = run([qemu_img, "info", "--output=json", img], check=True)
    b = run([blkimg, "info", "--output=json", img])
    assert b.stdout == q.stdout
    slots = json.loads(b.stdout)["format-specific"]["data"]["slots"]
    assert [s["active"] for s in slots] == [True, True, False, True,
                                           False, False, False, False]
    # blkimg erases the slots the old password opens (slot 0)
    b = run([blkimg, "amend"] + SECRET + s1 +
            ["--image-opts", image_opts(img, "s1"), "-o",
             "state=inactive,old-secret=s0"])
    assert b.returncode == 0, b.stderr
    q = run([qemu_io, "-r"] + SECRET + ["--image-opts", "-c", "read 0 512",
                                        image_opts(img)])
    assert q.returncode == 1
    assert "Invalid password, cannot unlock any keyslot" in q.stderr
    # qemu erases slot 1; blkimg no longer opens with its secret
    q = run([qemu_img, "amend"] + s1 + s2 +
            ["--image-opts", image_opts(img, "s1"), "-o",
             "state=inactive,keyslot=1"], check=True)
    b = run([blkimg_io, "-r"] + s2 + ["--image-opts", "-c", "read 0 512",
                                      image_opts(img, "s2")])
    assert b.returncode == 1
    assert b.stderr.endswith(
        "Invalid password, cannot unlock any keyslot\n"), b.stderr
    q = run([qemu_img, "info", "--output=json", img], check=True)
    b = run([blkimg, "info", "--output=json", img])
    assert b.stdout == q.stdout


@pytest.fixture(scope="module")
def one_slot(blkimg, tmp_path_factory):
    """An image blkimg made (one active slot, s0), for tests to copy."""
    img = tmp_path_factory.mktemp("luks-one") / "one.luks"
    subprocess.run([blkimg, "create", "-q"] + SECRET +
                   ["-f", "luks", "-o", "key-secret=s0,iter-time=10",
                    str(img), "1M"], check=True)
    return img


@pytest.mark.parametrize("opts", [
    "keyslot=1",
    "state=bogus",
    "state=active",
    "state=active,new-secret=s0,old-secret=s0",
    "state=active,new-secret=s0,keyslot=9",
    "state=active,new-secret=s0,keyslot=0",
    "state=inactive,keyslot=0",
    "state=inactive,keyslot=5",
    "state=inactive,keyslot=-1",
    "state=inactive",
    "state=inactive,new-secret=s0",
    "state=inactive,iter-time=10,keyslot=0",
    "state=inactive,old-secret=nope",
    "state=inactive,old-secret=s0",
    "state=active,new-secret=nope,iter-time=10",
])
def test_amend_refusals(run, blkimg, qemu_img, tmp_path, opts, one_slot):
    img = tmp_path / "a.luks"
    shutil.copy(one_slot, img)
    before = sha(img)
    args = ["amend"] + SECRET + ["--image-opts", image_opts(img), "-o", opts]
    q = run([qemu_img] + args)
    b = run([blkimg] + args)
    assert q.returncode == 1, q.stderr
    assert b.returncode == 1
    assert b.stderr.replace("blkimg:", "qemu-img:") == q.stderr
    assert sha(img) == before


# --------------------------------------------------------------- refusals


@pytest.fixture(scope="module")
def small(qemu_img, tmp_path_factory):
    def build(d):
        qemu_create(qemu_img, pathlib.Path(d) / "s.luks", "key-secret=s0,iter-time=10",
                    "1M")
    return cached_dir("luks-small-%s" % qemu_img, build) / "s.luks"


def both(run, blkimg, qemu_img, args):
    q = qemu_pbkdf2_retry([qemu_img] + args)
    b = run([blkimg] + args)
    return q, b


@pytest.mark.parametrize("case", [
    "wrong", "nosecret", "noparam", "notutf8",
])
def test_wrong_or_missing_secret(run, blkimg, blkimg_io, qemu_img, qemu_io,
                                 small, tmp_path, case):
    img = tmp_path / "w.luks"
    shutil.copy(small, img)
    before = sha(img)
    objs = {"wrong": ["--object", "secret,id=s0,data=nope"],
            "nosecret": [],
            "noparam": SECRET,
            "notutf8": ["--object", "secret,id=s0,data=/w==,format=base64"]}
    name = json_name(img) if case != "noparam" else str(img)
    for args in (["convert"] + objs[case] + ["-O", "raw", name,
                                             str(tmp_path / "o.raw")],
                 ["resize"] + objs[case] + [name, "2M"],
                 ["check"] + objs[case] + [name]):
        q, b = both(run, blkimg, qemu_img, args)
        assert (b.returncode, q.returncode) == (1, 1) or \
            b.returncode == q.returncode, (args, b.stderr, q.stderr)
        assert b.stderr.replace("blkimg:", "qemu-img:") == q.stderr, args
        assert not (tmp_path / "o.raw").exists()
    io = ["-c", "write 0 512"] + objs[case] + [name]
    q = run([qemu_io] + io)
    b = run([blkimg_io] + io)
    assert (b.returncode, b.stderr.replace("blkimg-io:", "qemu-io:")) == \
        (q.returncode, q.stderr)
    assert sha(img) == before


def patch(path, off, data):
    with open(path, "r+b") as f:
        f.seek(off)
        f.write(data)


@pytest.mark.parametrize("what", [
    "keyslot-area", "payload-past-end", "truncated", "stripes", "magic",
    "version", "mode", "slot-overlap", "payload-in-header", "iters",
])
def test_damaged_images(run, blkimg, blkimg_io, qemu_img, small, tmp_path,
                        what):
    img = tmp_path / "d.luks"
    shutil.copy(small, img)
    if what == "keyslot-area":
        patch(img, 4096 + 1000, os.urandom(512))
    elif what == "payload-past-end":
        patch(img, 104, (0x7fffff00).to_bytes(4, "big"))
    elif what == "truncated":
        os.truncate(img, 1 * MiB)
    elif what == "stripes":
        patch(img, 208 + 48 * 2 + 44, (3999).to_bytes(4, "big"))
    elif what == "magic":
        patch(img, 0, b"LUKX")
    elif what == "version":
        patch(img, 6, b"\x00\x07")
    elif what == "mode":
        patch(img, 40, b"xts-plain65:sha256\x00")
    elif what == "slot-overlap":
        patch(img, 208 + 48 * 5 + 40, (8).to_bytes(4, "big"))
    elif what == "payload-in-header":
        patch(img, 104, (2).to_bytes(4, "big"))
    elif what == "iters":
        patch(img, 164, bytes(4))
    before = sha(img)
    out = tmp_path / "o.raw"
    for args in (["info", img],
                 ["info", "--output=json", img],
                 ["convert"] + SECRET + ["-O", "raw", json_name(img), out],
                 ["check"] + SECRET + [json_name(img)]):
        args = [str(a) for a in args]
        q, b = both(run, blkimg, qemu_img, args)
        assert b.returncode == q.returncode, (args, b.stderr, q.stderr)
        assert b.stdout == q.stdout, args
        assert b.stderr.replace("blkimg:", "qemu-img:") == q.stderr, args
    assert not out.exists()
    assert sha(img) == before


# ---------------------------------------------------------------- secrets


def test_secret_forms_unlock(run, blkimg_io, qemu_io, small, tmp_path):
    """data, file, base64 and a keyid-encrypted secret: the same
    passphrase opens the image with both tools."""
    pwfile = tmp_path / "pw"
    pwfile.write_text(PW)
    b64 = base64.b64encode(PW.encode()).decode()
    b64file = tmp_path / "pw.b64"
    b64file.write_text(b64)
    # AES-256-CBC of the passphrase (PKCS#7 padding) with a random key
    key, iv = os.urandom(32), os.urandom(16)
    pad = 16 - len(PW) % 16
    ct = subprocess.run(["openssl", "enc", "-aes-256-cbc", "-K", key.hex(),
                         "-iv", iv.hex(), "-nosalt"],
                        input=PW.encode(), capture_output=True,
                        check=True).stdout
    assert len(ct) == len(PW) + pad
    forms = [
        ["--object", "secret,id=s0,file=%s" % pwfile],
        ["--object", "secret,id=s0,data=%s,format=base64" % b64],
        ["--object", "secret,id=s0,file=%s,format=base64" % b64file],
        ["--object", "secret,id=k0,data=%s,format=base64" %
         base64.b64encode(key).decode(),
         "--object", "secret,id=s0,data=%s,format=base64,keyid=k0,iv=%s" %
         (base64.b64encode(ct).decode(), base64.b64encode(iv).decode())],
    ]
    for objs in forms:
        for tool in (qemu_io, blkimg_io):
            cp = run([tool, "-r"] + objs + ["-c", "read 0 512",
                                            json_name(small)])
            assert cp.returncode == 0, (tool, objs, cp.stderr)
            assert "read 512/512" in cp.stdout


@pytest.mark.parametrize("obj", [
    "secret,id=x",
    "secret,id=x,data=a,file=/nonexistent",
    "secret,id=x,file=/nonexistent/pw",
    "secret,id=x,file=/",
    "secret,id=x,data=!!,format=base64",
    "secret,id=x,data=abc,format=hex",
    "secret,id=x,data=abc,bogus=1",
    "secret,data=abc",
    "secret,id=x,data=abc,keyid=nokey",
    "secret,id=x,data=abc,keyid=k32",
    "secret,id=x,data=abc,keyid=k32,iv=AAAA",
    "secret,id=x,data=abc,keyid=k32,iv=AAAAAAAAAAAAAAAAAAAAAA==",
    "secret,id=x,data=AAAAAAAAAAAAAAAAAAAAAA==,keyid=k32,"
    "iv=AAAAAAAAAAAAAAAAAAAAAA==,format=base64",
    "secret,id=x,data=abc,keyid=kshort,iv=AAAAAAAAAAAAAAAAAAAAAA==",
    "secret,id=k32,data=dup",
])
def test_secret_object_errors(run, blkimg, blkimg_io, qemu_img, qemu_io,
                              obj):
    """QEMU's checks and words for secret objects, and never an echo of
    the secret's data."""
    keys = ["--object", "secret,id=k32,data=%s,format=base64" %
            base64.b64encode(bytes(32)).decode(),
            "--object", "secret,id=kshort,data=short"]
    args = ["info"] + keys + ["--object", obj, "/dev/null"]
    q, b = both(run, blkimg, qemu_img, args)
    assert q.returncode == 1 and b.returncode == 1, (q.stderr, b.stderr)
    assert b.stderr.replace("blkimg:", "qemu-img:") == q.stderr
    io = keys + ["--object", obj, "-c", "quit", "/dev/null"]
    q = run([qemu_io] + io)
    b = run([blkimg_io] + io)
    assert b.returncode == q.returncode == 1
    assert b.stderr.replace("blkimg-io:", "qemu-io:") == q.stderr
    assert "dup" not in b.stderr or "dup" in q.stderr


def test_secret_not_echoed(run, blkimg, small, tmp_path):
    secret = "hunter2-do-not-print"
    cp = run([blkimg, "info", "--object",
              "secret,id=s0,data=%s,,bogus" % secret, json_name(small)])
    cp2 = run([blkimg, "convert", "--object", "secret,id=s0,data=" + secret,
               "-O", "raw", json_name(small, "nope"),
               str(tmp_path / "o.raw")])
    for c in (cp, cp2):
        assert secret not in c.stdout and secret not in c.stderr


# ------------------------------------------------------- create, measure


@pytest.mark.parametrize("opts", [
    "",
    "key-secret=nope",
    "key-secret=s0,cipher-alg=foo",
    "key-secret=s0,cipher-alg=3des",
    "key-secret=s0,cipher-mode=gcm",
    "key-secret=s0,ivgen-alg=essiv,ivgen-hash-alg=sha1",
    "key-secret=s0,cipher-alg=cast5-128,cipher-mode=cbc,ivgen-alg=essiv",
    "key-secret=s0,cipher-alg=cast5-128,cipher-mode=xts",
    "key-secret=s0,hash-alg=sha3",
    "key-secret=s0,iter-time=abc",
    "key-secret=s0,bogus=1",
])
def test_create_refusals(run, blkimg, qemu_img, tmp_path, opts):
    img = tmp_path / "c.luks"
    args = ["create"] + SECRET + ["-f", "luks"] + \
        (["-o", opts] if opts else []) + [str(img), "1M"]
    q = run([qemu_img] + args)
    assert q.returncode == 1 and not img.exists()
    b = run([blkimg] + args)
    assert (b.returncode, b.stdout) == (1, q.stdout)
    assert b.stderr.replace("blkimg:", "qemu-img:") == q.stderr
    assert not img.exists()


@pytest.mark.parametrize("opts", [
    "key-secret=s0",
    "key-secret=s0,cipher-alg=aes-128",
    "key-secret=s0,cipher-alg=aes-128,cipher-mode=cbc",
    "key-secret=s0,cipher-alg=cast5-128,cipher-mode=ctr",
    "key-secret=nope",
    "cipher-alg=aes-128",
])
def test_measure(run, blkimg, qemu_img, opts):
    # qemu-img times PBKDF2 for measure too (seconds at the default
    # iter-time); the size does not depend on it
    opts += ",iter-time=10"
    for size, out in ((["--size", "1M"], []),
                      (["--size", "1000"], ["--output=json"])):
        args = ["measure"] + SECRET + ["-O", "luks", "-o", opts] + size + out
        q, b = both(run, blkimg, qemu_img, args)
        assert (b.returncode, b.stdout) == (q.returncode, q.stdout)
        assert b.stderr.replace("blkimg:", "qemu-img:") == q.stderr


def test_create_preallocation_and_resize(run, blkimg, blkimg_io, qemu_img,
                                         qemu_io, tmp_path):
    img = tmp_path / "r.luks"
    blkimg_create(run, blkimg, img,
                  "key-secret=s0,iter-time=10,preallocation=falloc", "1M")
    dry = tmp_path / "dry.luks"
    qemu_create(qemu_img, dry, "key-secret=s0,iter-time=10,"
                "preallocation=falloc", "1M")
    assert os.path.getsize(img) == os.path.getsize(dry)
    assert os.stat(img).st_blocks == os.stat(dry).st_blocks
    run([blkimg_io] + SECRET + ["--image-opts", "-c", "write -P 7 0 1M",
                                image_opts(img)], check=True)
    b = run([blkimg, "resize"] + SECRET + [json_name(img), "+1M"])
    assert b.returncode == 0, b.stderr
    assert b.stdout == "Image resized.\n"
    q = run([qemu_img, "info", "--output=json", img], check=True)
    assert json.loads(q.stdout)["virtual-size"] == 2 * MiB
    r = run([qemu_io, "-r"] + SECRET + ["--image-opts", "-c",
                                        "read -P 7 0 1M", image_opts(img)])
    assert "verification failed" not in r.stdout and r.returncode == 0
    # shrinking wants --shrink, as in qemu-img
    q, b = both(run, blkimg, qemu_img, ["resize"] + SECRET +
                [json_name(img), "1M"])
    assert (b.returncode, b.stdout) == (q.returncode, q.stdout)
    assert b.stderr.replace("blkimg:", "qemu-img:") == q.stderr


@pytest.mark.parametrize("args", [
    ["create", "-f", "luks", "-o", "help"],
    ["amend", "-f", "luks", "-o", "help"],
])
def test_option_help(run, blkimg, qemu_img, args):
    q, b = both(run, blkimg, qemu_img, args)
    assert (b.returncode, b.stdout, b.stderr) == \
        (q.returncode, q.stdout, q.stderr.replace("qemu-img", "blkimg"))
