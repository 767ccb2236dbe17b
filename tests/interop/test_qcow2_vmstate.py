# SPDX-License-Identifier: MIT
"""qcow2's VM state area (where QEMU's savevm keeps a VM's state, past the
guest disk in the image's address space): blkimg-io's read -b / write -b
against qemu-io's on the same images, internal snapshots keeping it
through create, apply and delete, convert leaving it behind, and snapshot
-l / info showing a snapshot's VM SIZE as qemu-img does (the size patched
into the snapshot table, as a VM's savevm would record it)."""
import struct

import pytest

pytestmark = pytest.mark.qemu

SCRIPT = ["write -b -P 0x61 0 64k", "write -b -P 0x62 1M 4k",
          "write -P 0x70 0 64k", "read -b -P 0x61 0 64k",
          "read -b -P 0 64k 64k", "read -b -v 1M 16", "read -P 0x70 0 64k",
          "write -b 1k 512", "write -b -P 1 3 512", "read -b 0 100",
          "write -b -z 0 512", "info"]


def script(cmds):
    args = []
    for c in cmds:
        args += ["-c", c]
    return args


def both(tmp_path, run, qemu_img, make):
    dirs = []
    for sub in ("q", "b"):
        d = tmp_path / sub
        d.mkdir()
        make(d)
        dirs.append(d)
    return dirs


def test_vmstate_io(tmp_path, run, qemu_img, qemu_io, blkimg_io, mask_timing):
    q, b = both(tmp_path, run, qemu_img, lambda d: run(
        qemu_img, "create", "-q", "-f", "qcow2", d / "v.qcow2", "3M",
        check=True))
    rq = run(qemu_io, *script(SCRIPT), "v.qcow2", cwd=q)
    rb = run(blkimg_io, *script(SCRIPT), "v.qcow2", cwd=b)
    assert mask_timing(rb.stdout) == mask_timing(rq.stdout)
    assert rb.stderr.replace("blkimg-io", "qemu-io") == rq.stderr
    assert rb.returncode == rq.returncode
    # each reads what the other wrote, and the images are consistent
    for d, tool in ((q, blkimg_io), (b, qemu_io)):
        r = run(tool, "-r", *script(["read -b -P 0x61 4k 60k",
                                     "read -b -P 0x62 1M 4k",
                                     "read -P 0x70 0 64k"]), "v.qcow2",
                cwd=d)
        assert r.returncode == 0 and "fail" not in r.stdout, r.stdout
        run(qemu_img, "check", "v.qcow2", cwd=d, check=True)
    for d in (q, b):
        assert run(qemu_img, "map", "--output=json", "v.qcow2", cwd=d,
                   check=True).stdout == \
            run(qemu_img, "map", "--output=json", "v.qcow2", cwd=q,
                check=True).stdout


def test_vmstate_raw_refused(tmp_path, run, qemu_io, blkimg_io):
    (tmp_path / "r.raw").write_bytes(bytes(65536))
    args = ["-f", "raw", *script(["read -b 0 512", "write -b 0 512"]),
            "r.raw"]
    rq = run(qemu_io, *args, cwd=tmp_path)
    rb = run(blkimg_io, *args, cwd=tmp_path)
    assert rb.stdout == rq.stdout
    assert "Operation not supported" in rb.stdout
    assert (tmp_path / "r.raw").read_bytes() == bytes(65536)


