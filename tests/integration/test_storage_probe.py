# SPDX-License-Identifier: MIT
"""`blkimg probe --output=json` on real storage: the values and sources the
tool reports are the file driver's detection (cross-checked with the
library helper and with the kernel's own queue limits)."""
import json
import os
import subprocess

import pytest

import storage
from storage import (any_storage, bi_helper, storage_ext4_4k,  # noqa: F401
                     storage_ramfs)

PAGE = os.sysconf("SC_PAGE_SIZE")
pytestmark = [pytest.mark.root]

SAME_AS_HELPER = ("request-alignment", "request-alignment-source",
                  "min-mem-alignment", "opt-mem-alignment",
                  "mem-alignment-source", "max-transfer", "page-size",
                  "filesystem", "logical-sector-size", "physical-sector-size")


def image(st):
    path = st.path("probe.img")
    if not st.is_block_device:
        with open(path, "wb") as f:
            f.truncate(1 << 20)
    return path


def probe(blkimg, path, cache, env=None):
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.run([blkimg, "probe", "-t", cache, "--output=json",
                           path], capture_output=True, text=True, env=e)


def helper_limits(helper, path, cache, env=None):
    e = dict(os.environ)
    e.update(env or {})
    cp = subprocess.run([helper, "-f", "raw", "-t", cache, path, "limits"],
                        capture_output=True, text=True, env=e, check=True)
    return json.loads(cp.stdout)


@pytest.mark.parametrize("cache", ["none", "writeback"])
def test_probe_reports_the_driver_limits(any_storage, blkimg, bi_helper,
                                         cache):
    path = image(any_storage)
    cp = probe(blkimg, path, cache)
    assert cp.returncode == 0, cp.stderr
    d = json.loads(cp.stdout)
    h = helper_limits(bi_helper, path, cache)
    for k in SAME_AS_HELPER:
        assert d[k] == h[k], (k, d, h)
    assert d["cache"] == cache
    if cache == "none" and any_storage.kind != "tmpfs":
        # The kernel's numbers, stated by statx.
        assert d["request-alignment"] == storage.sector_sizes(
            any_storage)[0], d
        assert d["request-alignment-source"] == "statx", d
    if cache == "writeback":
        assert d["request-alignment"] == 1 and d["min-mem-alignment"] == 1
    assert d["opt-mem-alignment"] >= PAGE


def test_probe_sources_without_statx(storage_ext4_4k, blkimg, bi_helper):
    """A hole at block 0 and no statx: probing must not report 1."""
    path = image(storage_ext4_4k)
    env = {"BLKIMG_LIMITS_SKIP": "statx"}
    d = json.loads(probe(blkimg, path, "none", env).stdout)
    assert d["request-alignment"] == max(4096, PAGE), d
    assert d["request-alignment-source"] == "fallback", d


def test_probe_o_direct_refused(storage_ramfs, blkimg):
    path = image(storage_ramfs)
    cp = probe(blkimg, path, "none")
    assert cp.returncode == 1
    assert cp.stdout == ""
    assert cp.stderr.count("\n") == 1, cp.stderr
    assert "filesystem does not support O_DIRECT: Invalid argument" in \
        cp.stderr
    assert "'%s'" % path in cp.stderr
