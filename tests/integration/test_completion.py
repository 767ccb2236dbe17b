# SPDX-License-Identifier: MIT
"""bash completion (completion/blkimg): the completion functions driven as
bash drives them (COMP_WORDS, COMP_CWORD), against the built tools. The
options offered for each subcommand are exactly those the tool accepts or
advertises (tests/tool_options.py reads them from the tools), so the list
in the script cannot drift from the tools unnoticed."""
import os
import shutil
import subprocess

import pytest

import tool_options

REPO = tool_options.REPO
SCRIPT = os.path.join(REPO, "completion", "blkimg")


def complete(func, words, cword=None, cwd=None):
    """Runs completion function func on words (COMP_CWORD: the last word
    unless given) in a bash that sourced the script; returns COMPREPLY."""
    if shutil.which("bash") is None:
        pytest.skip("bash missing")
    cword = len(words) - 1 if cword is None else cword
    prog = ('source "$1"; shift; COMP_WORDS=("$@"); COMP_CWORD=%d; '
            'COMP_LINE="$*"; %s; printf "%%s\\n" "${COMPREPLY[@]}"'
            % (cword, func))
    cp = subprocess.run(["bash", "-c", prog, "bash", SCRIPT, *words],
                        capture_output=True, text=True, cwd=cwd,
                        stdin=subprocess.DEVNULL, timeout=60)
    assert cp.returncode == 0 and cp.stderr == "", cp.stderr
    return [w for w in cp.stdout.split("\n") if w]


def test_subcommands_are_those_of_help(blkimg):
    want = sorted(tool_options.blkimg_syntax(blkimg))
    assert sorted(complete("_blkimg", [blkimg, ""])) == want
    assert sorted(complete("_blkimg", [blkimg, "co"])) == \
        ["commit", "compare", "convert"]
    # after the standard options too (-T takes an argument)
    assert complete("_blkimg", [blkimg, "-T", "x", "inf"]) == ["info"]
    assert sorted(complete("_blkimg", [blkimg, "info", "--"])) == \
        sorted(o for o in tool_options.blkimg_options(blkimg)["info"]
               if o.startswith("--"))


def test_every_subcommand_offers_exactly_its_options(blkimg):
    want = tool_options.blkimg_options(blkimg)
    for cmd, opts in want.items():
        got = set(complete("_blkimg", [blkimg, cmd, "-"]))
        assert got == opts, "%s: missing %s, extra %s (update "\
            "_blkimg_options in completion/blkimg)" % (
                cmd, sorted(opts - got), sorted(got - opts))


def test_formats_come_from_help(blkimg):
    formats = tool_options.blkimg_formats(blkimg)
    assert "qcow2" in formats and "raw" in formats
    assert sorted(complete("_blkimg", [blkimg, "convert", "-O", ""])) == \
        sorted(formats)
    assert complete("_blkimg", [blkimg, "info", "-f", "qc"]) == ["qcow2"]
    assert complete("_blkimg", [blkimg, "bitmap", "--source-format",
                                "ra"]) == ["raw"]


def test_option_values(blkimg):
    assert complete("_blkimg", [blkimg, "convert", "-t", "n"]) == ["none"]
    assert sorted(complete("_blkimg", [blkimg, "check", "-r", ""])) == \
        ["all", "leaks"]
    # --output=VALUE as bash splits it ("--output" "=" VALUE) and whole
    assert sorted(complete("_blkimg", [blkimg, "map", "--output", "=",
                                       ""])) == ["human", "json", "svg"]
    assert complete("_blkimg", [blkimg, "info", "--output", "=", "j"]) == \
        ["json"]
    assert complete("_blkimg", [blkimg, "info", "--output=j"]) == \
        ["--output=json"]
    assert complete("_blkimg", [blkimg, "convert", "--progress", "=",
                                "b"]) == ["bar"]


def test_files(blkimg, tmp_path):
    (tmp_path / "disk.qcow2").write_bytes(b"")
    (tmp_path / "disk.raw").write_bytes(b"")
    (tmp_path / "other").write_bytes(b"")
    assert sorted(complete("_blkimg", [blkimg, "info", "di"],
                           cwd=tmp_path)) == ["disk.qcow2", "disk.raw"]
    assert complete("_blkimg", [blkimg, "convert", "-f", "raw", "ot"],
                    cwd=tmp_path) == ["other"]
    assert complete("_blkimg", [blkimg, "dd", "i"]) == ["if="]
    assert complete("_blkimg", [blkimg, "dd", "if", "=", "disk.q"],
                    cwd=tmp_path) == ["disk.qcow2"]


def test_blkimg_io_options_and_commands(blkimg, blkimg_io):
    want = tool_options.blkimg_io_options(blkimg_io) - \
        tool_options.blkimg_io_unsupported(blkimg_io)
    assert {"-c", "--cmd", "-t", "--stats"} <= want
    assert set(complete("_blkimg_io", [blkimg_io, "-"])) == want
    assert sorted(complete("_blkimg_io", [blkimg_io, "-c", "re"])) == \
        ["read", "readv", "remove_break", "reopen", "resume"]
    assert sorted(complete("_blkimg_io", [blkimg_io, "-c", "'wr"])) == \
        ["'write", "'writev"]
    assert set(complete("_blkimg_io", [blkimg_io, "-c", ""])) == \
        set(tool_options.blkimg_io_commands(blkimg_io))
    assert sorted(complete("_blkimg_io", [blkimg_io, "-f", ""])) == \
        sorted(tool_options.blkimg_formats(blkimg))
    assert complete("_blkimg_io", [blkimg_io, "-t", "dir"]) == \
        ["directsync"]
    assert complete("_blkimg_io", [blkimg_io, "--aio", "io"]) == \
        ["io_uring"]
