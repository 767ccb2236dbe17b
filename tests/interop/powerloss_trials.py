# SPDX-License-Identifier: MIT
"""Power-loss trials: a workload of writes, zero writes, discards,
compressed writes, flushes, snapshots or resizes runs through blkimg on a
qcow2 image behind the powerloss filter (powerloss:SEED:WRITES:FILE),
which cuts the power during its WRITES-th write and leaves the file as a
disk with a volatile cache might (writes since the last flush kept, lost
or torn, in any order). Then:

  - qemu-img check and blkimg check find no corruption (leaks are
    allowed) and agree;
  - every write that completed before the last completed flush reads back
    exactly (qemu-io), and so does everything the image held before.

Used by test_powerloss.py (a few crash points per workload in make check)
and on its own for long runs:

    python3 tests/interop/powerloss_trials.py BUILD_DIR [TRIALS] [FIRST]
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

TIMEOUT = 60
SIZE = "64M"
# where the write that follows each flush goes (no workload touches it)
MARKER = 63 * 1024 * 1024

# A workload: qemu-img create options, what qemu-io writes first (not
# through the filter), the steps run through the filter, and about how
# many writes they make (the crash points tried: 1 to that; a point past
# the last write is a trial without a crash). Steps:
#   ("write", pattern, offset, length)   ("zero", offset, length)
#   ("discard", offset, length)          ("cwrite", pattern, offset, length)
#   ("flush",)                           ("tool", argv...) a blkimg command
# Regions never overlap within a workload, so each has one expected value.
K = 1024
M = 1024 * 1024
WORKLOADS = {
    "alloc": ("", [], [
        ("write", 1, 0, 256 * K), ("flush",),
        ("write", 2, 1 * M, 64 * K), ("write", 3, 2 * M + 4 * K, 12 * K),
        ("flush",), ("write", 4, 8 * M, 1 * M), ("flush",),
        ("write", 5, 20 * M, 128 * K)], 24),
    "c512": ("cluster_size=512", [], [
        ("write", 1, 0, 64 * K), ("flush",), ("write", 2, 9 * M, 16 * K),
        ("flush",), ("write", 3, 17 * M, 4 * K), ("write", 4, 40 * M, 2 * K),
        ("flush",), ("write", 5, 50 * M, 8 * K)], 42),
    "zero_discard": ("cluster_size=4096",
                     [(7, 0, 1 * M), (8, 4 * M, 1 * M)], [
        ("zero", 0, 64 * K), ("flush",), ("discard", 4 * M, 128 * K),
        ("write", 1, 2 * M, 64 * K), ("flush",), ("zero", 512 * K, 8 * K),
        ("discard", 4 * M + 512 * K, 4 * K), ("flush",),
        ("write", 2, 6 * M, 16 * K)], 26),
    "compressed": ("", [], [
        ("cwrite", 1, 0, 128 * K), ("flush",), ("cwrite", 2, 1 * M, 64 * K),
        ("write", 3, 2 * M, 64 * K), ("flush",),
        ("cwrite", 4, 4 * M, 192 * K)], 18),
    "extl2": ("extended_l2=on", [(9, 0, 64 * K)], [
        ("write", 1, 128 * K, 4 * K), ("flush",),
        ("write", 2, 200 * K, 8 * K), ("zero", 16 * K, 4 * K), ("flush",),
        ("write", 3, 3 * M, 40 * K)], 14),
    "v2": ("compat=0.10,cluster_size=4096", [(6, 0, 256 * K)], [
        ("write", 1, 1 * M, 16 * K), ("flush",), ("zero", 64 * K, 8 * K),
        ("write", 2, 2 * M, 4 * K), ("flush",),
        ("write", 3, 5 * M, 64 * K)], 24),
    "reuse": ("", [(6, 0, 5 * M)], [
        ("discard", 0, 5 * M), ("write", 1, 16 * M, 4 * M), ("flush",),
        ("write", 2, 24 * M, 1 * M)], 12),
    "snapshot": ("cluster_size=4096", [(3, 0, 512 * K), (4, 2 * M, 64 * K)],
                 [("tool", "snapshot", "-c", "s1")], 9),
    "resize": ("cluster_size=512", [(5, 0, 256 * K)],
               [("tool", "resize", "-f", "qcow2", None, "+32M")], 6),
    "lazy": ("lazy_refcounts=on,cluster_size=4096", [(6, 0, 128 * K)], [
        ("write", 1, 1 * M, 64 * K), ("flush",),
        ("write", 2, 3 * M, 8 * K), ("write", 3, 5 * M + 4 * K, 4 * K),
        ("flush",), ("discard", 0, 64 * K), ("write", 4, 9 * M, 256 * K)],
        28),
}

# Workloads on images with lazy refcounts: the power fails with the dirty
# bit set and refcounts that may lag behind the L2 tables. Such an image
# is judged after the repair that opening it read-write makes, as QEMU
# makes it (check reports the crash as it left it; both tools must agree).
LAZY = {"lazy"}


# (reuse: a discard frees 5 MiB that the next allocation takes again,
# qcow2's flush before the reuse included.)
# Workloads that change refcounts and COPIED flags of many tables (a
# snapshot): a crash between the two leaves COPIED set on clusters whose
# refcount went up for a snapshot that never reached the snapshot table.
# qemu-img check counts those flags as corruptions; they are harmless (the
# extra reference is a leak, no snapshot shares the cluster) and -r all
# repairs them. QEMU's own order (refcounts, then the flags, then the
# table) leaves the same.
BENIGN_COPIED = {"snapshot"}
_COPIED = re.compile(r"^ERROR OFLAG_COPIED (L2|data) cluster: .* "
                     r"refcount=(\d+)$")


def _only_benign_copied(img, stderr):
    """The check found nothing but COPIED flags on clusters with refcount
    above 1, and the image lists no snapshot that could share them."""
    errs = [ln for ln in stderr.splitlines()
            if ln and not ln.startswith("Leaked cluster")]
    for ln in errs:
        m = _COPIED.match(ln)
        if not m or int(m.group(2)) < 2:
            return False
    snaps = _run(["qemu-img", "snapshot", "-l", img]).stdout
    return bool(errs) and not snaps.strip()


def _run(argv, cwd=None):
    return subprocess.run([str(a) for a in argv], capture_output=True,
                          text=True, timeout=TIMEOUT, cwd=cwd,
                          stdin=subprocess.DEVNULL)


def make_base(path, name):
    opts, prefill, _, _ = WORKLOADS[name]
    argv = ["qemu-img", "create", "-q", "-f", "qcow2"]
    if opts:
        argv += ["-o", opts]
    subprocess.run(argv + [path, SIZE], check=True)
    if prefill:
        io = ["qemu-io"]
        for pat, off, ln in prefill:
            io += ["-c", "write -P %d %d %d" % (pat, off, ln)]
        subprocess.run(io + [path], check=True, capture_output=True)


def _io_command(step):
    kind = step[0]
    if kind == "write":
        return "write -P %d %d %d" % step[1:]
    if kind == "cwrite":
        return "write -c -P %d %d %d" % step[1:]
    if kind == "zero":
        return "write -z %d %d" % step[1:]
    if kind == "discard":
        return "discard %d %d" % step[1:]
    return "flush"


_DONE = {"write": re.compile(r"^wrote \d+/\d+ bytes"),
         "cwrite": re.compile(r"^wrote \d+/\d+ bytes"),
         "zero": re.compile(r"^wrote \d+/\d+ bytes"),
         "discard": re.compile(r"^discard \d+/\d+ bytes")}


def completed_steps(steps, stdout):
    """Which io steps blkimg-io reported done, in order: each prints one
    line ("wrote ...", "discard ...", or "<op> failed: ..."), a flush its
    marker write's ("wrote 4096/4096 ..." when the flush worked)."""
    lines = [ln for ln in stdout.splitlines()
             if not re.match(r"^[0-9.]+ (bytes|[KMGTPE]iB), \d+ ops;", ln)]
    done = []
    for i, step in enumerate(steps):
        line = lines[i] if i < len(lines) else ""
        if step[0] == "flush":
            done.append(line.startswith("wrote 4096/4096 bytes"))
        else:
            done.append(bool(_DONE[step[0]].match(line)))
    return done


