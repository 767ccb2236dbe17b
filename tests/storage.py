# SPDX-License-Identifier: MIT
"""Real storage for tests: the places images live in production.

Kinds (Storage.kind):
  disk       a directory on this machine's disk (512-byte logical sectors)
  ext4-4k    ext4 on a loop device with 4096-byte logical sectors
  xfs-4k     xfs on a loop device with 4096-byte logical sectors
  loop-4k    the 4096-byte-sector loop block device itself (no filesystem)
  tmpfs      a tmpfs mount (O_DIRECT works on Linux >= 6.6, any alignment)
  ramfs      a ramfs mount (refuses O_DIRECT)

Everything created is torn down even when the test fails: filesystems are
unmounted (lazily if busy), loop devices detached, backing files removed.
An atexit hook repeats the cleanup for anything a crashed fixture left.

Use as a context manager:

    with storage.make("xfs-4k") as st:
        img = st.path("a.img")      # for loop-4k: the device itself

or through the pytest fixtures at the end of this module (import them in a
test module: `from storage import storage_kind, any_storage, ...`).
Kinds that need root are skipped cleanly when not root.
"""
import atexit
import contextlib
import os
import shutil
import subprocess
import tempfile

import pytest

KINDS = ("disk", "ext4-4k", "xfs-4k", "loop-4k", "tmpfs", "ramfs")
NEEDS_ROOT = {"ext4-4k", "xfs-4k", "loop-4k", "tmpfs", "ramfs"}

# mkfs.xfs refuses filesystems below 300 MiB; backing files are sparse.
LOOP_SIZE = 512 * 1024 * 1024

_pending = []  # cleanup callables not yet run (for atexit)


def _run(*argv, check=True):
    cp = subprocess.run([str(a) for a in argv], capture_output=True,
                        text=True, stdin=subprocess.DEVNULL)
    if check and cp.returncode != 0:
        raise RuntimeError("%s failed (%d): %s" % (" ".join(map(str, argv)),
                                                   cp.returncode,
                                                   cp.stderr.strip()))
    return cp


def is_root():
    return os.geteuid() == 0


def have(tool):
    return shutil.which(tool) is not None


class Storage:
    """One storage place. dir is None for a block device."""

    def __init__(self, kind, dir=None, device=None, backing=None):
        self.kind = kind
        self.dir = dir
        self.device = device      # loop device node, if any
        self.backing = backing    # loop backing file, if any

    @property
    def is_block_device(self):
        return self.kind == "loop-4k"

    @property
    def filesystem(self):
        return {"disk": None, "ext4-4k": "ext4", "xfs-4k": "xfs",
                "loop-4k": "block device", "tmpfs": "tmpfs",
                "ramfs": "ramfs"}[self.kind]

    def path(self, name="image"):
        """Where an image named name lives (the device for loop-4k)."""
        if self.dir is None:
            return self.device
        return os.path.join(self.dir, name)

    def __repr__(self):
        return "Storage(%s, %s)" % (self.kind, self.dir or self.device)


def ofd_locks(path):
    """The byte ranges (start, end) of OFD locks on path, from /proc/locks:
    its entries name a file by device and inode ("07:00:131"), and inode
    numbers repeat across the file systems that parallel tests make, so
    both must match."""
    st = os.stat(path)
    me = "%02x:%02x:%d" % (os.major(st.st_dev), os.minor(st.st_dev),
                           st.st_ino)
    out = []
    with open("/proc/locks") as f:
        for line in f:
            p = line.split()
            if "OFDLCK" not in p or p[-3] != me:
                continue
            end = (1 << 62) if p[-1] == "EOF" else int(p[-1])
            out.append((int(p[-2]), end))
    return out


def _disk_sector_sizes(path):
    """(logical, physical) sector sizes of the device holding path."""
    st = os.stat(path)
    base = "/sys/dev/block/%d:%d" % (os.major(st.st_dev), os.minor(st.st_dev))
    out = []
    for name in ("logical_block_size", "physical_block_size"):
        for q in (base + "/queue/" + name, base + "/../queue/" + name):
            try:
                with open(q) as f:
                    out.append(int(f.read()))
                    break
            except OSError:
                continue
        else:
            out.append(0)
    return tuple(out)


