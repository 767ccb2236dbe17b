# SPDX-License-Identifier: MIT
"""The shared library as programs link it: its soname, the symbols it
exports (exactly the BI_EXPORT functions of the public headers, in version
node LIBBLKIMG_<soversion>, and the same as the list on record in
debian/libblkimg1.symbols), and examples/image-summary.c built through
pkg-config against an installed copy (meson install --destdir)."""
import glob
import json
import os
import shutil
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "scripts"))
import libsymbols  # noqa: E402

SYMBOLS_FILE = os.path.join(REPO, "debian", "libblkimg1.symbols")
REGENERATE = ("if the change of the API is intended, run `make symbols` "
              "(scripts/libsymbols.py update debian/libblkimg1.symbols "
              "build/libblkimg.so VERSION) and commit "
              "debian/libblkimg1.symbols; a symbol that went away also "
              "needs a new soversion (meson.build lib_soversion)")


def public_headers():
    return sorted(glob.glob(os.path.join(REPO, "include", "blkimg", "*.h")))


@pytest.fixture(scope="module")
def library(build_dir):
    path = os.path.join(str(build_dir), "libblkimg.so")
    if not os.path.exists(path):
        pytest.fail("%s is not built" % path)
    return os.path.realpath(path)


def soname(lib):
    out = subprocess.run(["readelf", "-d", lib], capture_output=True,
                         text=True, check=True).stdout
    for line in out.splitlines():
        if "(SONAME)" in line:
            return line.split("[", 1)[1].rstrip("]")
    return None


def test_soname_matches_package_and_symbols_file(library):
    """libblkimg.so.N, N the Debian package's number and the symbols
    file's library."""
    name = soname(library)
    assert name is not None and name.startswith("libblkimg.so."), name
    major = name.rsplit(".", 1)[1]
    header, _ = libsymbols.read_symbols_file(SYMBOLS_FILE)
    assert header[0].split()[:2] == [name, "libblkimg" + major], header
    assert os.path.basename(library).startswith(name + "."), library


def test_exports_are_exactly_the_public_api(library):
    """nm -D shows the BI_EXPORT functions of include/blkimg/*.h and
    nothing else, each in the version node LIBBLKIMG_<soversion>."""
    node = "LIBBLKIMG_" + soname(library).rsplit(".", 1)[1]
    syms = libsymbols.library_symbols(library)
    names = {s.split("@")[0] for s in syms} - {node}
    assert names == set(libsymbols.header_exports(public_headers()))
    assert all(s.endswith("@" + node) for s in syms), syms


def test_exported_symbols_equal_the_stored_list(library):
    built = set(libsymbols.library_symbols(library))
    stored = set(libsymbols.read_symbols_file(SYMBOLS_FILE)[1])
    if built != stored:
        pytest.fail("the library's exported symbols differ from %s:\n"
                    "  new:     %s\n  missing: %s\n%s" %
                    (os.path.relpath(SYMBOLS_FILE, REPO),
                     " ".join(sorted(built - stored)) or "-",
                     " ".join(sorted(stored - built)) or "-", REGENERATE))


def install_copy(build_dir, destdir, run):
    """meson install of build_dir into destdir; returns the directory of
    the installed blkimg.pc."""
    cp = run("meson", "install", "-C", build_dir, "--no-rebuild", "--quiet",
             "--destdir", destdir, timeout=120)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    pcs = glob.glob(os.path.join(str(destdir), "**", "pkgconfig",
                                 "blkimg.pc"), recursive=True)
    assert len(pcs) == 1, pcs
    return os.path.dirname(pcs[0])


def map_totals(blkimg, image, run):
    cp = run(blkimg, "map", "--output=json", image, check=True)
    t = {"data": 0, "zero": 0, "unallocated": 0}
    for e in json.loads(cp.stdout):
        kind = ("unallocated" if not e["present"] else
                "zero" if e["zero"] else "data")
        t[kind] += e["length"]
    return t


