# SPDX-License-Identifier: MIT
"""Power-loss trials (powerloss_trials.py): the power fails during a
chosen write of a workload on a qcow2 image; afterwards qemu-img check
and blkimg check find no corruption and agree, and every write completed
before the last completed flush reads back. make check runs each
workload's crash points (every third) with one seed each; `make torture` runs
thousands of trials."""
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
import powerloss_trials  # noqa: E402

pytestmark = pytest.mark.qemu


@pytest.mark.parametrize("name", sorted(powerloss_trials.WORKLOADS))
def test_power_lost_at_every_write(name, blkimg, blkimg_io, sanitized,
                                   tmp_path):
    span = powerloss_trials.WORKLOADS[name][3]
    step = 6 if sanitized else 3
    problems, crashes = [], 0
    for writes in range(1, span + 1, step):
        seed = 7919 * writes + len(name)
        p, crashed = powerloss_trials.run_trial(
            blkimg, blkimg_io, str(tmp_path), name, writes, seed)
        problems += p
        crashes += crashed
    assert not problems, "\n\n".join(problems)
    assert crashes >= len(range(1, span + 1, step)) // 2, \
        "the workload made fewer writes than its span says"


def test_filter_passes_through(run, blkimg_io, qemu_img, qemu_io, tmp_path):
    """With WRITES 0 the power never fails: the filter is a plain pass-
    through (data, flushes, zero writes, discards)."""
    img = str(tmp_path / "p.qcow2")
    run(qemu_img, "create", "-q", "-f", "qcow2", img, "8M", check=True)
    cp = run(blkimg_io, "-f", "qcow2", "-c", "write -P 5 0 192k", "-c",
             "flush", "-c", "write -z 64k 64k", "-c", "discard 128k 4k",
             "powerloss:1:0:" + img)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    cp = run(qemu_io, "-r", "-c", "read -P 5 0 64k", "-c",
             "read -P 0 64k 64k", "-c", "read -P 5 132k 60k", img)
    assert "failed" not in cp.stdout, cp.stdout
    assert run(qemu_img, "check", img).returncode == 0


def test_bad_names_refused(run, blkimg_io, tmp_path):
    for name in ("powerloss:1:x", "powerloss:a:1:f", "powerloss:1::f"):
        cp = run(blkimg_io, "-c", "read 0 512", name)
        assert cp.returncode == 1
        lines = cp.stderr.strip().splitlines()
        assert len(lines) == 1 and "powerloss" in lines[0], cp.stderr
