# SPDX-License-Identifier: MIT
"""blkimg-io's reopen against qemu-io 7.2: read-only and read-write
switches, cache modes, qcow2 run-time options, every option error, a
reopen refused by another process's lock (the image stays usable as it
was), and the bytes the commands leave in the image."""
import hashlib
import shutil
import subprocess
import time

import pytest

pytestmark = pytest.mark.qemu

TIMING = r"[0-9.:]+(?: sec)? \(.*\)$"


def norm(text, img):
    import re
    text = text.replace(str(img), "IMG")
    # QEMU names the node by an internal counter, blkimg-io by its file
    text = re.sub(r"Read-only block node '[^']*'", "Read-only block node N",
                  text)
    text = text.replace("qemu-io:", "PROG:").replace("blkimg-io:", "PROG:")
    return re.sub(TIMING, "X", text, flags=re.M)


def sha(p):
    with open(p, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def both(blkimg_io, tmp_path, fmt, opts, cmds):
    out = []
    for tool in ("qemu-io", blkimg_io):
        img = tmp_path / ("img%d" % len(out))
        if fmt == "qcow2":
            subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", img,
                            "1M"], check=True)
        else:
            with open(img, "wb") as f:
                f.truncate(1 << 20)
        argv = [tool, "-f", fmt] + opts
        for c in cmds:
            argv += ["-c", c]
        cp = subprocess.run(argv + [str(img)], capture_output=True, text=True)
        out.append((cp.returncode, norm(cp.stdout, img),
                    norm(cp.stderr, img), sha(img)))
    return out


SEQUENCES = [
    (["-r"], ["reopen -w", "write -P 1 0 512", "reopen -r", "write 0 512",
              "read -P 1 0 512"]),
    ([], ["reopen -r -w", "reopen -c foo", "reopen x",
          "reopen -o read-only=on -r", "reopen -c none -o cache.direct=on",
          "reopen -o foo=bar", "reopen -o file.locking=off",
          "reopen -o cache.no-flush=on", "write 0 4k"]),
    ([], ["reopen -o driver=qcow2", "reopen -o driver=raw",
          "write -P 4 0 4k", "read -P 4 0 4k"]),
    ([], ["reopen -c none", "write -P 3 0 64k", "reopen -c writethrough",
          "read -P 3 0 64k", "reopen -c unsafe", "write -z 4k 4k",
          "reopen -c directsync -r", "read -P 0 4k 4k"]),
    ([], ["reopen -o read-only=on", "write 0 512", "reopen -o read-only=off",
          "write -P 7 512 512", "reopen -o discard=ignore",
          "discard 0 64k", "read -P 7 512 512"]),
    (["-t", "none"], ["reopen", "write -P 2 0 8k", "reopen -r",
                      "read -P 2 0 8k"]),
    ([], ["close", "reopen"]),
]


@pytest.mark.parametrize("fmt", ["raw", "qcow2"])
@pytest.mark.parametrize("opts,cmds", SEQUENCES,
                         ids=[str(i) for i in range(len(SEQUENCES))])
def test_reopen_sequences_match_qemu(blkimg_io, tmp_path, fmt, opts, cmds):
    q, b = both(blkimg_io, tmp_path, fmt, opts, cmds)
    assert b == q


def test_reopen_qcow2_options_match_qemu(blkimg_io, tmp_path):
    cmds = ["reopen -o lazy-refcounts=on,l2-cache-size=2M",
            "write -P 5 0 128k", "reopen -o pass-discard-request=off",
            "discard 0 64k", "reopen -o overlap-check=all",
            "read -P 5 64k 64k"]
    q, b = both(blkimg_io, tmp_path, "qcow2", [], cmds)
    assert b[:3] == q[:3]
    # both images check clean and read the same
    for i in range(2):
        img = tmp_path / ("img%d" % i)
        cp = subprocess.run(["qemu-img", "check", img], capture_output=True,
                            text=True)
        assert cp.returncode == 0, cp.stdout
    cp = subprocess.run(["qemu-img", "compare", tmp_path / "img0",
                         tmp_path / "img1"], capture_output=True, text=True)
    assert cp.returncode == 0, cp.stdout


def test_reopen_refused_by_a_lock_keeps_the_image(blkimg_io, tmp_path):
    img = tmp_path / "a.qcow2"
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", img, "1M"],
                   check=True)
    subprocess.run(["qemu-io", "-c", "write -P 9 0 4k", img], check=True,
                   capture_output=True)
    holder = subprocess.Popen(["qemu-io", "-r", "-c", "sleep 20000",
                               str(img)])
    try:
        time.sleep(0.5)
        before = sha(img)
        out = []
        for tool in ("qemu-io", blkimg_io):
            cp = subprocess.run([tool, "-r", "-c", "reopen -w", "-c",
                                 "read -P 9 0 4k", "-c", "write 0 512",
                                 str(img)], capture_output=True, text=True)
            out.append((cp.returncode, norm(cp.stdout, img),
                        norm(cp.stderr, img)))
        assert out[1] == out[0]
        assert 'Failed to get "write" lock' in out[1][2]
        assert "read 4096/4096 bytes at offset 0" in out[1][1]
        assert sha(img) == before
    finally:
        holder.kill()
        holder.wait()


def test_reopen_read_only_lets_a_reader_in(blkimg_io, tmp_path):
    """After reopen -r the write lock is gone: qemu-io opens the qcow2
    image read-only while blkimg-io still has it open (it could not
    before)."""
    img = tmp_path / "a.qcow2"
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", img, "1M"],
                   check=True)
    p = subprocess.Popen([blkimg_io], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    try:
        p.stdin.write("open -o driver=qcow2 %s\n" % img)
        p.stdin.flush()
        time.sleep(0.5)
        cp = subprocess.run(["qemu-io", "-r", "-c", "read 0 512", str(img)],
                            capture_output=True, text=True)
        assert cp.returncode != 0 and "lock" in cp.stderr
        p.stdin.write("reopen -r\n")
        p.stdin.flush()
        time.sleep(0.5)
        cp = subprocess.run(["qemu-io", "-r", "-c", "read 0 512", str(img)],
                            capture_output=True, text=True)
        assert cp.returncode == 0, cp.stderr
        p.stdin.write("quit\n")
        p.stdin.flush()
        p.wait(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 0
