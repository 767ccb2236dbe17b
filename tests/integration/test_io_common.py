# SPDX-License-Identifier: MIT
"""Helpers for the blkimg-io tests: run qemu-io and blkimg-io on identical
images and compare what they print, exit with and leave on disk."""
import os
import re
import shutil
import subprocess

# Timing of qemu-io's reports, in all three forms:
#   "512 bytes, 1 ops; 00.00 sec (1.466 MiB/sec and 3003.0030 ops/sec)"
#   "3 KiB, 1 ops; 0:00:01.25 (2.4 KiB/sec and 0.8000 ops/sec)"  (>= 1 s)
#   "512,1,0:00:00.00,792243.442,1547.350"                       (-C)
_TIMING = re.compile(
    r"^([0-9.]+ (?:bytes|[KMGTPE]iB), \d+ ops; )"
    r"(?:[0-9.]+ sec|\d+:\d\d:\d\d\.\d\d) \([^)]*\)$", re.M)
_CSV = re.compile(r"^(\d+,\d+,)\d+:\d\d:\d\d\.\d\d,[0-9.]+,[0-9.]+$", re.M)


def mask(s):
    s = _TIMING.sub(r"\1T", s)
    return _CSV.sub(r"\1T", s)


def as_blkimg(s):
    """qemu-io's output with the program name blkimg-io would print."""
    s = re.sub(r"^qemu-io: ", "blkimg-io: ", s, flags=re.M)
    return s.replace("qemu-io> ", "blkimg-io> ")


# ASan's one-time notice about coroutine stacks (an artifact of sanitizer
# builds, not output of the tool).
_ASAN_NOTICE = re.compile(
    r"^==\d+==WARNING: ASan doesn't fully support makecontext/swapcontext"
    r".*\n", re.M)


def run(argv, cwd, stdin=None, timeout=120, env=None):
    if env is not None:
        env = dict(os.environ, **env)
    cp = subprocess.run([str(a) for a in argv], cwd=str(cwd), env=env,
                        input=stdin if stdin is not None else None,
                        stdin=None if stdin is not None else
                        subprocess.DEVNULL,
                        capture_output=True, text=True, timeout=timeout)
    for bad in ("ERROR: AddressSanitizer", "runtime error:",
                "ERROR: LeakSanitizer"):
        assert bad not in cp.stderr, cp.stderr
    cp.stderr = _ASAN_NOTICE.sub("", cp.stderr)
    return cp


class Pair:
    """Two directories holding the same image files: q/ for qemu-io and
    b/ for blkimg-io, so that relative names in messages are the same."""

    def __init__(self, tmp_path, blkimg_io, qemu_io="qemu-io"):
        self.q = tmp_path / "q"
        self.b = tmp_path / "b"
        self.q.mkdir()
        self.b.mkdir()
        self.blkimg_io = blkimg_io
        self.qemu_io = qemu_io

    def create(self, name, size, fmt="raw", opts=None):
        argv = ["qemu-img", "create", "-q", "-f", fmt]
        if opts:
            argv += ["-o", opts]
        argv += [name, str(size)]
        subprocess.run(argv, cwd=str(self.q), check=True,
                       capture_output=True)
        shutil.copyfile(self.q / name, self.b / name)

    def put(self, name, data):
        for d in (self.q, self.b):
            (d / name).write_bytes(data)

    def run_both(self, args, stdin=None, env=None):
        q = run([self.qemu_io] + list(args), self.q, stdin, env=env)
        b = run([self.blkimg_io] + list(args), self.b, stdin, env=env)
        return q, b

    def compare(self, args, stdin=None, files=None, mask_timing=True,
                env=None):
        """Runs both tools and asserts equal stdout, stderr (program name
        substituted), exit code and resulting files. Returns the blkimg-io
        CompletedProcess."""
        q, b = self.run_both(args, stdin, env)
        qo, bo = as_blkimg(q.stdout), b.stdout
        qe, be = as_blkimg(q.stderr), b.stderr
        if mask_timing:
            qo, bo = mask(qo), mask(bo)
        ctx = "args=%r\n--- qemu-io stdout:\n%s--- blkimg-io stdout:\n%s" \
              "--- qemu-io stderr:\n%s--- blkimg-io stderr:\n%s" % (
                  args, q.stdout, b.stdout, q.stderr, b.stderr)
        assert bo == qo, ctx
        assert be == qe, ctx
        assert b.returncode == q.returncode, ctx
        for name in files or []:
            assert (self.b / name).read_bytes() == \
                (self.q / name).read_bytes(), "%s differs\n%s" % (name, ctx)
        return b


def cmds(*c):
    """-c arguments for each command."""
    out = []
    for x in c:
        out += ["-c", x]
    return out