def durable_expectations(name, done):
    """(pattern, offset, length) that must read back after the trial: the
    prefill not touched by the steps, and each step completed before the
    last flush that completed."""
    _, prefill, steps, _ = WORKLOADS[name]
    last_flush = -1
    for i, step in enumerate(steps):
        if step[0] == "flush" and done[i] and all(done[:i]):
            last_flush = i
    touched = [(s[-2], s[-1]) for s in steps if s[0] != "flush"
               and s[0] != "tool"]
    expect = []
    for pat, off, ln in prefill:
        if not any(o < off + ln and off < o + l_ for o, l_ in touched):
            expect.append((pat, off, ln))
    for i, step in enumerate(steps[:last_flush + 1]):
        if step[0] in ("write", "cwrite"):
            expect.append(step[1:])
        elif step[0] in ("zero", "discard"):
            expect.append((0,) + step[1:])
    return expect


def run_trial(blkimg, blkimg_io, workdir, name, writes, seed):
    """One trial; returns a list of problems (empty: passed) and whether
    the power failed at all (False: the workload has fewer writes)."""
    base = os.path.join(workdir, "base-%s.qcow2" % name)
    if not os.path.exists(base):
        make_base(base, name)
    img = os.path.join(workdir, "img.qcow2")
    shutil.copy(base, img)
    target = "powerloss:%d:%d:%s" % (seed, writes, img)
    steps = WORKLOADS[name][2]
    label = "%s writes=%d seed=%d" % (name, writes, seed)
    if steps[0][0] == "tool":
        argv = [blkimg] + [a if a is not None else target
                           for a in steps[0][1:]]
        if None not in steps[0][1:]:
            argv.append(target)
        cp = _run(argv)
        done = []
        crashed = cp.returncode != 0
    else:
        argv = [blkimg_io, "-f", "qcow2"]
        for step in steps:
            argv += ["-c", _io_command(step)]
            if step[0] == "flush":
                # qemu-io's flush prints nothing, even when it fails: a
                # write after it tells (a read can be served from cached
                # metadata after the power is off; a write never is)
                argv += ["-c", "write -P 238 %d 4096" % MARKER]
        cp = _run(argv + [target])
        done = completed_steps(steps, cp.stdout)
        crashed = not all(done) or cp.returncode != 0
    problems = []
    if cp.returncode < 0 or cp.returncode >= 128:
        problems.append("%s: blkimg died (%d)" % (label, cp.returncode))
    if name in LAZY:
        problems += _repair_dirty(blkimg, blkimg_io, img, label)
    q = _run(["qemu-img", "check", img])
    b = _run([blkimg, "check", img])
    benign = (q.returncode == 2 and name in BENIGN_COPIED and
              _only_benign_copied(img, q.stderr))
    if q.returncode not in (0, 3) and not benign:
        problems.append("%s: qemu-img check exit %d:\n%s%s" %
                        (label, q.returncode, q.stdout, q.stderr))
    if b.returncode != q.returncode:
        problems.append("%s: blkimg check exit %d, qemu-img %d:\n%s%s" %
                        (label, b.returncode, q.returncode, b.stdout,
                         b.stderr))
    if benign:
        r = _run([blkimg, "check", "-r", "all", img])
        q2 = _run(["qemu-img", "check", img])
        if r.returncode != 0 or q2.returncode != 0:
            problems.append("%s: repair of the COPIED flags failed (%d), "
                            "qemu-img check then %d:\n%s%s" %
                            (label, r.returncode, q2.returncode, r.stderr,
                             q2.stderr))
    io = ["qemu-io", "-r", "-f", "qcow2"]
    for pat, off, ln in durable_expectations(name, done):
        io += ["-c", "read -P %d %d %d" % (pat, off, ln)]
    if len(io) > 4:
        r = _run(io + [img])
        if r.returncode != 0 or "failed" in r.stdout + r.stderr:
            problems.append("%s: durable data lost:\n%s%s\n(blkimg said:\n"
                            "%s%s)" % (label, r.stdout, r.stderr, cp.stdout,
                                       cp.stderr))
    return problems, crashed


