# SPDX-License-Identifier: MIT
"""Differential check of damaged qcow2 images: qemu-img makes an image of
one of several kinds, a seeded random damage is done to its metadata (a
byte, a bit, a whole table entry, or the file truncated), and both
`qemu-img check` and `blkimg check` judge the result; then both repair a
copy with `-r all`. Used by test_qcow2_check_diff.py (a few seeds per kind
in `make check`) and on its own for long runs:

    python3 tests/interop/qcow2_mutate.py BUILD_DIR [CASES] [FIRST_SEED]

which prints one line per case where the tools disagree and a total;
with --snapshots the damage is to the snapshot table only (its header
pointer, its entries' fields, or the file cut inside it), on images with
two internal snapshots (SNAPSHOT_KINDS).
"""
import os
import random
import shutil
import struct
import subprocess
import sys
import tempfile

TIMEOUT = 60

# name -> (qemu-img create -o options, qemu-io commands, extra step)
KINDS = {
    "c64k": ("", ["write -P 1 0 192k", "write -P 2 3M 64k",
                  "write -z 1M 64k"], None),
    "c512": ("cluster_size=512", ["write -P 1 0 8k", "write -P 2 300k 4k",
                                  "write -P 3 1M 2k"], None),
    "c4k_rc1": ("cluster_size=4096,refcount_bits=1",
                ["write -P 1 0 64k", "write -P 2 2M 12k"], None),
    "rc64": ("cluster_size=4096,refcount_bits=64",
             ["write -P 1 0 32k", "write -P 5 1M 8k"], None),
    "extl2": ("extended_l2=on,cluster_size=64k",
              ["write -P 1 0 4k", "write -P 2 64k 64k",
               "write -z 256k 8k", "write -P 3 512k 2k"], None),
    "compressed": ("cluster_size=4096",
                   ["write -c -P 1 0 16k", "write -P 2 64k 8k",
                    "write -c -P 3 1M 4k"], None),
    "snapshot": ("cluster_size=4096",
                 ["write -P 1 0 32k", "write -P 4 1M 8k"], "snapshot"),
    "bitmap": ("cluster_size=4096",
               ["write -P 1 0 32k"], "bitmap"),
    "v2": ("compat=0.10,cluster_size=4096",
           ["write -P 1 0 16k", "write -z 64k 8k"], None),
    "c2m": ("cluster_size=2M", ["write -P 1 0 4k", "write -P 2 4M 64k"],
            None),
}
# images for the snapshot table damages: two internal snapshots each
SNAPSHOT_KINDS = {
    "snap4k": ("cluster_size=4096",
               ["write -P 1 0 32k", "write -P 4 1M 8k"], "snapshots2"),
    "snap512_v2": ("compat=0.10,cluster_size=512",
                   ["write -P 1 0 8k", "write -P 2 300k 4k"], "snapshots2"),
    "snap64k": ("", ["write -P 1 0 128k", "write -P 3 2M 64k"],
                "snapshots2"),
}
SIZE = "8M"


class _TimedOut:
    """What _run returns for a command that ran past TIMEOUT (killed)."""
    returncode = -9
    stdout = ""

    def __init__(self, argv):
        self.stderr = "timed out after %d s: %s\n" % (TIMEOUT, " ".join(argv))


def _run(argv, cwd=None):
    try:
        return subprocess.run(argv, capture_output=True, text=True,
                              timeout=TIMEOUT, stdin=subprocess.DEVNULL,
                              cwd=cwd)
    except subprocess.TimeoutExpired:
        return _TimedOut(argv)


def make_image(path, kind):
    opts, cmds, extra = KINDS[kind] if kind in KINDS else \
        SNAPSHOT_KINDS[kind]
    argv = ["qemu-img", "create", "-q", "-f", "qcow2"]
    if opts:
        argv += ["-o", opts]
    subprocess.run(argv + [path, SIZE], check=True, capture_output=True)
    io = ["qemu-io"]
    for c in cmds:
        io += ["-c", c]
    subprocess.run(io + [path], check=True, capture_output=True)
    if extra == "snapshot":
        subprocess.run(["qemu-img", "snapshot", "-c", "s1", path], check=True)
        subprocess.run(["qemu-io", "-c", "write -P 7 0 8k", "-c",
                        "write -P 8 2M 4k", path], check=True,
                       capture_output=True)
    elif extra == "snapshots2":
        for name, cmd in (("s1", "write -P 7 0 8k"),
                          ("second", "write -P 8 2M 4k")):
            subprocess.run(["qemu-img", "snapshot", "-c", name, path],
                           check=True)
            subprocess.run(["qemu-io", "-c", cmd, path], check=True,
                           capture_output=True)
    elif extra == "bitmap":
        subprocess.run(["qemu-img", "bitmap", "--add", path, "b0"],
                       check=True)
        subprocess.run(["qemu-io", "-c", "write -P 9 64k 8k", path],
                       check=True, capture_output=True)


