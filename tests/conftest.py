# SPDX-License-Identifier: MIT
"""Shared pytest fixtures for blkimg's integration and interop suites.

Binaries come from the build directory named by the environment variable
BLKIMG_BUILD (default: <repo>/build; a relative name is taken relative to
the repository root). `make check` runs the suites twice: on build/ and on
the ASan+UBSan build build-asan/.

Fixtures
  repo_root, build_dir     absolute pathlib.Path
  blkimg, blkimg_io        absolute paths (str) of the tools; the test fails
                           (it is not skipped) when they are not built
  run                      run(cmd..., input=, timeout=, env=, cwd=, check=)
                           -> subprocess.CompletedProcess with text stdout
                           and stderr; a sanitizer report in stderr fails the
                           test at once
  run_bytes                the same with bytes stdout/stderr
  qemu_img, qemu_io        paths of QEMU's tools; the test is skipped when
                           they are missing
  sanitized                True when the build is an ASan/UBSan build
  mask_timing              function masking qemu-io's timing numbers
  prebuilt                 prebuilt(key, build) -> directory (pathlib.Path)
                           in which build(dir) made test images, once per
                           key and pytest worker; tests never modify it:
                           they copy what they need (ops_helpers.twin_copy)
Markers
  slow      long tests (crash trials, big images): normal build only
  torture   the longest trials: make torture only, never make check
  qemu      needs qemu-img / qemu-io (skipped when missing)
  root      needs root (loop devices, mounts; skipped otherwise)
  loop      creates loop devices (implies root)
"""
import json
import os
import re
import shutil
import subprocess
import time

import pytest

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SANITIZER_PATTERNS = (
    "ERROR: AddressSanitizer",
    "ERROR: LeakSanitizer",
    "runtime error:",  # UBSan
    "WARNING: AddressSanitizer",
)

DEFAULT_TIMEOUT = 300


def _build_dir():
    d = os.environ.get("BLKIMG_BUILD", "build")
    if not os.path.isabs(d):
        d = os.path.join(REPO_ROOT, d)
    return os.path.realpath(d)


def pytest_configure(config):
    for line in (
        "slow: long-running test (crash trials, large images)",
        "torture: the longest trials, run by make torture, not make check",
        "qemu: needs QEMU's qemu-img / qemu-io (skipped when missing)",
        "root: needs root privileges (skipped otherwise)",
        "loop: creates loop devices (needs root; cleans up on failure)",
    ):
        config.addinivalue_line("markers", line)


def pytest_report_header(config):
    return "blkimg build: %s" % _build_dir()


def pytest_collection_modifyitems(config, items):
    no_qemu = shutil.which("qemu-img") is None or shutil.which("qemu-io") is None
    not_root = os.geteuid() != 0
    for item in items:
        if no_qemu and "qemu" in item.keywords:
            item.add_marker(pytest.mark.skip(reason="qemu-img/qemu-io missing"))
        if not_root and ("root" in item.keywords or "loop" in item.keywords):
            item.add_marker(pytest.mark.skip(reason="needs root"))


def sanitizer_report(stderr):
    """Returns the first sanitizer report line in stderr, or None."""
    if isinstance(stderr, bytes):
        stderr = stderr.decode("utf-8", "replace")
    for line in (stderr or "").splitlines():
        if any(p in line for p in SANITIZER_PATTERNS):
            return line
    return None


def run_cmd(*cmd, input=None, timeout=DEFAULT_TIMEOUT, env=None, cwd=None,
            check=False, text=True):
    """Runs a command and returns the CompletedProcess (output captured).

    cmd may be given as separate arguments or as one list; pathlib paths
    and numbers are converted to str. env entries are added to (not
    replacing) the current environment. A sanitizer report in stderr
    fails the calling test.
    """
    if len(cmd) == 1 and isinstance(cmd[0], (list, tuple)):
        cmd = cmd[0]
    argv = [str(c) for c in cmd]
    full_env = None
    if env is not None:
        full_env = dict(os.environ)
        full_env.update({k: str(v) for k, v in env.items()})
    if input is not None and text and isinstance(input, bytes):
        text = False
    try:
        cp = subprocess.run(argv, input=input, capture_output=True,
                            timeout=timeout, env=full_env,
                            cwd=str(cwd) if cwd is not None else None,
                            text=text,
                            stdin=None if input is not None else
                            subprocess.DEVNULL)
    except subprocess.TimeoutExpired as e:
        pytest.fail("command timed out after %ss: %s" % (timeout,
                                                       " ".join(argv)))
        raise e  # not reached
    report = sanitizer_report(cp.stderr)
    if report:
        pytest.fail("sanitizer report from %s:\n%s" % (" ".join(argv),
                                                       cp.stderr))
    if check and cp.returncode != 0:
        pytest.fail("command failed (exit %d): %s\nstdout:\n%s\nstderr:\n%s" %
                    (cp.returncode, " ".join(argv), cp.stdout, cp.stderr))
    return cp


# qemu-img 7.2 times PBKDF2 by its thread's user CPU time, which the
# kernel splits from system time by tick samples: on a loaded machine a
# run can see no user time pass and refuse ("Unable to get accurate CPU
# usage"). QEMU's sanity check, not the case under test.
PBKDF2_TIMING = "Unable to get accurate CPU usage"


def qemu_pbkdf2_retry(*cmd, tries=10, **kw):
    """run_cmd of a qemu-img command that times PBKDF2 (create, amend,
    measure, convert to an encrypted image), tried again, after a pause
    that grows, while it fails for its timing alone. The last result."""
    for i in range(tries):
        cp = run_cmd(*cmd, **kw)
        if cp.returncode == 0 or PBKDF2_TIMING not in cp.stderr:
            break
        time.sleep(0.1 * (i + 1))
    return cp


