# SPDX-License-Identifier: MIT
"""Crash trials for the foreign formats (issue 10): a blkimg-io writer
doing allocating writes to a vmdk, vhdx, vpc or vdi image is killed with
SIGKILL at a random moment. Afterwards qemu-img check and blkimg check
(where qemu-img checks the format: not vpc) find no corruption (leaks
are allowed), and the image, read by qemu-img, holds every write that
completed before the last flush known to have finished, byte for byte
against a model (the pattern of tests/interop/test_qcow2_crash.py)."""
import concurrent.futures
import json
import os
import random
import shutil
import signal
import subprocess
import time

import pytest

pytestmark = pytest.mark.qemu

MiB = 1 << 20
SIZE = 64 * MiB

# id: (format, create options, whether qemu-img checks it)
FORMATS = {
    "vmdk": ("vmdk", "subformat=monolithicSparse", True),
    "vhdx": ("vhdx", "subformat=dynamic,block_size=1M", True),
    "vpc": ("vpc", "subformat=dynamic", False),
    "vdi": ("vdi", "static=off", True),
}


def blank(qemu_img, tmp_path, key):
    fmt, opts, _ = FORMATS[key]
    img = tmp_path / ("blank.%s" % key)
    if not img.exists():
        subprocess.run([qemu_img, "create", "-q", "-f", fmt, "-o", opts, img,
                        str(SIZE)], check=True)
    return img


def storm(rnd, size):
    """The writer's commands: flushed base data, then allocating writes,
    zero writes and flushes. Returns [(kind, off, len, byte)]."""
    cmds = [("write", 0, MiB, 17), ("flush", 0, 0, 0),
            ("write", MiB, 4096, 18)]
    for _ in range(200):
        off = rnd.randrange(2 * MiB, size - 300000, 512)
        ln = rnd.choice([512, 4096, 10000, 65536, 300000, 2 * MiB + 512])
        ln = min(ln, size - off)
        k = rnd.random()
        if k < 0.8:
            cmds.append(("write", off, ln, rnd.randrange(1, 255)))
        elif k < 0.9:
            cmds.append(("zero", off, ln, 0))
        else:
            cmds.append(("flush", 0, 0, 0))
    return cmds


def command(c):
    kind, off, ln, byte = c
    if kind == "flush":
        return "flush"
    if kind == "zero":
        return "write -z %d %d" % (off, ln)
    return "write -P %d %d %d" % (byte, off, ln)


def wait_unlocked(argv):
    """Runs argv, again while the image lock of the killed writer is
    still held (io_uring drops a dead process's files asynchronously)."""
    for _ in range(50):
        cp = subprocess.run(argv, capture_output=True, text=True,
                            timeout=120)
        if "lock" not in cp.stderr:
            break
        time.sleep(0.1)
    return cp


def expected(cmds, done, size):
    """(model, uncertain): the image's bytes as the writes before the
    last flush known to be finished left them, and the byte ranges the
    later writes may have changed. done: how many data commands printed
    their result (at least that many finished; a flush is known finished
    when a later data command printed)."""
    seen, known = 0, len(cmds)
    for i, c in enumerate(cmds):
        if c[0] != "flush":
            if seen == done:
                known = i
                break
            seen += 1
    flushed = max([i for i, c in enumerate(cmds[:known]) if c[0] == "flush"],
                  default=-1)
    model = bytearray(size)
    for kind, off, ln, byte in cmds[:flushed + 1]:
        if kind != "flush":
            model[off:off + ln] = bytes([byte]) * ln
    uncertain = [(off, ln) for kind, off, ln, _ in cmds[flushed + 1:]
                 if kind != "flush"]
    return model, uncertain


def trial(blkimg, blkimg_io, qemu_img, tmp_path, seed, key):
    fmt, _, checked = FORMATS[key]
    rnd = random.Random(seed)
    img = str(tmp_path / ("c%d.%s" % (seed, key)))
    shutil.copyfile(blank(qemu_img, tmp_path, key), img)
    # (vpc rounds the size to its disk geometry)
    info = subprocess.run([qemu_img, "info", "--output=json", img],
                          capture_output=True, text=True, check=True)
    size = json.loads(info.stdout)["virtual-size"]
    cmds = storm(rnd, size)
    # line-buffered output: every finished write is seen before the kill
    argv = ["stdbuf", "-oL", blkimg_io, "-f", fmt, "-t",
            rnd.choice(["writeback", "none"])]
    for c in cmds:
        argv += ["-c", command(c)]
    argv.append(img)
    p = subprocess.Popen(argv, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    # (flushes take long on a loaded disk: late kills too)
    time.sleep(rnd.uniform(0.05, 1.5))
    p.send_signal(signal.SIGKILL)
    out, err = p.communicate()
    lines = out.decode().splitlines()
    assert not [l for l in lines if "failed" in l], (seed, out, err)
    done = len([l for l in lines if l.startswith("wrote")])

    if checked:
        for tool in (qemu_img, blkimg):
            cp = wait_unlocked([tool, "check", "-f", fmt, "--output=json",
                                img])
            assert cp.returncode in (0, 3), (seed, tool, cp.stdout,
                                             cp.stderr)
            r = json.loads(cp.stdout)
            assert not r.get("corruptions"), (seed, tool, cp.stdout)
    raw = img + ".raw"
    cp = wait_unlocked([qemu_img, "convert", "-f", fmt, "-O", "raw", img,
                        raw])
    assert cp.returncode == 0, (seed, cp.stderr)
    with open(raw, "rb") as f:
        data = f.read()
    assert len(data) == size, (seed, key, len(data))
    model, uncertain = expected(cmds, done, size)
    for off, ln in uncertain:
        model[off:off + ln] = data[off:off + ln]
    # the base data was flushed: it must be there once a later write
    # was seen finished
    assert done < 2 or data[:MiB] == bytes([17]) * MiB, (seed, key)
    if data != model:
        bad = next(i for i in range(size) if data[i] != model[i])
        pytest.fail("seed %d %s: byte %d is %d, not %d (%d writes done)" %
                    (seed, key, bad, data[bad], model[bad], done))
    os.unlink(raw)
    os.unlink(img)


TRIALS = int(os.environ.get("BLKIMG_CRASH_TRIALS", "24"))
PARALLEL = int(os.environ.get("BLKIMG_CRASH_PARALLEL", "2"))


@pytest.mark.parametrize("key", sorted(FORMATS))
def test_crash_trials(blkimg, blkimg_io, qemu_img, tmp_path, key):
    blank(qemu_img, tmp_path, key)
    with concurrent.futures.ThreadPoolExecutor(PARALLEL) as pool:
        futures = [pool.submit(trial, blkimg, blkimg_io, qemu_img, tmp_path,
                               seed * 11 + len(key), key)
                   for seed in range(max(TRIALS // 4, 1))]
        try:
            for f in futures:
                f.result()
        finally:
            for f in futures:
                f.cancel()
