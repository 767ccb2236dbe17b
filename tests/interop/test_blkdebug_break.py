# SPDX-License-Identifier: MIT
"""blkimg-io's breakpoint commands (break, wait_break, resume,
remove_break) against qemu-io 7.2's, iotest-style: the same script on
copies of one image through blkdebug, stdout compared line by line (the
timings masked), stderr and exit codes too. Then a real use: a qcow2
allocating write held at l2_update or cluster_alloc while an overlapping
write is queued, resumed, and both images checked and compared. Last, the
places where qemu-io waits forever and blkimg-io does not.
"""
import re
import shutil

import pytest

pytestmark = pytest.mark.qemu

# everything after "N ops; " (qemu-io's aio_write -z prints a time since
# boot there)
_OPS = re.compile(r"^(.* ops; ).*$", re.M)

SCRIPTS = {
    "basic": ["break write_aio A", "aio_write 0 64k", "wait_break A",
              "resume A", "aio_flush"],
    "errors": ["resume A", "remove_break A", "break bogus A", "wait_break",
               "break write_aio", "resume", "break a b c"],
    "remove-suspended": ["break write_aio A", "aio_write 0 64k",
                         "wait_break A", "remove_break A", "aio_flush"],
    "remove-pending": ["break write_aio A", "remove_break A",
                       "aio_write -P 0x33 0 64k", "aio_flush",
                       "read -P 0x33 0 64k"],
    "two-tags": ["break write_aio A", "break write_aio B",
                 "aio_write 0 64k", "wait_break A", "wait_break B",
                 "resume A", "resume B", "aio_flush"],
    # one breakpoint each: the first request, held, keeps no lock from
    # the second (QEMU raises write_aio after dropping the qcow2 lock)
    "two-requests": ["break write_aio A", "aio_write -P 0xaa 0 64k",
                     "wait_break A", "break write_aio B",
                     "aio_write -P 0xbb 128k 64k", "wait_break B",
                     "resume A", "resume B", "aio_flush",
                     "read -P 0xaa 0 64k", "read -P 0xbb 128k 64k"],
    "two-on-one": ["break write_aio A", "break write_aio B",
                   "aio_write -P 0xaa 0 64k", "aio_write -P 0xbb 128k 64k",
                   "wait_break A", "wait_break B", "resume B", "resume A",
                   "aio_flush", "read -P 0xaa 0 64k",
                   "read -P 0xbb 128k 64k"],
    "chain": ["break cluster_alloc A", "break l2_update B",
              "aio_write -P 0xaa 0 64k", "wait_break A", "resume A",
              "wait_break B", "resume B", "aio_flush"],
    "read": ["write -P 0x11 0 64k", "break read_aio A",
             "aio_read -P 0x11 0 64k", "wait_break A", "resume A",
             "aio_flush"],
    "pwritev": ["break pwritev A", "aio_write -P 0x44 64k 4k",
                "wait_break A", "resume A", "aio_flush",
                "read -P 0x44 64k 4k"],
    # a request held where its cluster is allocated or its L2 entry
    # written, while an overlapping one waits for it
    "overlap-l2_update": [
        "break l2_update A", "aio_write -P 0xaa 0 64k", "wait_break A",
        "aio_write -P 0xbb 32k 64k", "resume A", "aio_flush",
        "read -P 0xaa 0 32k", "read -P 0xbb 32k 64k"],
    "overlap-cluster_alloc": [
        "break cluster_alloc A", "aio_write -P 0xaa 0 64k", "wait_break A",
        "aio_write -P 0xbb 32k 64k", "resume A", "aio_flush",
        "read -P 0xaa 0 32k", "read -P 0xbb 32k 64k"],
}


def mask(text):
    return _OPS.sub(r"\1X", text)


def both(tmp_path, run, blkimg_io, qemu_io, qemu_img, cmds, image=None,
         prefix="blkdebug::"):
    """Runs cmds through qemu-io and blkimg-io on copies of one fresh
    1M qcow2 image; returns both results and image paths."""
    src = tmp_path / "src.qcow2"
    run(qemu_img, "create", "-q", "-f", "qcow2", src, "1M", check=True)
    out = []
    for tool, name in ((qemu_io, "q.qcow2"), (blkimg_io, "b.qcow2")):
        img = tmp_path / name
        shutil.copy(src, img)
        args = []
        for c in cmds:
            args += ["-c", c]
        # a script qemu-io hangs on fails in a minute, not five
        out.append((run(tool, *args, prefix + str(img), timeout=60), img))
    return out


# scripts where two writes complete at once: the order of their "wrote"
# lines is the I/O's
UNORDERED = {"two-requests", "two-on-one"}