def sector_sizes(st):
    """(logical, physical) sector sizes under storage st (0 if unknown)."""
    if st.device:
        name = os.path.basename(os.path.realpath(st.device))
        res = []
        for f in ("logical_block_size", "physical_block_size"):
            with open("/sys/block/%s/queue/%s" % (name, f)) as fp:
                res.append(int(fp.read()))
        return tuple(res)
    if st.kind in ("tmpfs", "ramfs"):
        return (0, 0)
    return _disk_sector_sizes(st.dir)


class _Cleanup:
    """Runs registered undo steps in reverse order, each at most once,
    never raising (a failing step does not stop the others)."""

    def __init__(self):
        self.steps = []
        _pending.append(self)

    def add(self, fn, *args):
        self.steps.append((fn, args))

    def run(self):
        while self.steps:
            fn, args = self.steps.pop()
            try:
                fn(*args)
            except Exception:  # keep cleaning up
                pass
        if self in _pending:
            _pending.remove(self)


def _umount(mnt):
    if _run("umount", mnt, check=False).returncode != 0:
        _run("umount", "-l", mnt, check=False)


def _losetup_detach(dev):
    for _ in range(10):
        if _run("losetup", "-d", dev, check=False).returncode == 0:
            return
        subprocess.run(["udevadm", "settle"], capture_output=True)


def _rmtree(path):
    shutil.rmtree(path, ignore_errors=True)


def _unlink(path):
    try:
        os.unlink(path)
    except OSError:
        pass


@atexit.register
def _cleanup_all():
    for c in list(_pending):
        c.run()


def _mkdtemp(prefix, base=None):
    return tempfile.mkdtemp(prefix="blkimg-" + prefix + "-", dir=base)


@contextlib.contextmanager
def make(kind, workdir=None):
    """Creates storage of the given kind; yields a Storage; tears it down.

    workdir: where loop backing files and the disk directory go (default:
    the system temporary directory, which is on the 512-byte-sector disk).
    """
    if kind not in KINDS:
        raise ValueError("unknown storage kind %r" % kind)
    if kind in NEEDS_ROOT and not is_root():
        pytest.skip("storage %s needs root" % kind)
    c = _Cleanup()
    try:
        if kind == "disk":
            d = _mkdtemp("disk", workdir)
            c.add(_rmtree, d)
            yield Storage(kind, dir=d)
            return

        if kind in ("tmpfs", "ramfs"):
            mnt = _mkdtemp(kind, workdir)
            c.add(_rmtree, mnt)
            opts = ["-o", "size=256m"] if kind == "tmpfs" else []
            _run("mount", "-t", kind, *opts, kind, mnt)
            c.add(_umount, mnt)
            yield Storage(kind, dir=mnt)
            return

        # Loop-device kinds.
        if not have("losetup"):
            pytest.skip("losetup missing")
        if kind == "xfs-4k" and not have("mkfs.xfs"):
            pytest.skip("mkfs.xfs missing")
        if kind == "ext4-4k" and not have("mkfs.ext4"):
            pytest.skip("mkfs.ext4 missing")
        fd, backing = tempfile.mkstemp(prefix="blkimg-%s-" % kind,
                                       suffix=".bin", dir=workdir)
        os.close(fd)
        c.add(_unlink, backing)
        os.truncate(backing, LOOP_SIZE)
        cp = _run("losetup", "--sector-size", "4096", "--find", "--show",
                  backing, check=False)
        if cp.returncode != 0:
            pytest.skip("cannot create a loop device: %s" % cp.stderr.strip())
        dev = cp.stdout.strip()
        c.add(_losetup_detach, dev)
        if kind == "loop-4k":
            yield Storage(kind, device=dev, backing=backing)
            return
        if kind == "ext4-4k":
            _run("mkfs.ext4", "-q", "-F", dev)
        else:
            _run("mkfs.xfs", "-q", "-f", dev)
        mnt = _mkdtemp(kind, workdir)
        c.add(_rmtree, mnt)
        _run("mount", dev, mnt)
        c.add(_umount, mnt)
        yield Storage(kind, dir=mnt, device=dev, backing=backing)
    finally:
        c.run()


# ------------------------------------------------------------ fixtures

def _fixture_for(kind):
    @pytest.fixture
    def _f():
        with make(kind) as st:
            yield st
    _f.__name__ = "storage_" + kind.replace("-", "_")
    return _f


storage_disk = _fixture_for("disk")
storage_ext4_4k = _fixture_for("ext4-4k")
storage_xfs_4k = _fixture_for("xfs-4k")
storage_loop_4k = _fixture_for("loop-4k")
storage_tmpfs = _fixture_for("tmpfs")
storage_ramfs = _fixture_for("ramfs")


