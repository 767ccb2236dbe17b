# SPDX-License-Identifier: MIT
"""Smoke tests: the build produced what it should, and the main path works
end to end (create, write, read back, info, map, probe), checked against
QEMU's tools on identical files."""
import json
import os
import shutil

import pytest

PROBE_KEYS = {
    "request-alignment", "request-alignment-source", "min-mem-alignment",
    "opt-mem-alignment", "mem-alignment-source", "max-transfer", "page-size",
    "filesystem", "logical-sector-size", "physical-sector-size", "cache",
}


def test_build_outputs(build_dir):
    for name in ("blkimg", "blkimg-io"):
        path = build_dir / name
        assert path.is_file() and os.access(path, os.X_OK), path
    assert (build_dir / "libblkimg.so").exists()
    assert (build_dir / "meson-private" / "blkimg.pc").is_file()


LIB_PROGRAM = r"""
#include <blkimg/blkimg.h>
#include <stdio.h>

int main(void)
{
    uint64_t v = 0;
    enum bi_cache c;
    if (bi_parse_size("1G", &v) != 0 || v != 1073741824ULL)
        return 1;
    if (bi_parse_size("1X", &v) != -EINVAL)
        return 2;
    if (bi_cache_parse("none", &c) != 0 || c != BI_CACHE_NONE ||
        !bi_cache_is_direct(c))
        return 3;
    if (bi_page_size() == 0)
        return 4;
    printf("ok\n");
    return 0;
}
"""


def test_library_links_through_pkg_config(build_dir, tmp_path, run,
                                          sanitized):
    """A program using only the public header links against libblkimg.so
    through the (uninstalled) pkg-config file."""
    if shutil.which("cc") is None or shutil.which("pkg-config") is None:
        pytest.skip("cc or pkg-config missing")
    src = tmp_path / "prog.c"
    src.write_text("#include <errno.h>\n" + LIB_PROGRAM)
    env = {"PKG_CONFIG_PATH": build_dir / "meson-uninstalled"}
    flags = run("pkg-config", "--cflags", "--libs", "blkimg-uninstalled",
                env=env)
    assert flags.returncode == 0, flags.stderr
    extra = ["-fsanitize=address,undefined"] if sanitized else []
    exe = tmp_path / "prog"
    cp = run(["cc", "-std=c11", "-Wall", "-Werror", *extra, "-o", exe, src,
              *flags.stdout.split()])
    assert cp.returncode == 0, cp.stderr
    cp = run(exe, env={"LD_LIBRARY_PATH": build_dir})
    assert (cp.returncode, cp.stdout) == (0, "ok\n"), cp.stderr


@pytest.mark.qemu
def test_create_output_and_size_match_qemu_img(blkimg, qemu_img, tmp_path,
                                               run):
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    ours.mkdir()
    theirs.mkdir()
    a = run(blkimg, "create", "-f", "raw", "disk.img", "3M", cwd=ours)
    b = run(qemu_img, "create", "-f", "raw", "disk.img", "3M", cwd=theirs)
    assert (a.returncode, a.stdout, a.stderr) == (b.returncode, b.stdout,
                                                  b.stderr)
    assert a.returncode == 0
    assert os.path.getsize(ours / "disk.img") == 3 * 1024 * 1024


@pytest.mark.qemu
@pytest.mark.parametrize("cache", ["writeback", "none"])
def test_blkimg_io_write_read_back_by_qemu_io(blkimg_io, qemu_img, qemu_io,
                                              tmp_path, run, mask_timing,
                                              cache):
    """Unaligned writes through blkimg-io produce the same bytes and output
    as qemu-io; qemu-io verifies the pattern on blkimg-io's file."""
    ours, theirs = tmp_path / "ours.img", tmp_path / "theirs.img"
    for f in (ours, theirs):
        run(qemu_img, "create", "-q", "-f", "raw", f, "1M", check=True)
    cmds = ["write -P 0xa5 1000 3000", "write -P 0x3c 65535 1",
            "write -z 8192 4096", "read -P 0xa5 1000 3000",
            "read -P 0x3c 65535 1"]
    args = [a for c in cmds for a in ("-c", c)]
    a = run(blkimg_io, "-f", "raw", "-t", cache, *args, ours)
    b = run(qemu_io, "-f", "raw", "-t", cache, *args, theirs)
    assert a.returncode == b.returncode == 0, a.stderr
    assert mask_timing(a.stdout) == mask_timing(b.stdout)
    assert a.stderr == b.stderr
    assert ours.read_bytes() == theirs.read_bytes()
    c = run(qemu_io, "-f", "raw", "-c", "read -P 0xa5 1000 3000", "-c",
            "read -P 0x3c 65535 1", "-c", "read -P 0 0 1000", ours)
    assert c.returncode == 0
    assert "Pattern verification failed" not in c.stdout


@pytest.mark.qemu
def test_info_and_map_json_match_qemu_img(blkimg, qemu_img, qemu_io,
                                          tmp_path, run):
    img = tmp_path / "disk.img"
    run(qemu_img, "create", "-q", "-f", "raw", img, "4M", check=True)
    run(qemu_io, "-f", "raw", "-c", "write -P 1 1M 64k", "-c",
        "write -P 2 3M 4k", img, check=True)
    for sub in (["info", "--output=json"], ["map", "--output=json"],
                ["info"], ["map"]):
        a = run(blkimg, *sub, "-f", "raw", img)
        b = run(qemu_img, *sub, "-f", "raw", img)
        assert (a.returncode, a.stdout, a.stderr) == (b.returncode, b.stdout,
                                                      b.stderr), sub


@pytest.mark.parametrize("cache", ["none", "writeback"])
def test_probe_json(blkimg, tmp_path, run, cache):
    img = tmp_path / "disk.img"
    with open(img, "wb") as f:
        f.write(b"\0" * 65536)
    cp = run(blkimg, "probe", "-t", cache, "--output=json", img)
    assert cp.returncode == 0, cp.stderr
    d = json.loads(cp.stdout)
    assert PROBE_KEYS <= set(d), PROBE_KEYS - set(d)
    page = os.sysconf("SC_PAGE_SIZE")
    assert d["page-size"] == page
    assert d["cache"] == cache
    assert d["opt-mem-alignment"] >= page
    for k in ("request-alignment", "min-mem-alignment", "opt-mem-alignment"):
        v = d[k]
        assert v >= 1 and v & (v - 1) == 0, (k, v)
    if cache == "none":
        # O_DIRECT on this file: the alignment is never 1, and the first
        # block is allocated, so it is at most the fallback.
        assert d["request-alignment"] >= 512
        assert d["request-alignment"] <= max(4096, page)


@pytest.mark.qemu
def test_missing_file_error_matches_qemu_img(blkimg, qemu_img, tmp_path, run):
    missing = tmp_path / "nope.img"
    a = run(blkimg, "info", missing)
    b = run(qemu_img, "info", missing)
    assert a.returncode == b.returncode != 0
    assert a.stdout == b.stdout == ""
    assert a.stderr.startswith("blkimg: ")
    assert a.stderr[len("blkimg: "):] == b.stderr[len("qemu-img: "):]
    assert not missing.exists()
