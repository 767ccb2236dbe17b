# SPDX-License-Identifier: MIT
"""blkimg snapshot (-l/-c/-a/-d) against qemu-img snapshot."""
import json
import os

import pytest

pytestmark = pytest.mark.qemu


def qio(run, qemu_io, img, *cmds):
    argv = [qemu_io]
    for c in cmds:
        argv += ["-c", c]
    cp = run(*argv, img)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    assert "failed" not in cp.stdout, cp.stdout


def clean(run, qemu_img, img):
    cp = run(qemu_img, "check", "--output=json", img)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    r = json.loads(cp.stdout)
    assert not r.get("leaks") and not r.get("corruptions"), cp.stdout


def test_list_matches_qemu(run, qemu_img, qemu_io, blkimg, tmp_path):
    img = str(tmp_path / "l.qcow2")
    run(qemu_img, "create", "-q", "-f", "qcow2", img, "4M", check=True)
    # no snapshots: nothing printed
    a = run(qemu_img, "snapshot", "-l", img)
    b = run(blkimg, "snapshot", "-l", img)
    assert (b.returncode, b.stdout) == (a.returncode, a.stdout) == (0, "")
    qio(run, qemu_io, img, "write -P 1 0 1M")
    for name in ("one", "a much longer snapshot name", "3"):
        run(qemu_img, "snapshot", "-c", name, img, check=True)
    for args in (["-l"], [], ["-U", "-l"]):
        a = run(qemu_img, "snapshot", *args, img)
        b = run(blkimg, "snapshot", *args, img)
        assert b.returncode == a.returncode == 0, b.stderr
        assert b.stdout == a.stdout
    a = run(qemu_img, "info", img)
    b = run(blkimg, "info", img)
    assert b.stdout == a.stdout


def test_create_apply_delete(run, qemu_img, qemu_io, blkimg, blkimg_io,
                             tmp_path):
    img = str(tmp_path / "s.qcow2")
    run(qemu_img, "create", "-q", "-f", "qcow2", img, "8M", check=True)
    qio(run, qemu_io, img, "write -P 1 0 2M", "write -c -P 7 3M 64k")
    run(blkimg, "snapshot", "-c", "first", img, check=True)
    clean(run, qemu_img, img)
    qio(run, blkimg_io, img, "write -P 2 1M 1M", "write -P 8 3M 4k",
        "discard 0 64k")
    run(blkimg, "snapshot", "-c", "second", img, check=True)
    clean(run, qemu_img, img)
    qio(run, blkimg_io, img, "write -P 3 0 1M")
    # QEMU sees both snapshots, with the contents they had
    a = run(qemu_img, "snapshot", "-l", img, check=True).stdout
    assert [ln.split()[:2] for ln in a.splitlines()[2:]] == [
        ["1", "first"], ["2", "second"]]
    first = str(tmp_path / "first.raw")
    run(qemu_img, "convert", "-l", "snapshot.name=first", "-O", "raw", img,
        first, check=True)
    with open(first, "rb") as f:
        data = f.read()
    assert data[:2 << 20] == b"\x01" * (2 << 20)
    assert data[3 << 20:(3 << 20) + 65536] == b"\x07" * 65536
    # apply by name and by id
    run(blkimg, "snapshot", "-a", "first", img, check=True)
    clean(run, qemu_img, img)
    qio(run, qemu_io, img, "read -P 1 0 2M", "read -P 7 3M 64k")
    run(blkimg, "snapshot", "-a", "2", img, check=True)
    clean(run, qemu_img, img)
    qio(run, qemu_io, img, "read -P 0 0 64k", "read -P 1 64k 960k",
        "read -P 2 1M 1M", "read -P 8 3M 4k", "read -P 7 3149824 61440")
    # qemu-img applies blkimg's snapshots the same way
    run(qemu_img, "snapshot", "-a", "first", img, check=True)
    qio(run, qemu_io, img, "read -P 1 0 2M")
    run(blkimg, "snapshot", "-d", "first", img, check=True)
    clean(run, qemu_img, img)
    run(blkimg, "snapshot", "-d", "second", img, check=True)
    clean(run, qemu_img, img)
    assert run(qemu_img, "snapshot", "-l", img, check=True).stdout == ""
    qio(run, qemu_io, img, "read -P 1 0 2M")


@pytest.mark.parametrize("args", [["-a", "nope"], ["-d", "nope"],
                                  ["-c", "x", "-d", "y"], ["-l", "-l"]])
def test_errors_match_qemu(run, qemu_img, blkimg, tmp_path, args):
    img = str(tmp_path / "e.qcow2")
    run(qemu_img, "create", "-q", "-f", "qcow2", img, "1M", check=True)
    a = run(qemu_img, "snapshot", *args, img)
    b = run(blkimg, "snapshot", *args, img)
    assert b.returncode == a.returncode
    assert b.stderr.replace("blkimg", "qemu-img") == a.stderr


def test_data_file_refused(run, qemu_img, blkimg, tmp_path):
    img = str(tmp_path / "d.qcow2")
    run(qemu_img, "create", "-q", "-f", "qcow2", "-o", "data_file=d.raw",
        img, "1M", cwd=str(tmp_path), check=True)
    a = run(qemu_img, "snapshot", "-c", "x", "d.qcow2", cwd=str(tmp_path))
    b = run(blkimg, "snapshot", "-c", "x", "d.qcow2", cwd=str(tmp_path))
    assert b.returncode == a.returncode == 1
    assert b.stderr.replace("blkimg", "qemu-img") == a.stderr