class Layout:
    """Where an image's metadata lies (read from its header and tables)."""

    def __init__(self, path):
        with open(path, "rb") as f:
            self.data = f.read()
        d = self.data
        (self.version,) = struct.unpack_from(">I", d, 4)
        (self.cluster_bits,) = struct.unpack_from(">I", d, 20)
        self.cs = 1 << self.cluster_bits
        (self.l1_size,) = struct.unpack_from(">I", d, 36)
        (self.l1_off, self.rt_off) = struct.unpack_from(">QQ", d, 40)
        (self.rt_clusters, self.nb_snap) = struct.unpack_from(">II", d, 56)
        (self.snap_off,) = struct.unpack_from(">Q", d, 64)
        self.incompat = 0
        self.hdr_len = 72
        if self.version >= 3:
            (self.incompat,) = struct.unpack_from(">Q", d, 72)
            (self.hdr_len,) = struct.unpack_from(">I", d, 100)
        self.entry = 16 if self.incompat & 16 else 8
        self.regions = [("header", 0, self.hdr_len)]
        self._tables()

    def _u64(self, off):
        if off + 8 > len(self.data):
            return 0
        return struct.unpack_from(">Q", self.data, off)[0]

    def _tables(self):
        mask = 0x00fffffffffffe00
        self.regions.append(("l1", self.l1_off, self.l1_size * 8))
        for i in range(self.l1_size):
            l2 = self._u64(self.l1_off + 8 * i) & mask
            if l2:
                self.regions.append(("l2", l2, self.cs))
        self.regions.append(("reftable", self.rt_off,
                             self.rt_clusters * self.cs))
        for i in range(self.rt_clusters * self.cs // 8):
            rb = self._u64(self.rt_off + 8 * i) & ~0x1ff & (2**64 - 1)
            if rb:
                self.regions.append(("refblock", rb, self.cs))
        if self.nb_snap:
            self.regions.append(("snapshots", self.snap_off, 64 * 1024))


def _entry_value(rng, kind, old, cs, file_len):
    """A plausible but wrong table entry: other offsets, flags, reserved
    bits, offsets past the end or unaligned."""
    choice = rng.randrange(8)
    if choice == 0:
        return rng.getrandbits(64)
    if choice == 1:
        return old ^ (1 << rng.randrange(64))
    if choice == 2:  # an offset beyond the end of the file
        return (old & ~0x00fffffffffffe00) | \
            ((file_len + cs * rng.randrange(1, 64)) & ~(cs - 1))
    if choice == 3:  # unaligned
        return old + rng.choice([512, 8, cs // 2 or 1]) if old else 512
    if choice == 4:  # another metadata cluster
        return (old & ~0x00fffffffffffe00) | (cs * rng.randrange(0, 4))
    if choice == 5:  # reserved bits
        return old | (1 << rng.choice([1, 2, 8, 56, 57, 61]))
    if choice == 6:
        return 0
    return old ^ (1 << 63)


def mutate(path, seed):
    """Damages the image at path in place; returns what was done."""
    rng = random.Random(seed)
    lay = Layout(path)
    file_len = len(lay.data)
    if rng.randrange(12) == 0:
        new_len = rng.randrange(lay.cs, file_len) if file_len > lay.cs \
            else file_len
        os.truncate(path, new_len)
        return "truncate to %d" % new_len
    name, start, length = rng.choice(lay.regions[1:] or lay.regions)
    if rng.randrange(10) == 0:
        name, start, length = lay.regions[0]
    with open(path, "r+b") as f:
        how = rng.randrange(3)
        if how == 0 or name in ("header", "snapshots"):
            off = start + rng.randrange(max(1, min(length, 512)))
            f.seek(off)
            byte = f.read(1)
            old = byte[0] if byte else 0
            new = old ^ (1 << rng.randrange(8)) if rng.randrange(2) \
                else rng.randrange(256)
            f.seek(off)
            f.write(bytes([new]))
            return "%s: byte %#x %#x -> %#x" % (name, off, old, new)
        # a whole entry; prefer entries in use
        step = 16 if name == "l2" and lay.entry == 16 else 8
        used = [o for o in range(start, min(start + length, file_len), step)
                if lay._u64(o)]
        off = rng.choice(used) if used and rng.randrange(4) else \
            start + step * rng.randrange(max(1, length // step))
        old = lay._u64(off)
        new = _entry_value(rng, name, old, lay.cs, file_len) & (2**64 - 1)
        f.seek(off)
        f.write(struct.pack(">Q", new))
        return "%s: entry %#x %#x -> %#x" % (name, off, old, new)


def snapshot_entries(lay):
    """The snapshot table's entries as QEMU walks them: a list of
    (offset, extra_data_size, id_len, name_len), and the table's end."""
    out = []
    off = lay.snap_off
    for _ in range(lay.nb_snap):
        off = (off + 7) & ~7
        if off + 40 > len(lay.data):
            break
        il, nl = struct.unpack_from(">HH", lay.data, off + 12)
        (ex,) = struct.unpack_from(">I", lay.data, off + 36)
        out.append((off, ex, il, nl))
        off += 40 + ex + il + nl
    return out, off


# the fields of a snapshot table entry: (name, offset, width)
_SNAP_FIELDS = [("l1_offset", 0, 8), ("l1_size", 8, 4), ("id_len", 12, 2),
                ("name_len", 14, 2), ("vm_state_size", 32, 4),
                ("extra_size", 36, 4)]


def _snap_field_value(rng, name, old, cs, file_len):
    """A wrong value for one field of a snapshot table entry."""
    if name == "l1_offset":
        return rng.choice([old + 8, old + 512, old | 1, 0,
                           (file_len + cs * rng.randrange(1, 8)) & ~(cs - 1),
                           rng.getrandbits(64)])
    if name == "l1_size":
        return rng.choice([0, old + 1, 0x2000001, 0x4000000,
                           rng.getrandbits(32)])
    if name in ("id_len", "name_len"):
        return rng.choice([0, old + 1, old + 7, 0xffff, rng.getrandbits(16)])
    if name == "extra_size":
        return rng.choice([0, 8, 15, 16, 23, 25, 1024, 1025, 2000, 65541,
                           rng.getrandbits(32)])
    return rng.getrandbits(32)


def mutate_snapshots(path, seed):
    """Damages the snapshot table of the image at path in place (it must
    have snapshots); returns what was done."""
    rng = random.Random(seed)
    lay = Layout(path)
    file_len = len(lay.data)
    entries, end = snapshot_entries(lay)
    how = rng.randrange(10)
    with open(path, "r+b") as f:
        if how == 0:
            nb = rng.choice([lay.nb_snap + 1, lay.nb_snap + rng.randrange(2, 60),
                             65536 + rng.randrange(1, 5000), 0,
                             rng.getrandbits(32)])
            f.seek(60)
            f.write(struct.pack(">I", nb))
            return "snapshot count %d -> %d" % (lay.nb_snap, nb)
        if how == 1:
            off = rng.choice([lay.snap_off + 8, lay.snap_off + lay.cs, 0,
                              (file_len + lay.cs * 3) & ~(lay.cs - 1),
                              0x7ffffffffffff000, rng.getrandbits(64)])
            f.seek(64)
            f.write(struct.pack(">Q", off))
            return "snapshot table offset %#x -> %#x" % (lay.snap_off, off)
        if how == 2:
            new_len = rng.randrange(lay.snap_off, max(end, lay.snap_off + 1))
            f.truncate(new_len)
            return "truncate to %d (snapshot table %#x..%#x)" % \
                (new_len, lay.snap_off, end)
        if how == 3 or not entries:
            off = lay.snap_off + rng.randrange(max(1, end - lay.snap_off))
            f.seek(off)
            old = f.read(1)
            new = rng.randrange(256)
            f.seek(off)
            f.write(bytes([new]))
            return "snapshot table byte %#x %s -> %#x" % (off, old.hex(), new)
        i = rng.randrange(len(entries))
        name, foff, width = rng.choice(_SNAP_FIELDS)
        fmt = {8: ">Q", 4: ">I", 2: ">H"}[width]
        at = entries[i][0] + foff
        (old,) = struct.unpack_from(fmt, lay.data, at)
        new = _snap_field_value(rng, name, old, lay.cs, file_len) % \
            (1 << (8 * width))
        f.seek(at)
        f.write(struct.pack(fmt, new))
        return "snapshot %d %s %#x -> %#x" % (i, name, old, new)


def check(tool, path, *args):
    """(exit code, stdout, stderr) of `tool check args path`, run in the
    image's folder on its base name so messages compare equal."""
    cp = _run([tool, "check", *args, os.path.basename(path)],
              cwd=os.path.dirname(path))
    return cp.returncode, cp.stdout, cp.stderr


def _slow_for_qemu_too(img):
    """Whether qemu-img's own repair of a copy of img runs past TIMEOUT
    as well (a repair that must reach a refcount block terabytes past the
    end of the file counts for a long time in both)."""
    q = img + ".qrep"
    shutil.copy(img, q)
    try:
        return check("qemu-img", q, "-r", "all")[0] == _TimedOut.returncode
    finally:
        os.unlink(q)


def _disagreement(label, q, b):
    """The kind of a disagreement between the exit codes, or None:
    "silent" (blkimg calls clean what qemu-img does not), "alarm" (the
    reverse), "refused" (blkimg does not open what qemu-img checks: a
    table qemu-img reads as zeroes), "other"."""
    if q[0] == b[0]:
        return None
    if b[0] == 0:
        return "silent"
    if q[0] == 0:
        return "alarm"
    if b[0] == 1 and q[0] in (2, 3) and "Could not open" in b[2]:
        return "refused"
    return "other"


def one_case(blkimg, workdir, kind, seed, quick=False, snapshots=False):
    """Runs one case; returns a list of (kind, text) disagreements, kind
    one of _disagreement's or "died" or "repair" (a repair blkimg calls
    done that qemu-img check still finds bad). snapshots damages only the
    snapshot table (mutate_snapshots). quick skips the repair of
    a refcount block outside the image: like QEMU's, it grows the file to
    reach the block, which may be terabytes away (a sparse file, but
    seconds of counting and gigabytes of counts)."""
    base = os.path.join(workdir, "base-%s.qcow2" % kind)
    if not os.path.exists(base):
        make_image(base, kind)
    img = os.path.join(workdir, "img.qcow2")
    shutil.copy(base, img)
    what = mutate_snapshots(img, seed) if snapshots else mutate(img, seed)
    problems = []
    q = check("qemu-img", img)
    b = check(blkimg, img)
    label = "%s seed %d (%s)" % (kind, seed, what)
    how = _disagreement(label, q, b)
    if how:
        problems.append((how, "%s: exit qemu-img %d, blkimg %d\n"
                         "--- qemu-img:\n%s%s--- blkimg:\n%s%s" %
                         (label, q[0], b[0], q[1], q[2], b[1], b[2])))
    if b[0] >= 128 or b[0] < 0:
        problems.append(("died", "%s: blkimg check died (%d)" % (label, b[0])))
    # the damaged image is read to the end without a crash or hang
    r = _run([blkimg, "convert", "-O", "raw", img, img + ".raw"])
    if r.returncode >= 128 or r.returncode < 0:
        problems.append(("died", "%s: convert died (%d)" %
                         (label, r.returncode)))
    if os.path.exists(img + ".raw"):
        os.unlink(img + ".raw")
    if quick and "is outside image" in b[2]:
        return problems
    # after a repair that blkimg calls done, qemu-img finds the image clean
    rep = img + ".rep"
    shutil.copy(img, rep)
    code, out, err = check(blkimg, rep, "-r", "all")
    if code == _TimedOut.returncode and _slow_for_qemu_too(img):
        pass  # e.g. a refcount block terabytes out: both grow the file
    elif code >= 128 or code < 0:
        problems.append(("died", "%s: check -r all died (%d)" %
                         (label, code)))
    elif code == 0:
        qa = check("qemu-img", rep)
        if qa[0] != 0:
            problems.append(("repair", "%s: blkimg repaired, qemu-img check "
                             "says %d:\n%s" % (label, qa[0], qa[1] + qa[2])))
    os.unlink(rep)
    return problems


def main(argv):
    snapshots = "--snapshots" in argv
    argv = [a for a in argv if a != "--snapshots"]
    build = argv[1]
    cases = int(argv[2]) if len(argv) > 2 else 1000
    first = int(argv[3]) if len(argv) > 3 else 0
    blkimg = os.path.join(build, "blkimg")
    kinds = sorted(SNAPSHOT_KINDS if snapshots else KINDS)
    bad = 0
    with tempfile.TemporaryDirectory(prefix="qcow2-mutate-") as d:
        for i in range(cases):
            seed = first + i
            kind = kinds[seed % len(kinds)]
            for how, text in one_case(blkimg, d, kind, seed,
                                      snapshots=snapshots):
                bad += 1
                print("[%s] %s" % (how, text), flush=True)
    print("%d cases, %d disagreements" % (cases, bad))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