def _dirty(img):
    """The qcow2 header's dirty bit (incompatible feature bit 0)."""
    with open(img, "rb") as f:
        f.seek(72)
        return int.from_bytes(f.read(8), "big") & 1 == 1


def _repair_dirty(blkimg, blkimg_io, img, label):
    """A dirty lazy-refcounts image: blkimg check and qemu-img check
    report it alike, then opening it read-write repairs it, in blkimg as
    in qemu-io (a copy), and both leave the dirty bit clear. Returns the
    problems."""
    if not _dirty(img):
        return []
    problems = []
    q = _run(["qemu-img", "check", img])
    b = _run([blkimg, "check", img])
    if b.returncode != q.returncode or not _dirty(img):
        problems.append("%s: dirty image: blkimg check exit %d, qemu-img "
                        "%d (dirty bit now %s):\n%s%s" %
                        (label, b.returncode, q.returncode, _dirty(img),
                         b.stdout, q.stdout))
    ref = img + ".qemu"
    shutil.copy(img, ref)
    try:
        for tool, path in ((blkimg_io, img), ("qemu-io", ref)):
            r = _run([tool, "-f", "qcow2", "-c", "flush", path])
            c = _run(["qemu-img", "check", path])
            if r.returncode != 0 or c.returncode != 0 or _dirty(path):
                problems.append("%s: reopening the dirty image with %s: "
                                "exit %d, then qemu-img check %d, dirty "
                                "%s:\n%s%s%s" %
                                (label, os.path.basename(tool),
                                 r.returncode, c.returncode, _dirty(path),
                                 r.stdout, r.stderr, c.stdout))
    finally:
        os.unlink(ref)
    return problems


def trial_plan(count, first=0):
    """(workload, writes, seed) for trial numbers first..first+count-1:
    the workloads in turn, each stepping through its crash points, every
    trial with its own seed (what survives, what is lost, what tears)."""
    names = sorted(WORKLOADS)
    plan = []
    for t in range(first, first + count):
        name = names[t % len(names)]
        writes = 1 + (t // len(names)) % WORKLOADS[name][3]
        plan.append((name, writes, t * 2654435761 % (1 << 31)))
    return plan


def main(argv):
    build = argv[1]
    count = int(argv[2]) if len(argv) > 2 else 1000
    first = int(argv[3]) if len(argv) > 3 else 0
    blkimg = os.path.join(build, "blkimg")
    blkimg_io = os.path.join(build, "blkimg-io")
    bad = crashed = 0
    with tempfile.TemporaryDirectory(prefix="powerloss-") as d:
        for name, writes, seed in trial_plan(count, first):
            problems, lost = run_trial(blkimg, blkimg_io, d, name, writes,
                                       seed)
            crashed += lost
            for p in problems:
                bad += 1
                print(p, flush=True)
    print("%d trials, %d lost power, %d problems" % (count, crashed, bad))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