@pytest.fixture(params=["disk", "ext4-4k", "xfs-4k", "loop-4k", "tmpfs"])
def any_storage(request):
    """Every storage that accepts O_DIRECT, one test per kind."""
    with make(request.param) as st:
        yield st


@pytest.fixture(params=["disk", "ext4-4k", "xfs-4k", "tmpfs"])
def file_storage(request):
    """Every filesystem storage that accepts O_DIRECT (no block device)."""
    with make(request.param) as st:
        yield st


# ------------------------------------------------- library test helper

# A small program on libblkimg's public API, for checks that need no tool
# (limits and storage facts of the protocol node, aligned/unaligned I/O,
# create, truncate, holding an image open for lock tests).
HELPER_SOURCE = r"""
#include <blkimg/blkimg.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int usage(void)
{
    fprintf(stderr, "usage: helper [-r] [-U] [-f fmt] [-t cache] file "
                    "limits|read OFF LEN|write OFF LEN BYTE|"
                    "zero OFF LEN [unmap]|truncate SIZE PREALLOC|"
                    "hold SECONDS\n"
                    "       helper create file SIZE PREALLOC [OPTIONS]\n");
    return 2;
}

int main(int argc, char **argv)
{
    struct bi_open_opts o;
    bi_error err;
    int i = 1, ret = 0;
    const char *fmt = "raw";
    size_t dirty = 0;

    bi_open_opts_init(&o);
    bi_error_init(&err);
    o.read_write = true;
    o.quiet_probe = true;
    if (argc >= 5 && !strcmp(argv[1], "create")) {
        struct bi_create_opts c;
        uint64_t size;
        bi_create_opts_init(&c);
        c.format = "raw";
        bi_parse_size(argv[3], &size);
        c.size = size;
        c.size_set = true;
        if (bi_prealloc_parse(argv[4], &c.prealloc) < 0)
            return usage();
        const char *options[2] = {argc > 5 ? argv[5] : NULL, NULL};
        c.options = options;
        if (bi_create(argv[2], &c, &err) < 0) {
            fprintf(stderr, "helper: %s\n", err.msg);
            return 1;
        }
        return 0;
    }
    for (; i < argc && argv[i][0] == '-'; i++) {
        if (!strcmp(argv[i], "-r")) {
            o.read_write = false;
        } else if (!strcmp(argv[i], "-D") && i + 1 < argc) {
            dirty = strtoull(argv[++i], NULL, 0);
        } else if (!strcmp(argv[i], "-U")) {
            o.force_share = true;
        } else if (!strcmp(argv[i], "-f") && i + 1 < argc) {
            fmt = argv[++i];
        } else if (!strcmp(argv[i], "-t") && i + 1 < argc) {
            if (bi_cache_parse(argv[++i], &o.cache) < 0)
                return usage();
        } else {
            return usage();
        }
    }
    if (argc - i < 2)
        return usage();
    o.format = fmt;
    const char *file = argv[i], *cmd = argv[i + 1];
    char **a = argv + i + 2;
    int na = argc - i - 2;
    bi_node *n = bi_open(file, &o, &err);
    if (!n) {
        fprintf(stderr, "helper: %s\n", err.msg);
        return 1;
    }
    bi_node *p = bi_node_file(n) ? bi_node_file(n) : n;
    if (dirty) {
        /* -D SIZE: leave freed, dirty aligned memory of that size behind,
         * so that a bounce buffer reusing it starts as garbage: bytes the
         * driver fails to fill show up. */
        void *junk = bi_blockalign(p, dirty);
        memset(junk, 0xA5, dirty);
        bi_free_aligned(junk);
    }
    if (!strcmp(cmd, "limits")) {
        const struct bi_limits *l = bi_node_limits(p);
        struct bi_storage_info si;
        memset(&si, 0, sizeof(si));
        ret = bi_storage_info(n, &si);
        printf("{\"request-alignment\": %u, \"request-alignment-source\": "
               "\"%s\", \"min-mem-alignment\": %u, \"opt-mem-alignment\": %u, "
               "\"mem-alignment-source\": \"%s\", \"max-transfer\": %llu, "
               "\"max-iov\": %u, \"page-size\": %u, \"filesystem\": \"%s\", "
               "\"logical-sector-size\": %u, \"physical-sector-size\": %u, "
               "\"is-block-device\": %s, \"size\": %lld}\n",
               l->request_alignment,
               bi_limit_source_name(l->request_alignment_source),
               l->min_mem_alignment, l->opt_mem_alignment,
               bi_limit_source_name(l->mem_alignment_source),
               (unsigned long long)l->max_transfer, l->max_iov, si.page_size,
               si.filesystem, si.logical_sector_size, si.physical_sector_size,
               si.is_block_device ? "true" : "false",
               (long long)bi_getlength(n));
    } else if (!strcmp(cmd, "read") && na == 2) {
        uint64_t off = strtoull(a[0], NULL, 0), len = strtoull(a[1], NULL, 0);
        /* deliberately misaligned buffer: exercises bouncing */
        char *buf = malloc(len + 1);
        ret = bi_pread(n, off, buf + 1, len);
        if (ret >= 0)
            fwrite(buf + 1, 1, len, stdout);
        free(buf);
    } else if (!strcmp(cmd, "write") && na == 3) {
        uint64_t off = strtoull(a[0], NULL, 0), len = strtoull(a[1], NULL, 0);
        char *buf = malloc(len + 1);
        memset(buf + 1, (int)strtol(a[2], NULL, 0), len);
        ret = bi_pwrite(n, off, buf + 1, len, 0);
        free(buf);
    } else if (!strcmp(cmd, "zero") && na >= 2) {
        ret = bi_pwrite_zeroes(n, strtoull(a[0], NULL, 0),
                               strtoull(a[1], NULL, 0),
                               na > 2 ? BI_REQ_MAY_UNMAP : 0);
    } else if (!strcmp(cmd, "truncate") && na == 2) {
        enum bi_prealloc pa;
        uint64_t size;
        if (bi_parse_size(a[0], &size) < 0 || bi_prealloc_parse(a[1], &pa) < 0)
            return usage();
        ret = bi_truncate(n, size, true, pa, &err);
    } else if (!strcmp(cmd, "hold") && na == 1) {
        printf("locked\n");
        fflush(stdout);
        sleep((unsigned)atoi(a[0]));
    } else {
        return usage();
    }
    if (ret < 0) {
        fprintf(stderr, "helper: %s: %s\n", cmd,
                err.msg[0] ? err.msg : strerror(-ret));
        bi_close(n, NULL);
        return 1;
    }
    if (bi_close(n, &err) < 0) {
        fprintf(stderr, "helper: close: %s\n", err.msg);
        return 1;
    }
    return 0;
}
"""


