# SPDX-License-Identifier: MIT
"""Hostile qcow2 images: every damaged header is refused with one clear
line and exit code 1; damaged tables fail cleanly when used; nothing
crashes, hangs, allocates without bound or writes to the file."""
import hashlib
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "hostile"))
import qcow2gen  # noqa: E402

pytestmark = pytest.mark.qemu


@pytest.fixture(scope="module")
def base_image(tmp_path_factory):
    import subprocess
    d = tmp_path_factory.mktemp("hostile")
    p = str(d / "base.qcow2")
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", p, "1M"],
                   check=True)
    subprocess.run(["qemu-io", "-c", "write -P 1 0 128k", "-c",
                    "write -c -P 2 256k 64k", p], check=True,
                   capture_output=True)
    with open(p, "rb") as f:
        return f.read()


def _cases():
    # the generator needs the base image; parametrize by index and name
    import subprocess
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "b.qcow2")
        subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", p, "1M"],
                       check=True)
        subprocess.run(["qemu-io", "-c", "write -P 1 0 128k", "-c",
                        "write -c -P 2 256k 64k", p], check=True,
                       capture_output=True)
        with open(p, "rb") as f:
            base = f.read()
    return qcow2gen.cases(base)


CASES = _cases()
# cases that check reports as corrupt instead of refusing to open
CHECK_REPORTS = {"reftable-past-eof", "l1-offset-past-eof", "reftable-zero"}
# the snapshot table is the check's to read (QEMU's
# qcow2_check_read_snapshot_table): its findings in qemu-img check's words
SNAPSHOT_CHECK = {"snapshots-too-many", "snapshots-unaligned",
                  "snapshots-past-eof"}


def sha(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


# a bounded address space: a huge allocation fails instead of swapping
def limit_memory():
    import resource
    lim = 2 << 30
    resource.setrlimit(resource.RLIMIT_AS, (lim, lim))


def run_limited(cmd, cwd, sanitized=False):
    """Runs cmd with a 2 GiB address space limit (not under ASan, which
    reserves terabytes of shadow memory)."""
    import subprocess
    cp = subprocess.run([str(c) for c in cmd], capture_output=True, text=True,
                        timeout=60, cwd=cwd,
                        preexec_fn=None if sanitized else limit_memory,
                        stdin=subprocess.DEVNULL)
    assert cp.returncode >= 0, "killed by signal %d: %s" % (-cp.returncode,
                                                            cmd)
    for bad in ("Sanitizer", "runtime error:", "Segmentation"):
        assert bad not in cp.stderr, cp.stderr
    return cp


@pytest.mark.parametrize("idx", range(len(CASES)),
                         ids=[c[0] for c in CASES])
def test_hostile(blkimg, blkimg_io, tmp_path, sanitized, idx):
    name, data, expect = CASES[idx]
    img = str(tmp_path / (name + ".qcow2"))
    with open(img, "wb") as f:
        f.write(data)
    before = sha(img)
    cwd = str(tmp_path)
    cmds = [
        [blkimg, "info", "-f", "qcow2", img],
        [blkimg, "info", "-f", "qcow2", "--output=json", img],
        [blkimg, "map", "-f", "qcow2", "--output=json", img],
        [blkimg, "check", "-f", "qcow2", img],
        [blkimg_io, "-r", "-f", "qcow2", "-c", "read 0 1M", img],
    ]
    for cmd in cmds:
        cp = run_limited(cmd, cwd, sanitized)
        if name in CHECK_REPORTS and cmd[1] == "check":
            # opened for checking, tables past the end of the file (read
            # as zeroes) and a missing refcount table are the check's
            # findings, with qemu-img check's words
            q = run_limited(["qemu-img", "check", "-f", "qcow2", img], cwd)
            assert cp.returncode == q.returncode == 2, cp.stderr
            assert cp.stderr == q.stderr, cp.stderr
        elif name in SNAPSHOT_CHECK and cmd[1] == "check":
            q = run_limited(["qemu-img", "check", "-f", "qcow2", img], cwd)
            assert cp.returncode == q.returncode, (cp.stderr, q.stderr)
            assert cp.stdout == q.stdout, cp.stdout
            assert cp.stderr.replace("blkimg:", "qemu-img:") == q.stderr, \
                cp.stderr
        elif name == "crypt-aes" and cmd[1] == "info":
            # info opens for metadata only, as qemu-img info does; every
            # command that touches data is refused below
            assert cp.returncode == 0, cp.stderr
            assert ("encrypted: yes" in cp.stdout or
                    '"encrypted": true' in cp.stdout), cp.stdout
        elif expect is not None:
            if name == "crypt-luks" and cmd[1] == "info":
                # info parses the LUKS header, which this image lacks
                # (qemu-img info 7.2 crashes on it)
                expect_here = "Missing CRYPTO header for crypt method 2"
            else:
                expect_here = expect
            assert cp.returncode == 1, (cmd, cp.stdout, cp.stderr)
            lines = cp.stderr.strip().splitlines()
            assert len(lines) == 1, cp.stderr
            assert expect_here in lines[0], lines[0]
            assert cp.stdout == "", cp.stdout
        else:
            # either works or fails with a message, no stack of errors
            if cp.returncode != 0:
                assert (cp.stderr + cp.stdout).strip(), cmd
        assert sha(img) == before, "%s modified the image" % cmd[1]
    if expect is not None:
        # a read-write open is refused the same way, still no write
        cp = run_limited([blkimg_io, "-f", "qcow2", "-c", "write 0 512",
                          img], cwd, sanitized)
        assert cp.returncode == 1, cp.stdout + cp.stderr
        assert expect in cp.stderr, cp.stderr
        assert sha(img) == before
