# SPDX-License-Identifier: MIT
"""The fuzz targets (tests/fuzz) replayed without libFuzzer.

Each target's LLVMFuzzerTestOneInput, built with replay_main.c into
<build>/tests/fuzz/replay_<target> (gcc; the normal and the sanitizer
build), runs once on every seed of tests/fuzz/corpus/<target>/ and every
input of tests/fuzz/regressions/<target>/: a crash input `make fuzz` once
found stays a test. A target's finding aborts (exit status != 0); a
sanitizer report fails the test too (run_cmd).
"""
import os

import pytest

from conftest import run_cmd

TARGETS = ["open", "check", "write", "parse"]


def inputs(repo_root, kind, target):
    """The input files of tests/fuzz/<kind>/<target>/ (dot files aside)."""
    d = repo_root / "tests" / "fuzz" / kind / target
    if not d.is_dir():
        return []
    return sorted(str(p) for p in d.iterdir()
                  if p.is_file() and not p.name.startswith("."))


@pytest.mark.parametrize("target", TARGETS)
def test_replay(build_dir, repo_root, target):
    exe = build_dir / "tests" / "fuzz" / ("replay_" + target)
    assert exe.exists(), "%s is not built" % exe
    seeds = inputs(repo_root, "corpus", target)
    assert seeds, "no seed corpus for %s" % target
    files = seeds + inputs(repo_root, "regressions", target)
    cp = run_cmd(exe, *files, timeout=120,
                 env={"ASAN_OPTIONS": os.environ.get(
                     "ASAN_OPTIONS_CHECK", "detect_leaks=1:halt_on_error=1"),
                      "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1"})
    assert cp.returncode == 0, "replay_%s failed (exit %d):\n%s" % (
        target, cp.returncode, cp.stderr[-4000:])
    assert cp.stdout == "%d inputs\n" % len(files)


def test_seeds_small(repo_root):
    """The committed seeds stay small (a few KiB each, < 1 MiB in all,
    counting each distinct file once)."""
    seen = {}
    for target in TARGETS:
        for f in inputs(repo_root, "corpus", target):
            with open(f, "rb") as fh:
                data = fh.read()
            assert len(data) <= 128 * 1024, f
            seen[data] = len(data)
    assert sum(seen.values()) < 1024 * 1024


@pytest.mark.qemu
def test_data_file_offset_mismatch(blkimg_io, qemu_io, repo_root, tmp_path,
                                   mask_timing):
    """fuzz_write's finding: a qcow2 cluster in an external data file not
    at its guest offset fails the read with QEMU's non-fatal corruption
    message (blkimg read another cluster's bytes; qemu-io 7.2 even
    asserts on a write there)."""
    src = (repo_root / "tests" / "fuzz" / "regressions" / "write" /
           "qcow2-datafile-offset-mismatch")
    img = tmp_path / "img.qcow2"
    img.write_bytes(src.read_bytes())
    (tmp_path / "data.raw").write_bytes(b"ABCDEFGH" * 64)
    out = []
    for tool in (qemu_io, blkimg_io):
        cp = run_cmd(tool, "-r", "-c", "read -v 512 16", "-c", "read 0 512",
                     img, cwd=tmp_path)
        out.append((cp.returncode, mask_timing(cp.stdout), cp.stderr))
    assert out[1] == out[0]
    assert "does not match guest cluster offset: 0x200" in out[1][2]