def build_helper(build_dir, out_dir):
    """Compiles the helper against build_dir's libblkimg; returns its path.
    Fails the test (does not skip) when the library is missing."""
    build_dir = str(build_dir)
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    src = os.path.join(str(out_dir), "bi_storage_helper.c")
    exe = os.path.join(str(out_dir), "bi_storage_helper")
    with open(src, "w") as f:
        f.write(HELPER_SOURCE)
    san = []
    try:
        import json
        with open(os.path.join(build_dir, "meson-info",
                               "intro-buildoptions.json")) as f:
            for o in json.load(f):
                if o.get("name") == "b_sanitize" and \
                        o.get("value") not in (None, "", "none"):
                    san = ["-fsanitize=" + o["value"]]
    except (OSError, ValueError):
        pass
    cp = subprocess.run(
        ["cc", "-std=c11", "-D_GNU_SOURCE", "-Wall", "-Werror", *san,
         "-I" + os.path.join(repo, "include"), src, "-o", exe,
         "-L" + build_dir, "-lblkimg", "-Wl,-rpath," + build_dir],
        capture_output=True, text=True)
    if cp.returncode != 0:
        pytest.fail("cannot build the libblkimg helper:\n" + cp.stderr)
    if san:
        # Sanitized build: any UBSan report must fail the helper (ASan
        # and LeakSanitizer already exit non-zero).
        os.environ.setdefault("UBSAN_OPTIONS",
                              "halt_on_error=1:print_stacktrace=1")
    return exe


@pytest.fixture(scope="session")
def bi_helper(build_dir, tmp_path_factory):
    return build_helper(build_dir, tmp_path_factory.mktemp("helper"))


def fill_up(path):
    """Writes path until the file system is full (out-of-space cases)."""
    fd = os.open(str(path), os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        while True:
            os.write(fd, b"\1" * 4096)
    except OSError:
        pass
    finally:
        os.close(fd)
