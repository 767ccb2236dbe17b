# SPDX-License-Identifier: MIT
"""LUKS-encrypted qcow2 images made by qemu-img: `blkimg info` shows what
qemu-img info shows (human and JSON, the LUKS header's ciphers, hashes and
key slots) without any key; everything that would touch data without
encrypt.key-secret is refused as qemu-img refuses it; a damaged LUKS header is refused cleanly
and the file is left unchanged."""
import hashlib
import json
import shutil

import pytest
from conftest import cached_dir, qemu_pbkdf2_retry

pytestmark = pytest.mark.qemu

SECRET = ["--object", "secret,id=s0,data=swordfish"]

VARIANTS = [
    "",
    "encrypt.cipher-alg=aes-128,encrypt.cipher-mode=cbc,"
    "encrypt.ivgen-alg=essiv,encrypt.ivgen-hash-alg=sha256",
    "encrypt.cipher-alg=twofish-256,encrypt.hash-alg=sha512",
    "encrypt.cipher-alg=cast5-128,encrypt.cipher-mode=ctr,"
    "encrypt.ivgen-alg=plain,encrypt.hash-alg=sha1",
]


def _create(qemu_img, path, extra):
    opts = "encrypt.format=luks,encrypt.key-secret=s0,encrypt.iter-time=10"
    if extra:
        opts += "," + extra
    cp = qemu_pbkdf2_retry([qemu_img, "create", "-q", "-f", "qcow2"] +
                           SECRET + ["-o", opts, str(path), "4M"])
    if cp.returncode != 0:
        pytest.fail("qemu-img create failed: " + cp.stderr)


@pytest.fixture(scope="module")
def images():
    """LUKS qcow2 images made once for every worker and run (PBKDF2 costs
    time: conftest.cached_dir), copied per test."""
    import pathlib

    def build(d):
        for i, extra in enumerate(VARIANTS):
            _create(shutil.which("qemu-img") or "qemu-img",
                    pathlib.Path(d) / ("v%d.qcow2" % i), extra)
    d = cached_dir("qcow2-luks|%r|%r" % (VARIANTS, SECRET), build)
    return {extra: d / ("v%d.qcow2" % i) for i, extra in enumerate(VARIANTS)}


def make(images, path, extra=""):
    shutil.copyfile(images[extra], path)