# qemu-io timing lines:
#   "512 bytes, 1 ops; 00.00 sec (1.466 MiB/sec and 3003.0030 ops/sec)"
#   "1 KiB, 1 ops; 00.00 sec (1004.986 KiB/sec and 1004.9857 ops/sec)"
#   "read 512/512 bytes at offset 0" is kept as it is.
_TIMING = re.compile(
    r"^([0-9.]+ (?:bytes|[KMGTPE]iB), \d+ ops; )[0-9:.]+ sec \([^)]*\)$",
    re.M)


def mask_timing_text(s):
    """Replaces the numbers of qemu-io's timing lines with 'X'."""
    if isinstance(s, bytes):
        s = s.decode("utf-8", "replace")
    return _TIMING.sub(r"\1X sec (X)", s)


@pytest.fixture(scope="session")
def repo_root():
    import pathlib
    return pathlib.Path(REPO_ROOT)


@pytest.fixture(scope="session")
def build_dir():
    import pathlib
    return pathlib.Path(_build_dir())


def _tool(build, name):
    path = os.path.join(str(build), name)
    if not os.access(path, os.X_OK):
        pytest.fail("%s is not built (run `make` or set BLKIMG_BUILD)" % path)
    return path


@pytest.fixture(scope="session")
def blkimg(build_dir):
    return _tool(build_dir, "blkimg")


@pytest.fixture(scope="session")
def blkimg_io(build_dir):
    return _tool(build_dir, "blkimg-io")


@pytest.fixture
def run():
    return run_cmd


@pytest.fixture
def run_bytes():
    def _run(*cmd, **kw):
        kw["text"] = False
        return run_cmd(*cmd, **kw)
    return _run


@pytest.fixture(scope="session")
def qemu_img():
    p = shutil.which("qemu-img")
    if p is None:
        pytest.skip("qemu-img missing")
    return p


@pytest.fixture(scope="session")
def qemu_io():
    p = shutil.which("qemu-io")
    if p is None:
        pytest.skip("qemu-io missing")
    return p


def has_qemu():
    return shutil.which("qemu-img") is not None and \
        shutil.which("qemu-io") is not None


@pytest.fixture(scope="session")
def sanitized(build_dir):
    path = os.path.join(str(build_dir), "meson-info",
                        "intro-buildoptions.json")
    try:
        with open(path) as f:
            opts = json.load(f)
    except (OSError, ValueError):
        return False
    for o in opts:
        if o.get("name") == "b_sanitize":
            return o.get("value") not in (None, "", "none")
    return False


@pytest.fixture(scope="session")
def mask_timing():
    return mask_timing_text


@pytest.fixture(scope="session")
def prebuilt(tmp_path_factory):
    dirs = {}

    def get(key, build):
        if key not in dirs:
            d = tmp_path_factory.mktemp("prebuilt")
            build(d)
            dirs[key] = d
        return dirs[key]
    return get


@pytest.fixture
def small_tmpfs(tmp_path):
    """factory(size="4M") -> a tmpfs of that size mounted under tmp_path
    (for out-of-space cases); unmounted at the end of the test."""
    if os.geteuid() != 0:
        pytest.skip("needs root (tmpfs mount)")
    mounts = []

    def mount(size="4M"):
        mnt = tmp_path / ("tmpfs%d" % len(mounts))
        mnt.mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=" + size,
                        "tmpfs", str(mnt)], check=True)
        mounts.append(mnt)
        return mnt
    try:
        yield mount
    finally:
        for mnt in mounts:
            subprocess.run(["umount", "-l", str(mnt)])


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if rep.when == "call":
        item.blkimg_passed = rep.passed


@pytest.fixture(autouse=True)
def _drop_tmp_path_of_passed_test(request):
    """A passed test's tmp_path is removed at its end (its images can be
    hundreds of MiB; pytest keeps three runs' worth); a failed test keeps
    its files for a look. Autouse, so torn down after the test's own
    fixtures (mounts are gone by then)."""
    yield
    if "tmp_path" not in request.fixturenames:
        return
    if not getattr(request.node, "blkimg_passed", False):
        return
    path = request.node.funcargs.get("tmp_path")
    if path is not None:
        shutil.rmtree(path, ignore_errors=True)


# ------------------------------------------------ images made by the peers

PEER_CACHE = os.environ.get("BLKIMG_PEER_CACHE",
                            "/var/tmp/blkimg-test-cache")


def peer_version():
    cp = subprocess.run(["qemu-img", "--version"], capture_output=True,
                        text=True)
    return cp.stdout.splitlines()[0] if cp.returncode == 0 else "none"


def cached_dir(key, build):
    """A directory that build(path) filled once, shared by every pytest
    worker and by both builds' runs (normal and sanitizer): for images
    that QEMU's tools make slowly (LUKS: qemu-img times PBKDF2 for half a
    second of CPU per key slot). key names everything the images depend
    on; the qemu-img version is added. Only images the peers make belong
    here, never blkimg's. Returns the directory (read it, copy from it,
    never write to it)."""
    import fcntl
    import hashlib
    digest = hashlib.sha256(("%s|%s" % (peer_version(), key)).encode())
    path = os.path.join(PEER_CACHE, digest.hexdigest()[:24])
    os.makedirs(PEER_CACHE, exist_ok=True)
    with open(path + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not os.path.isdir(path):
            tmp = path + ".tmp"
            shutil.rmtree(tmp, ignore_errors=True)
            os.makedirs(tmp)
            build(tmp)
            os.rename(tmp, path)
    import pathlib
    return pathlib.Path(path)
