# SPDX-License-Identifier: MIT
"""The man pages (docs/man/*.scd, built into BUILD/docs/man): every page
renders without a groff warning; blkimg(1) documents, in each command's
section, every option that command accepts or advertises; blkimg-io(1)
every option and every command with its options; the libblkimg(3) pages
name every exported function. The options come from the tools themselves
(tests/tool_options.py), so a new option without documentation fails
here."""
import functools
import glob
import os
import re
import shutil
import subprocess
import sys

import pytest

import tool_options

REPO = tool_options.REPO
sys.path.insert(0, os.path.join(REPO, "scripts"))
sys.path.insert(0, os.path.join(REPO, "docs", "man"))
import libsymbols  # noqa: E402
import mkman  # noqa: E402

SOURCES = sorted(glob.glob(os.path.join(REPO, "docs", "man", "*.scd")))


def page_path(build_dir, src):
    name = os.path.basename(src)[:-len(".scd")]
    path = os.path.join(str(build_dir), "docs", "man", name)
    if not os.path.exists(path):
        pytest.fail("%s is not built (meson -Dman=enabled needs scdoc; "
                    "scripts/deps.sh installs it)" % path)
    return path


@functools.lru_cache(maxsize=None)
def rendered(path):
    """(the page as plain text with unbroken lines (a very long line
    length, no hyphenation), groff's warnings)."""
    if shutil.which("groff") is None:
        pytest.fail("groff missing (scripts/deps.sh installs groff-base)")
    cp = subprocess.run(["groff", "-man", "-Tutf8", "-ww", "-rLL=3000n",
                         "-rHY=0", "-P-cbou", path], capture_output=True,
                        text=True)
    assert cp.returncode == 0, cp.stderr
    return cp.stdout.replace("\u2010", "-").replace("\u2212", "-"), \
        cp.stderr


def render(path):
    return rendered(path)[0]


def sections(text):
    """{top-level section name: its text}."""
    out, name = {}, None
    for line in text.splitlines():
        if line and not line[0].isspace():
            name = line.strip()
            out[name] = ""
        elif name:
            out[name] += line + "\n"
    return out


def has_option(text, opt):
    return re.search(r"(?<![\w-])%s(?![\w-])" % re.escape(opt), text)


def split_by_heading(text, names, indent):
    """{name: text} for the parts of text that start with a line holding
    only name (or name followed by a space, at that indent)."""
    out, cur = {}, None
    pat = re.compile(r"^ {%d}(%s)(?: |$)" % (
        indent, "|".join(re.escape(n) for n in names)))
    for line in text.splitlines():
        m = pat.match(line)
        if m:
            cur = m.group(1)
            out.setdefault(cur, "")
        if cur:
            out[cur] += line + "\n"
    return out


def test_every_page_is_built_and_renders(build_dir):
    assert len(SOURCES) >= 3
    for src in SOURCES:
        path = page_path(build_dir, src)
        assert rendered(path)[1] == "", path
        s = sections(render(path))
        assert "NAME" in s and "SYNOPSIS" in s and "DESCRIPTION" in s, path
        assert "@" not in s["NAME"] + s["SYNOPSIS"], path


def blkimg_page(build_dir):
    return render(page_path(build_dir, os.path.join(REPO, "docs", "man",
                                                    "blkimg.1.scd")))


def test_blkimg_page_documents_every_option(build_dir, blkimg):
    text = blkimg_page(build_dir)
    s = sections(text)
    for opt in tool_options.blkimg_global_options(blkimg):
        assert has_option(s["STANDARD OPTIONS"], opt), opt
    options = tool_options.blkimg_options(blkimg)
    parts = split_by_heading(s["COMMANDS"], list(options), 3)
    missing = []
    for cmd, opts in sorted(options.items()):
        if cmd not in parts:
            missing.append("%s: no section" % cmd)
            continue
        for opt in sorted(opts - {"-h", "--help"}):
            if not has_option(parts[cmd], opt):
                missing.append("%s %s" % (cmd, opt))
    assert not missing, "undocumented in docs/man/blkimg.1.scd: " + \
        ", ".join(missing)
    # dd's operands
    for operand in ("bs=", "count=", "skip=", "if=", "of="):
        assert operand in parts["dd"]


def test_blkimg_page_documents_formats_exit_codes_and_pipelines(
        build_dir, blkimg):
    s = sections(blkimg_page(build_dir))
    # documented under PROTOCOLS
    protocols = {"file", "nbd", "rbd", "http", "https", "powerloss",
                 "blkdebug", "host_device", "host_cdrom"}
    for fmt in set(tool_options.blkimg_formats(blkimg)):
        where = "PROTOCOLS" if fmt in protocols else "FORMATS"
        assert re.search(r"^ {7}%s$" % fmt, s[where], re.M), fmt
    for code in ("0", "1", "2", "3", "63"):
        assert re.search(r"(?<!\d)%s(?!\d)" % code, s["EXIT STATUS"])
    assert "DIFFERENCES FROM QEMU-IMG" in s
    for stack in ("KubeVirt CDI", "OpenStack", "oVirt", "virt-v2v"):
        assert stack in s["EXAMPLES"], stack


