# SPDX-License-Identifier: MIT
"""The Debian packages: `dpkg-buildpackage -us -uc -b` on a clean copy of
the tree (the files git tracks, or would track) builds blkimg, libblkimg1,
libblkimg-dev and blkimg-nbd (the nbdkit plugin and blkimg-nbd); lintian
finds nothing (errors, warnings); unpacked into
a scratch root (dpkg -x), the tools run from there against the packaged
library (blkimg --version, a convert checked byte for byte), the example
builds against the packaged headers through pkg-config, and the man pages,
their links and the bash completion are where man and bash-completion
look.

Slow (a whole package build, about half a minute of CPU): it runs in the
normal-build pass of make check only; it does not depend on the build
directory under test."""
import glob
import os
import shutil
import subprocess

import pytest

pytestmark = pytest.mark.slow

REPO = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
PACKAGES = ("blkimg", "libblkimg1", "libblkimg-dev", "blkimg-nbd")


def sh(*argv, cwd=None, env=None, timeout=900):
    full_env = dict(os.environ)
    full_env.update(env or {})
    cp = subprocess.run([str(a) for a in argv], cwd=cwd, env=full_env,
                        capture_output=True, text=True, timeout=timeout,
                        stdin=subprocess.DEVNULL)
    return cp


def clean_copy(dest):
    """The files of the tree git would commit (tracked, and untracked ones
    not ignored), copied into dest."""
    cp = sh("git", "ls-files", "-z", "--cached", "--others",
            "--exclude-standard", cwd=REPO)
    assert cp.returncode == 0, cp.stderr
    for rel in cp.stdout.split("\0"):
        src = os.path.join(REPO, rel)
        if not rel or not os.path.lexists(src):
            continue  # deleted in the work tree
        os.makedirs(os.path.dirname(os.path.join(dest, rel)), exist_ok=True)
        if os.path.islink(src):
            os.symlink(os.readlink(src), os.path.join(dest, rel))
        else:
            shutil.copy2(src, os.path.join(dest, rel))


@pytest.fixture(scope="module")
def debs(tmp_path_factory):
    """{package: path of its .deb}, built once for the module."""
    if shutil.which("dpkg-buildpackage") is None:
        pytest.skip("dpkg-buildpackage missing (not a Debian system)")
    top = tmp_path_factory.mktemp("deb")
    src = top / "blkimg"
    clean_copy(src)
    cp = sh("dpkg-checkbuilddeps", cwd=src)
    assert cp.returncode == 0, \
        "build dependencies missing (scripts/deps.sh installs them): " + \
        cp.stderr
    # nocheck: the suites run in make check; noopt: a faster compile (the
    # package is what is tested here, not the optimiser).
    cp = sh("dpkg-buildpackage", "-us", "-uc", "-b", cwd=src,
            env={"DEB_BUILD_OPTIONS": "nocheck noautodbgsym noopt "
                 "parallel=2"})
    assert cp.returncode == 0, cp.stdout[-4000:] + cp.stderr[-4000:]
    found = {}
    for p in PACKAGES:
        paths = glob.glob(str(top / ("%s_*.deb" % p)))
        assert len(paths) == 1, (p, os.listdir(top))
        found[p] = paths[0]
    assert len(glob.glob(str(top / "*.deb"))) == len(PACKAGES)
    return found


@pytest.fixture(scope="module")
def root(debs, tmp_path_factory):
    """A scratch root with the three packages unpacked."""
    r = tmp_path_factory.mktemp("root")
    for p in PACKAGES:
        cp = sh("dpkg", "-x", debs[p], r)
        assert cp.returncode == 0, cp.stderr
    return r


def contents(deb):
    cp = sh("dpkg-deb", "-c", deb)
    assert cp.returncode == 0, cp.stderr
    return [line.split()[5].lstrip(".") for line in cp.stdout.splitlines()]


def multiarch():
    return sh("dpkg-architecture", "-qDEB_HOST_MULTIARCH").stdout.strip()


def test_packages_hold_what_they_should(debs):
    lib = "/usr/lib/%s" % multiarch()
    tools = contents(debs["blkimg"])
    for f in ("/usr/bin/blkimg", "/usr/bin/blkimg-io",
              "/usr/share/man/man1/blkimg.1.gz",
              "/usr/share/man/man1/blkimg-io.1.gz",
              "/usr/share/bash-completion/completions/blkimg",
              "/usr/share/bash-completion/completions/blkimg-io"):
        assert f in tools, f
    assert not [f for f in tools if "/lib/" in f or "/include/" in f]
    shared = contents(debs["libblkimg1"])
    assert lib + "/libblkimg.so.1" in shared
    assert not [f for f in shared if f.endswith(".so") or "/man" in f]
    dev = contents(debs["libblkimg-dev"])
    for f in (lib + "/libblkimg.so", lib + "/pkgconfig/blkimg.pc",
              "/usr/include/blkimg/blkimg.h",
              "/usr/share/man/man3/libblkimg.3.gz",
              "/usr/share/man/man3/bi_open.3.gz",
              "/usr/share/man/man3/bi_close.3.gz",
              "/usr/share/doc/libblkimg-dev/examples/image-summary.c"):
        assert f in dev, f
    cp = sh("dpkg-deb", "-f", debs["blkimg"], "Depends")
    assert "libblkimg1 (>= " in cp.stdout, cp.stdout
    nbd = contents(debs["blkimg-nbd"])
    for f in ("/usr/bin/blkimg-nbd",
              lib + "/nbdkit/plugins/nbdkit-blkimg-plugin.so",
              "/usr/share/man/man1/blkimg-nbd.1.gz",
              "/usr/share/man/man1/nbdkit-blkimg-plugin.1.gz"):
        assert f in nbd, f
    cp = sh("dpkg-deb", "-f", debs["blkimg-nbd"], "Depends")
    assert "nbdkit" in cp.stdout and "libblkimg1 (>= " in cp.stdout, \
        cp.stdout