def pairs(text):
    """The report lines of a completion ("wrote ...", "N KiB, ... ops")
    as one item each, the other lines as they are."""
    lines, out = text.splitlines(), []
    for ln in lines:
        if out and " ops; " in ln:
            out[-1] += "\n" + ln
        else:
            out.append(ln)
    return out


def assert_same(q, b, ordered=True):
    if ordered:
        assert mask(b.stdout) == mask(q.stdout), (q.stdout, b.stdout)
    else:
        qs, bs = pairs(mask(q.stdout)), pairs(mask(b.stdout))
        assert sorted(bs) == sorted(qs), (q.stdout, b.stdout)
        keep = [ln for ln in qs if ln.startswith("blkdebug:")]
        assert [ln for ln in bs if ln.startswith("blkdebug:")] == keep
    assert b.stderr.replace("blkimg-io:", "qemu-io:") == q.stderr
    assert b.returncode == q.returncode


def check_clean(run, blkimg, qemu_img, img):
    q = run(qemu_img, "check", img)
    b = run(blkimg, "check", img)
    assert q.returncode == 0, q.stdout + q.stderr
    assert b.returncode == 0, b.stdout + b.stderr


@pytest.mark.parametrize("name", list(SCRIPTS))
def test_script(tmp_path, run, blkimg, blkimg_io, qemu_io, qemu_img, name):
    (q, qimg), (b, bimg) = both(tmp_path, run, blkimg_io, qemu_io, qemu_img,
                                SCRIPTS[name])
    assert_same(q, b, name not in UNORDERED)
    assert "failed" not in q.stdout
    check_clean(run, blkimg, qemu_img, bimg)
    check_clean(run, blkimg, qemu_img, qimg)
    r = run(qemu_img, "compare", "-q", qimg, bimg)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize("cmd", ["break write_aio A", "resume A",
                                 "remove_break A"])
def test_no_filter(tmp_path, run, blkimg_io, qemu_io, qemu_img, cmd):
    """Without blkdebug below the image the calls find no filter."""
    (q, _), (b, _) = both(tmp_path, run, blkimg_io, qemu_io, qemu_img,
                          [cmd, "write 0 4k"], prefix="")
    assert_same(q, b)
    assert "Operation not supported" in b.stdout


# qemu-io waits forever in these; blkimg-io resumes the request (or, for
# wait_break, says that nothing can get there)
HANG_CASES = {
    "aio_flush": ["break write_aio A", "aio_write -P 0x55 0 64k",
                  "wait_break A", "aio_flush", "read -P 0x55 0 64k"],
    "exit": ["break write_aio A", "aio_write -P 0x55 0 64k",
             "wait_break A"],
    "sync-overlap": ["break l2_update A", "aio_write -P 0x55 0 64k",
                     "wait_break A", "write -P 0x66 32k 4k",
                     "read -P 0x55 0 32k", "read -P 0x66 32k 4k"],
    "same-tag-twice": ["break write_aio A", "break write_aio A",
                       "aio_write -P 0x55 0 64k", "wait_break A",
                       "resume A", "aio_flush", "read -P 0x55 0 64k"],
}


@pytest.mark.parametrize("name", list(HANG_CASES))
def test_no_hang(tmp_path, run, blkimg, blkimg_io, qemu_img, qemu_io, name):
    img = tmp_path / "b.qcow2"
    run(qemu_img, "create", "-q", "-f", "qcow2", img, "1M", check=True)
    args = []
    for c in HANG_CASES[name]:
        args += ["-c", c]
    b = run(blkimg_io, *args, "blkdebug::%s" % img)
    assert b.returncode == 0, b.stdout + b.stderr
    assert "failed" not in b.stdout
    assert b.stdout.count("Resuming request 'A'") == \
        b.stdout.count("Suspended request 'A'") >= 1
    check_clean(run, blkimg, qemu_img, img)
    r = run(qemu_io, "-r", "-c", "read -P 0x55 0 32k", img)
    assert "failed" not in r.stdout and r.returncode == 0


@pytest.mark.parametrize("cmds", [
    ["wait_break A"],
    ["break write_aio A", "wait_break B"],
    ["break write_aio A", "aio_write 0 64k", "wait_break A", "wait_break B",
     "resume A", "aio_flush"],
])
def test_wait_break_deadlock(tmp_path, run, blkimg_io, qemu_img, cmds):
    img = tmp_path / "b.qcow2"
    run(qemu_img, "create", "-q", "-f", "qcow2", img, "1M", check=True)
    args = []
    for c in cmds:
        args += ["-c", c]
    b = run(blkimg_io, *args, "blkdebug::%s" % img)
    assert b.returncode == 1
    assert "Could not wait for request 'B': Resource deadlock avoided" in \
        b.stdout or \
        "Could not wait for request 'A': Resource deadlock avoided" in \
        b.stdout