def test_example_builds_with_pkg_config_against_installed_copy(
        build_dir, blkimg, blkimg_io, tmp_path, run, sanitized):
    """examples/image-summary.c compiles with nothing but
    `pkg-config --cflags --libs blkimg` of an installed copy, runs against
    the installed library, and reports the allocation `map` reports."""
    if shutil.which("cc") is None or shutil.which("pkg-config") is None:
        pytest.fail("cc or pkg-config missing (scripts/deps.sh installs "
                    "them)")
    dest = tmp_path / "root"
    pcdir = install_copy(build_dir, dest, run)
    # The install also holds the man pages and the bash completion.
    for rel in ("man/man1/blkimg.1", "man/man1/blkimg-io.1",
                "man/man3/libblkimg.3", "man/man3/bi_close.3",
                "bash-completion/completions/blkimg",
                "bash-completion/completions/blkimg-io"):
        found = glob.glob(os.path.join(str(dest), "**", "share", rel),
                          recursive=True)
        assert found, rel
    env = {"PKG_CONFIG_PATH": pcdir, "PKG_CONFIG_SYSROOT_DIR": dest,
           "PKG_CONFIG_LIBDIR": pcdir}
    flags = run("pkg-config", "--cflags", "--libs", "blkimg", env=env,
                check=True).stdout.split()
    assert any(f.startswith("-I" + str(dest)) for f in flags), flags
    exe = tmp_path / "image-summary"
    cp = run(["cc", "-std=c11", "-Wall", "-Wextra", "-Werror",
              *(["-fsanitize=address,undefined"] if sanitized else []),
              "-o", exe,
              os.path.join(REPO, "examples", "image-summary.c"), *flags])
    assert cp.returncode == 0, cp.stderr

    img = tmp_path / "disk.qcow2"
    run(blkimg, "create", "-q", "-f", "qcow2", img, "8M", check=True)
    run(blkimg_io, "-f", "qcow2", "-c", "write -P 7 1M 192k",
        "-c", "write -z 4M 64k", img, check=True)
    libdir = os.path.dirname(glob.glob(os.path.join(
        str(dest), "**", "libblkimg.so.*"), recursive=True)[0])
    cp = run(exe, img, env={"LD_LIBRARY_PATH": libdir})
    assert cp.returncode == 0, cp.stderr
    out = dict(line.split(": ", 1) for line in cp.stdout.splitlines())
    assert out["format"] == "qcow2"
    assert out["virtual size"] == "8 MiB (8388608 bytes)"
    want = map_totals(blkimg, img, run)
    assert want["data"] == 192 << 10 and want["zero"] >= 64 << 10, want
    assert {k: int(out[k]) for k in want} == want

    # The program really runs on the installed copy.
    ldd = run("ldd", exe, env={"LD_LIBRARY_PATH": libdir}).stdout
    assert os.path.join(libdir, "libblkimg.so.1") in ldd, ldd
    cp = run(exe, tmp_path / "missing.img", env={"LD_LIBRARY_PATH": libdir})
    assert cp.returncode == 1
    assert "missing.img" in cp.stderr and "No such file" in cp.stderr


def test_debian_version_is_the_project_version(build_dir):
    """debian/changelog's version (a native package) is meson.build's."""
    with open(os.path.join(str(build_dir), "meson-info",
                           "intro-projectinfo.json")) as f:
        version = json.load(f)["version"]
    with open(os.path.join(REPO, "debian", "changelog")) as f:
        first = f.readline()
    assert first.startswith("blkimg (%s) " % version), (first, version)


# what an object of the library may not import: the standard streams and
# the calls that print on them without being given a stream (writing to a
# stream the caller passes, as the JSON renderer does, is fine)
PRINTING = {"stderr", "stdout", "printf", "puts", "perror", "putchar",
            "vprintf"}


def test_library_never_prints(build_dir):
    """No object of the library refers to stdout, stderr or the calls that
    print on them: messages go to the program's handler
    (bi_set_message_handler). The one exception is the line util/mem.c
    writes before it aborts for want of memory."""
    objs = []
    for lib in ("libblkimg_internal.a.p", "libbiutil.a.p"):
        objs += glob.glob(os.path.join(str(build_dir), lib, "*.o"))
    assert len(objs) > 20, objs
    offenders = {}
    for o in objs:
        out = subprocess.run(["nm", "-u", o], capture_output=True, text=True,
                             check=True).stdout
        used = {ln.split()[-1].split("@")[0] for ln in out.splitlines()
                if ln.strip()} & PRINTING
        if os.path.basename(o) == "src_lib_util_mem.c.o":
            used -= {"stderr"}
        if used:
            offenders[os.path.basename(o)] = sorted(used)
    assert not offenders, offenders
