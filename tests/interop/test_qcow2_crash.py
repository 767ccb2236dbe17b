# SPDX-License-Identifier: MIT
"""Crash trials: a blkimg-io writer killed with SIGKILL at random moments
leaves a qcow2 image in which neither qemu-img check nor blkimg check
finds corruption (leaks are allowed), and data flushed before the kill
reads back intact."""
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


def blank(qemu_img, tmp_path, opts):
    """A new 64M qcow2 image with opts, made by qemu-img create once per
    test and opts (the trials start from copies of it)."""
    img = tmp_path / ("blank-%s.qcow2" % opts.replace(",", "-"))
    if not img.exists():
        subprocess.run([qemu_img, "create", "-q", "-f", "qcow2", "-o", opts,
                        img, "64M"], check=True)
    return img


def trial(blkimg, blkimg_io, qemu_img, qemu_io, tmp_path, seed, opts):
    rnd = random.Random(seed)
    img = str(tmp_path / ("c%d.qcow2" % seed))
    shutil.copyfile(blank(qemu_img, tmp_path, opts), img)
    # flushed base data first, then a storm of allocating writes, zero
    # writes, discards and flushes
    cmds = ["write -P 17 0 1M", "flush", "write -P 18 1M 4k"]
    for _ in range(300):
        off = rnd.randrange(2 << 20, 62 << 20, 512)
        ln = rnd.choice([512, 4096, 10000, 65536, 300000])
        k = rnd.random()
        if k < 0.75:
            cmds.append("write -P %d %d %d" % (rnd.randrange(1, 255), off, ln))
        elif k < 0.85:
            cmds.append("write -z %d %d" % (off, ln))
        elif k < 0.9:
            cmds.append("discard %d %d" % (off, ln))
        else:
            cmds.append("flush")
    argv = [blkimg_io, "-t", rnd.choice(["writeback", "none"])]
    for c in cmds:
        argv += ["-c", c]
    argv.append(img)
    p = subprocess.Popen(argv, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    time.sleep(rnd.uniform(0.0, 0.4))
    p.send_signal(signal.SIGKILL)
    out, _ = p.communicate()
    if "lazy_refcounts=on" in opts:
        # refcounts may lag behind: the dirty bit makes the next writer
        # repair them (QEMU does the same when it opens the image)
        for _ in range(50):
            cp = subprocess.run([blkimg_io, "-c", "flush", img],
                                capture_output=True, text=True)
            if "lock" not in cp.stderr:
                break
            time.sleep(0.1)
        assert cp.returncode == 0, (seed, cp.stdout, cp.stderr)
    for tool, args in ((qemu_img, ["check", "--output=json"]),
                       (blkimg, ["check", "--output=json"])):
        # io_uring drops a dead process's file references asynchronously:
        # its image lock may outlive it for a moment
        for _ in range(50):
            cp = subprocess.run([tool] + args + [img], capture_output=True,
                                text=True, timeout=120)
            if "lock" not in cp.stderr:
                break
            time.sleep(0.1)
        assert cp.returncode in (0, 3), (seed, tool, cp.stdout, cp.stderr)
        r = json.loads(cp.stdout)
        assert not r.get("corruptions"), (seed, tool, cp.stdout)
    # the 1 MiB written before the flush is intact once a later write was
    # reported (the flush finished before it)
    if b"at offset 1048576" in out:
        cp = subprocess.run([qemu_io, "-r", "-c", "read -P 17 0 1M", img],
                            capture_output=True, text=True)
        assert cp.returncode == 0 and "failed" not in cp.stdout, \
            (seed, cp.stdout, cp.stderr)
    os.unlink(img)


TRIALS = int(os.environ.get("BLKIMG_CRASH_TRIALS", "24"))

# Trials running at once: most of a trial is waiting (for the random
# moment of the kill, for the checks), so two overlap well even on 2 CPUs.
# (More would slow each writer down enough that fewer kills land late in
# the storm.)
PARALLEL = int(os.environ.get("BLKIMG_CRASH_PARALLEL", "2"))


def run_trials(blkimg, blkimg_io, qemu_img, qemu_io, tmp_path, cases):
    """Runs trial() for every (seed, opts) of cases, PARALLEL at a time
    (each on its own image); the first failure fails the test."""
    for opts in {o for _, o in cases}:
        blank(qemu_img, tmp_path, opts)
    with concurrent.futures.ThreadPoolExecutor(PARALLEL) as pool:
        futures = [pool.submit(trial, blkimg, blkimg_io, qemu_img, qemu_io,
                               tmp_path, seed, opts) for seed, opts in cases]
        try:
            for f in futures:
                f.result()
        finally:
            for f in futures:
                f.cancel()


@pytest.mark.parametrize("opts", ["cluster_size=4k", "cluster_size=64k",
                                  "cluster_size=512,refcount_bits=64",
                                  "lazy_refcounts=on,cluster_size=4k"])
def test_crash_trials(blkimg, blkimg_io, qemu_img, qemu_io, tmp_path, opts):
    run_trials(blkimg, blkimg_io, qemu_img, qemu_io, tmp_path,
               [(seed * 7 + len(opts), opts) for seed in range(TRIALS // 4)])


@pytest.mark.torture
def test_crash_trials_full(blkimg, blkimg_io, qemu_img, qemu_io, tmp_path):
    """The full suite's 200 trials."""
    opts = ["cluster_size=4k", "cluster_size=64k",
            "cluster_size=512,refcount_bits=64",
            "extended_l2=on,cluster_size=16k",
            "lazy_refcounts=on,cluster_size=4k"]
    cases = [(1000 + seed, opts[seed % 5]) for seed in range(200)]
    assert len(cases) >= 200
    run_trials(blkimg, blkimg_io, qemu_img, qemu_io, tmp_path, cases)