def sha(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


@pytest.mark.parametrize("extra", VARIANTS, ids=lambda v: v or "default")
def test_info_matches_qemu(run, qemu_img, blkimg, images, tmp_path, extra):
    img = tmp_path / "luks.qcow2"
    make(images, img, extra)
    for out in ([], ["--output=json"]):
        q = run([qemu_img, "info"] + out + [img], check=True)
        b = run([blkimg, "info"] + out + [img])
        assert b.returncode == 0, b.stderr
        assert b.stdout == q.stdout
        assert b.stderr == ""
    d = json.loads(b.stdout)
    enc = d["format-specific"]["data"]["encrypt"]
    assert d["encrypted"] is True and enc["format"] == "luks"
    assert len(enc["slots"]) == 8 and enc["slots"][0]["active"] is True


def test_info_second_keyslot_and_backing_chain(run, qemu_img, blkimg,
                                               images, tmp_path):
    img = tmp_path / "luks.qcow2"
    make(images, img)
    # a second active key slot, added by qemu-img amend
    cp = qemu_pbkdf2_retry(
        [qemu_img, "amend"] + SECRET +
        ["--object", "secret,id=s1,data=other", "--image-opts",
         "driver=qcow2,file.filename=%s,encrypt.key-secret=s0" % img,
         "-o", "encrypt.state=active,encrypt.new-secret=s1,"
         "encrypt.iter-time=10,encrypt.keyslot=3"])
    assert cp.returncode == 0, cp.stderr
    q = run([qemu_img, "info", "--output=json", img], check=True)
    b = run([blkimg, "info", "--output=json", img])
    assert b.returncode == 0, b.stderr
    assert b.stdout == q.stdout
    slots = json.loads(b.stdout)["format-specific"]["data"]["encrypt"]["slots"]
    assert [s["active"] for s in slots] == [True, False, False, True,
                                           False, False, False, False]
    # an unencrypted overlay over the encrypted image: --backing-chain
    top = tmp_path / "top.qcow2"
    run([qemu_img, "create", "-q", "-f", "qcow2", "-u", "-b", img, "-F",
         "qcow2", top, "4M"], check=True)
    q = run([qemu_img, "info", "-U", "--backing-chain", top])
    b = run([blkimg, "info", "-U", "--backing-chain", top])
    assert (b.returncode, b.stdout) == (q.returncode, q.stdout)


@pytest.mark.parametrize("cmd", [
    ["map", "IMG"],
    ["convert", "-O", "raw", "IMG", "OUT"],
    ["compare", "IMG", "IMG"],
    ["check", "IMG"],
    ["resize", "IMG", "8M"],
    ["snapshot", "-c", "s", "IMG"],
    ["amend", "-o", "lazy_refcounts=on", "IMG"],
], ids=lambda c: c[0])
def test_data_access_refused(run, qemu_img, blkimg, images, tmp_path, cmd):
    """Without encrypt.key-secret: qemu-img's words and exit code."""
    img = tmp_path / "luks.qcow2"
    make(images, img)
    before = sha(img)
    out = tmp_path / "out.raw"
    args = [str(img) if a == "IMG" else str(out) if a == "OUT" else a
            for a in cmd]
    q = run([qemu_img] + args)
    if out.exists():
        out.unlink()
    b = run([blkimg] + args)
    assert b.returncode == q.returncode and b.returncode != 0
    assert b.stderr == q.stderr.replace("qemu-img:", "blkimg:")
    assert "Parameter 'encrypt.key-secret' is required for cipher" in b.stderr
    assert sha(img) == before
    assert not out.exists() or out.stat().st_size == 0


def test_io_refused(run, qemu_io, blkimg_io, images, tmp_path):
    img = tmp_path / "luks.qcow2"
    make(images, img)
    before = sha(img)
    q = run([qemu_io, "-c", "write 0 4k", img])
    b = run([blkimg_io, "-c", "write 0 4k", img])
    assert b.returncode == q.returncode == 1
    assert b.stderr == q.stderr.replace("qemu-io:", "blkimg-io:")
    assert sha(img) == before


@pytest.mark.parametrize("offset,data,what", [
    (0, b"LUKX", "Volume is not in LUKS format"),
    (6, b"\x00\x02", "LUKS version 2 is not supported"),
    (40, b"xts\x00", "Unexpected cipher mode string format 'xts'"),
    (40, b"gcm-plain64\x00", "Cipher mode 'gcm' not supported"),
    (72, b"whirl\x00", "Hash algorithm 'whirl' not supported"),
    (108, b"\x00\x00\x00\x07",
     "Algorithm 'aes' with key size 3 bytes not supported"),
    (208, b"\x12\x34\x56\x78",
     "Keyslot 0 state (active/disable) is corrupted"),
])
def test_damaged_luks_header(run, qemu_img, blkimg, images, tmp_path, offset,
                             data, what):
    img = tmp_path / "luks.qcow2"
    make(images, img)
    info = json.loads(run([qemu_img, "info", "--output=json", img],
                          check=True).stdout)
    assert info["encrypted"]
    # the crypto header extension: type 0x0537be77, then offset and length
    with open(img, "rb") as f:
        head = f.read(65536)
    pos = head.index(bytes.fromhex("0537be77"))
    hdr_off = int.from_bytes(head[pos + 8:pos + 16], "big")
    with open(img, "r+b") as f:
        f.seek(hdr_off + offset)
        f.write(data)
    before = sha(img)
    b = run([blkimg, "info", img])
    assert b.returncode == 1
    assert b.stdout == ""
    # QEMU's words, as qemu-img says them
    assert b.stderr == "blkimg: Could not open '%s': %s\n" % (img, what)
    q = run([qemu_img, "info", img])
    assert q.stderr == "qemu-img: Could not open '%s': %s\n" % (img, what)
    assert sha(img) == before


def test_crypto_extension_out_of_file(run, blkimg, images, tmp_path):
    img = tmp_path / "luks.qcow2"
    make(images, img)
    with open(img, "rb") as f:
        head = f.read(65536)
    pos = head.index(bytes.fromhex("0537be77"))
    with open(img, "r+b") as f:
        f.seek(pos + 8)
        f.write((1 << 50).to_bytes(8, "big"))
    before = sha(img)
    b = run([blkimg, "info", img])
    assert b.returncode == 1 and b.stdout == ""
    assert "encryption header" in b.stderr
    assert sha(img) == before