def test_lintian_is_clean(debs):
    if shutil.which("lintian") is None:
        pytest.fail("lintian missing (scripts/deps.sh installs it)")
    changes = glob.glob(os.path.join(os.path.dirname(debs["blkimg"]),
                                     "*.changes"))
    assert len(changes) == 1
    cp = sh("lintian", "--fail-on", "error,warning", changes[0])
    tags = [line for line in cp.stdout.splitlines()
            if line[:2] in ("E:", "W:")]
    assert cp.returncode == 0 and not tags, cp.stdout + cp.stderr


def test_tools_run_from_the_scratch_root(root, tmp_path):
    libdir = root / "usr" / "lib" / multiarch()
    env = {"LD_LIBRARY_PATH": str(libdir)}
    blkimg = root / "usr" / "bin" / "blkimg"
    cp = sh(blkimg, "--version", env=env)
    assert cp.returncode == 0, cp.stderr
    assert cp.stdout.startswith("blkimg version ")
    ldd = sh("ldd", blkimg, env=env).stdout
    assert str(libdir / "libblkimg.so.1") in ldd, ldd

    src, dst, back = (tmp_path / "src.raw", tmp_path / "dst.qcow2",
                      tmp_path / "back.raw")
    data = bytes(range(256)) * 4096 * 3
    with open(src, "wb") as f:
        f.truncate(8 << 20)
        f.seek(1 << 20)
        f.write(data)
    cp = sh(blkimg, "convert", "-f", "raw", "-O", "qcow2", src, dst,
            env=env)
    assert cp.returncode == 0, cp.stderr
    cp = sh(blkimg, "check", dst, env=env)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    cp = sh(blkimg, "convert", "-f", "qcow2", "-O", "raw", dst, back,
            env=env)
    assert cp.returncode == 0, cp.stderr
    assert back.read_bytes() == src.read_bytes()
    cp = sh(root / "usr" / "bin" / "blkimg-io", "-f", "qcow2",
            "-c", "read -P 0 0 1M", dst, env=env)
    assert cp.returncode == 0 and "read 1048576/1048576" in cp.stdout, \
        cp.stdout + cp.stderr


def test_example_builds_against_the_dev_package(root, tmp_path):
    """The packaged example, compiled with the packaged headers and
    library through pkg-config (the scratch root as sysroot)."""
    pcdir = root / "usr" / "lib" / multiarch() / "pkgconfig"
    env = {"PKG_CONFIG_PATH": str(pcdir), "PKG_CONFIG_LIBDIR": str(pcdir),
           "PKG_CONFIG_SYSROOT_DIR": str(root)}
    cp = sh("pkg-config", "--cflags", "--libs", "blkimg", env=env)
    assert cp.returncode == 0, cp.stderr
    exe = tmp_path / "image-summary"
    example = (root / "usr" / "share" / "doc" / "libblkimg-dev" /
               "examples" / "image-summary.c")
    cp = sh("cc", "-std=c11", "-Wall", "-Werror", "-o", exe, example,
            *cp.stdout.split())
    assert cp.returncode == 0, cp.stderr
    img = tmp_path / "empty.raw"
    with open(img, "wb") as f:
        f.truncate(1 << 20)
    cp = sh(exe, "-f", "raw", img,
            env={"LD_LIBRARY_PATH": str(pcdir.parent)})
    assert cp.returncode == 0, cp.stderr
    assert "virtual size: 1 MiB (1048576 bytes)" in cp.stdout


def test_man_finds_the_pages_and_links(root):
    man = root / "usr" / "share" / "man"
    for page in ("man1/blkimg.1.gz", "man1/blkimg-io.1.gz",
                 "man3/libblkimg.3.gz", "man3/bi_pread.3.gz"):
        cp = sh("man", "-l", man / page, env={"MANWIDTH": "80",
                                             "MANPAGER": "cat"})
        assert cp.returncode == 0 and "NAME" in cp.stdout, (page, cp.stderr)
    link = man / "man3" / "bi_close.3.gz"
    assert os.path.islink(link) and os.readlink(link) == "bi_open.3.gz"
