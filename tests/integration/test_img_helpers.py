# SPDX-License-Identifier: MIT
"""Helpers for the blkimg-vs-qemu-img comparison tests (test_img_*.py).

Each comparison runs qemu-img and blkimg with the same arguments on
identical files (in two directories prepared the same way, or on one file
for read-only commands) and checks that stdout, stderr (with "qemu-img"
read as "blkimg") and the exit code are the same.
"""
import os
import re
import subprocess

from conftest import sanitizer_report

TIMING = re.compile(r"Run completed in [0-9.]+ seconds\.")


def norm_qemu(text):
    """qemu-img's text as blkimg prints it: the program name differs."""
    return text.replace("qemu-img", "blkimg")


def mask_timing(text):
    return TIMING.sub("Run completed in X seconds.", text)


def run(argv, cwd=None, timeout=120, env=None):
    full_env = None
    if env:
        full_env = dict(os.environ)
        full_env.update(env)
    cp = subprocess.run([str(a) for a in argv], cwd=cwd and str(cwd),
                        capture_output=True, text=True, timeout=timeout,
                        stdin=subprocess.DEVNULL, env=full_env)
    rep = sanitizer_report(cp.stderr)
    assert rep is None, "sanitizer: %s\n%s" % (rep, cp.stderr)
    return cp


def both(qemu_img, blkimg, args, cwd_q=None, cwd_b=None, timeout=120,
         env=None):
    """Runs the two tools; blkimg in cwd_b (default: cwd_q)."""
    cq = run([qemu_img] + list(args), cwd=cwd_q, timeout=timeout, env=env)
    cb = run([blkimg] + list(args), cwd=cwd_b if cwd_b is not None else cwd_q,
             timeout=timeout, env=env)
    return cq, cb


def assert_same(cq, cb, mask=None, what=""):
    """Same exit code, stdout and stderr (qemu-img's names as blkimg)."""
    qout, qerr = norm_qemu(cq.stdout), norm_qemu(cq.stderr)
    bout, berr = cb.stdout, cb.stderr
    if mask:
        qout, qerr, bout, berr = (mask(x) for x in (qout, qerr, bout, berr))
    detail = ("%s\n--- qemu-img (rc %d):\n%s%s\n--- blkimg (rc %d):\n%s%s" %
              (what, cq.returncode, qout, qerr, cb.returncode, bout, berr))
    assert bout == qout, "stdout differs: " + detail
    assert berr == qerr, "stderr differs: " + detail
    assert cb.returncode == cq.returncode, "exit code differs: " + detail


def compare(qemu_img, blkimg, args, cwd, mask=None, env=None):
    """Read-only command on the same files."""
    cq, cb = both(qemu_img, blkimg, args, cwd_q=cwd, env=env)
    assert_same(cq, cb, mask=mask, what=" ".join(str(a) for a in args))
    return cq, cb


def qemu(qemu_img, *args, cwd=None):
    cp = run([qemu_img] + [str(a) for a in args], cwd=cwd)
    assert cp.returncode == 0, cp.stderr
    return cp


def qemu_io(*args, cwd=None):
    cp = run(["qemu-io"] + [str(a) for a in args], cwd=cwd)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    return cp