def test_vmstate_through_snapshots(tmp_path, run, qemu_img, qemu_io, blkimg,
                                   blkimg_io):
    """create keeps the state in the snapshot, apply brings it back,
    delete leaves the others; convert does not copy it."""
    outs = []
    for sub, img, io in (("q", qemu_img, qemu_io), ("b", blkimg, blkimg_io)):
        d = tmp_path / sub
        d.mkdir()
        run(qemu_img, "create", "-q", "-f", "qcow2", d / "v.qcow2", "3M",
            check=True)
        steps = [
            (io, script(["write -b -P 0x61 0 64k", "write -b -P 0x62 1M 4k"])),
            (img, ["snapshot", "-c", "s1"]),
            (io, script(["write -b -P 0x63 0 64k"])),
            (img, ["snapshot", "-c", "s2"]),
            (img, ["snapshot", "-a", "s1"]),
            (io, script(["read -b -P 0x61 0 64k", "read -b -P 0x62 1M 4k"])),
            (img, ["snapshot", "-d", "s1"]),
            (img, ["snapshot", "-a", "s2"]),
            (io, script(["read -b -P 0x63 0 64k", "read -b -P 0x62 1M 4k"])),
            (img, ["convert", "-O", "qcow2", "v.qcow2", "c.qcow2"]),
        ]
        out = []
        for tool, args in steps:
            target = [] if args[0] == "convert" else ["v.qcow2"]
            r = run(tool, *args, *target, cwd=d)
            assert r.returncode == 0 and "fail" not in r.stdout, \
                (args, r.stdout, r.stderr)
            out.append(r.returncode)
        r = run(qemu_io, *script(["read -b -P 0 0 64k"]), "c.qcow2", cwd=d)
        assert "fail" not in r.stdout
        run(qemu_img, "check", "v.qcow2", cwd=d, check=True)
        outs.append(out)
    assert outs[0] == outs[1]


def set_vm_state_size(path, index, size):
    """Patches snapshot index's vm_state_size (the 32-bit field and, when
    the entry has it, the 64-bit one of its extra data)."""
    with open(path, "r+b") as f:
        h = f.read(72)
        nb, off = struct.unpack(">IQ", h[60:72])
        assert index < nb
        for i in range(nb):
            f.seek(off)
            e = f.read(40)
            id_len, name_len = struct.unpack(">HH", e[12:16])
            extra = struct.unpack(">I", e[36:40])[0]
            if i == index:
                f.seek(off + 32)
                f.write(struct.pack(">I", min(size, 0xffffffff)))
                if extra >= 8:
                    f.seek(off + 40)
                    f.write(struct.pack(">Q", size))
            off += 40 + extra + id_len + name_len
            off += -off % 8


def test_snapshot_list_vm_size(tmp_path, run, qemu_img, blkimg):
    img = tmp_path / "v.qcow2"
    run(qemu_img, "create", "-q", "-f", "qcow2", img, "3M", check=True)
    for name in ("a", "b", "c"):
        run(qemu_img, "snapshot", "-c", name, img, check=True)
    set_vm_state_size(img, 0, 1536)
    set_vm_state_size(img, 2, 5 << 30)
    run(qemu_img, "check", img, check=True)
    for args in (["snapshot", "-l"], ["info"], ["info", "--output=json"]):
        q = run(qemu_img, *args, img)
        b = run(blkimg, *args, img)
        assert (b.returncode, b.stdout) == (q.returncode, q.stdout), args
    assert "1.5 KiB" in q.stdout or "1536" in q.stdout


@pytest.mark.parametrize("cmd,same", [
    ("read -b 9223372036854775296 512", True),
    ("write -b 9223372036854775296 512", True),
    ("read -b 4611686018427387904 512", True),
    ("write -b 1099511627776 512", True),
    # QEMU truncates the L1 index to 32 bits there and writes elsewhere;
    # blkimg refuses (the L1 table would pass QEMU's limit)
    ("write -b 4611686018427387904 512", False),
])
def test_vmstate_far_offsets(tmp_path, run, qemu_img, qemu_io, blkimg_io,
                             mask_timing, cmd, same):
    outs = []
    for sub, tool in (("q", qemu_io), ("b", blkimg_io)):
        d = tmp_path / sub
        d.mkdir()
        run(qemu_img, "create", "-q", "-f", "qcow2", d / "v.qcow2", "1M",
            check=True)
        r = run(tool, "-c", cmd, "v.qcow2", cwd=d)
        outs.append(mask_timing(r.stdout))
        run(qemu_img, "check", "v.qcow2", cwd=d, check=True)
    if same:
        assert outs[1] == outs[0]
    else:
        assert outs[1] == "write failed: File too large\n"
        r = run(qemu_img, "map", "--output=json", tmp_path / "b" / "v.qcow2",
                check=True)
        assert '"data": true' not in r.stdout
