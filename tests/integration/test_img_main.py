# SPDX-License-Identifier: MIT
"""blkimg's standard options and command dispatch vs qemu-img 7.2."""
import pytest

from test_img_helpers import assert_same, both, run

OURS = ["bench", "create", "info", "map", "probe"]


@pytest.mark.qemu
@pytest.mark.parametrize("args", [
    [], ["foo"], ["-Z"], ["-T"], ["--trace"], ["--"], ["--", "foo"],
    ["--nonsense"], ["--help=x"], ["info"], ["map"], ["bench"],
    ["create"], ["info", "-Z"],
], ids=lambda a: " ".join(a) or "none")
def test_main_same_as_qemu(qemu_img, blkimg, tmp_path, args):
    cq, cb = both(qemu_img, blkimg, args, cwd_q=tmp_path)
    assert_same(cq, cb, what=" ".join(args))


@pytest.mark.parametrize("args", [["--help"], ["-h"], ["--he"],
                                  ["info", "-h"], ["create", "--help"],
                                  ["bench", "-h"], ["map", "--help"],
                                  ["probe", "-h"]])
def test_help_lists_commands(blkimg, args):
    cp = run([blkimg] + args)
    assert cp.returncode == 0 and cp.stderr == ""
    assert cp.stdout.startswith("blkimg version ")
    assert "usage: blkimg [standard options] command [command options]" \
        in cp.stdout
    syntax = cp.stdout.split("Command syntax:\n")[1].split("\n\n")[0]
    names = [l.split()[0] for l in syntax.splitlines()]
    for c in OURS:
        assert c in names


def test_version(blkimg):
    for opt in ("-V", "--version", "--vers"):
        cp = run([blkimg, opt])
        assert cp.returncode == 0 and cp.stderr == ""
        assert cp.stdout.splitlines()[0].startswith("blkimg version 0.")


def test_dispatch_runs_the_command(blkimg, tmp_path):
    cp = run([blkimg, "create", "-q", tmp_path / "x.raw", "4k"])
    assert (cp.returncode, cp.stdout, cp.stderr) == (0, "", "")
    cp = run([blkimg, "info", "--output=json", tmp_path / "x.raw"])
    assert cp.returncode == 0 and '"virtual-size": 4096' in cp.stdout


def test_version_as_qemu_img(blkimg, tmp_path):
    """Installed under qemu-img's name, the version line parses as the
    qemu-img version implemented (scripts check minimum versions)."""
    import os
    import re
    link = tmp_path / "qemu-img"
    os.symlink(blkimg, link)
    cp = run([link, "--version"])
    assert cp.returncode == 0
    m = re.match(r"qemu-img version ([0-9.]+) \(blkimg ", cp.stdout)
    assert m and m.group(1) == "7.2.0", cp.stdout