def test_blkimg_io_page_documents_every_option_and_command(build_dir,
                                                          blkimg_io):
    text = render(page_path(build_dir, os.path.join(
        REPO, "docs", "man", "blkimg-io.1.scd")))
    s = sections(text)
    missing = [o for o in sorted(tool_options.blkimg_io_options(blkimg_io))
               if not has_option(s["OPTIONS"], o)]
    commands = tool_options.blkimg_io_commands(blkimg_io)
    parts = split_by_heading(s["COMMANDS"], list(commands), 7)
    for cmd, opts in sorted(commands.items()):
        if cmd not in parts:
            missing.append("command %s" % cmd)
            continue
        missing += ["%s %s" % (cmd, o) for o in sorted(opts)
                    if not has_option(parts[cmd], o)]
    assert not missing, "undocumented in docs/man/blkimg-io.1.scd: " + \
        ", ".join(missing)


def test_library_pages_name_every_exported_function(build_dir):
    """Each BI_EXPORT function is on the NAME line of exactly one section 3
    page, whose SYNOPSIS shows its declaration from the header."""
    headers = sorted(glob.glob(os.path.join(REPO, "include", "blkimg",
                                            "*.h")))
    protos = libsymbols.header_prototypes(headers)
    macros = mkman.sized_macros(protos)
    named = {}
    for src in SOURCES:
        if not src.endswith(".3.scd"):
            continue
        s = sections(render(page_path(build_dir, src)))
        head = " ".join(s["NAME"].split()).split(" - ")[0]
        synopsis = " ".join(s["SYNOPSIS"].split())
        for f in head.split(", "):
            if f in protos:
                named.setdefault(f, []).append(os.path.basename(src))
                assert protos[f][1] in synopsis, (src, protos[f][1])
            elif f in macros:
                # a macro over f_sized documents that function too
                _h, decl, note = macros[f]
                named.setdefault(f + "_sized", []).append(
                    os.path.basename(src))
                assert decl in synopsis and note in synopsis, (src, decl)
    unnamed = sorted(set(protos) - set(named))
    assert not unnamed, ("functions no libblkimg(3) page documents (add "
                         "them to a page's NAME line in docs/man/): %s"
                         % " ".join(unnamed))
    twice = {f: p for f, p in named.items() if len(p) > 1}
    assert not twice, twice


def test_usage_md_links_to_the_pages():
    with open(os.path.join(REPO, "docs", "usage.md"), encoding="utf-8") as f:
        text = f.read()
    for page in ("blkimg.1", "blkimg-io.1", "libblkimg.3", "blkimg-nbd.1",
                 "nbdkit-blkimg-plugin.1"):
        assert "docs/man/%s.scd" % page in text or \
            "man/%s.scd" % page in text, page


def test_blkimg_nbd_page_documents_every_option(build_dir):
    tool = os.path.join(str(build_dir), "blkimg-nbd")
    s = sections(render(page_path(build_dir, os.path.join(
        REPO, "docs", "man", "blkimg-nbd.1.scd"))))
    opts = tool_options.blkimg_nbd_options(tool)
    assert {"-k", "--socket", "-t", "--fork", "--tls-creds", "-A"} <= opts
    missing = [o for o in sorted(opts) if not has_option(s["OPTIONS"], o)]
    assert not missing, "undocumented in docs/man/blkimg-nbd.1.scd: " + \
        ", ".join(missing)
    assert "1" in s["EXIT STATUS"]


def test_nbdkit_plugin_page_documents_every_parameter(build_dir, sanitized):
    if shutil.which("nbdkit") is None:
        pytest.skip("nbdkit missing")
    if sanitized:
        # a sanitized plugin loads into nbdkit only behind the sanitizer
        # runtimes (test_nbdkit_plugin.py runs it so); the parameters and
        # the page are the same in every build, which the normal run checks
        pytest.skip("the normal build's run checks the plugin's page")
    plugin = os.path.join(str(build_dir), "nbdkit-blkimg-plugin.so")
    s = sections(render(page_path(build_dir, os.path.join(
        REPO, "docs", "man", "nbdkit-blkimg-plugin.1.scd"))))
    params = tool_options.nbdkit_plugin_params(plugin)
    assert {"file", "format", "snapshot", "cache", "export"} <= set(params)
    missing = [p for p in params
               if (p.replace("<KEY>", "KEY") + "=") not in s["PARAMETERS"]]
    assert not missing, "undocumented in docs/man/nbdkit-blkimg-plugin.1" \
        ".scd: " + ", ".join(missing)
    for name in ("THREAD MODEL", "LIMITATIONS"):
        assert name in s
