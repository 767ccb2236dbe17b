# SPDX-License-Identifier: MIT
"""The options the tools accept, found in the tools themselves, for the
tests that check that the man pages and the shell completion know every
one of them (so that neither drifts from the tools):

- blkimg's subcommands and their syntax from `blkimg --help` ("Command
  syntax:" lines) and `blkimg SUBCOMMAND --help`;
- the options each subcommand's parser accepts, from its option tables in
  src/tools/img_SUBCOMMAND.c (the getopt_long option string and the
  `struct option` names);
- blkimg-io's options from `blkimg-io --help` and src/tools/blkimg-io.c, its
  commands from `blkimg-io -c help` and their options from
  `blkimg-io -c "help COMMAND"`.

Options are returned as "-x" and "--long-name" strings.
"""
import os
import re
import subprocess

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOLS = os.path.join(REPO, "src", "tools")

_OPT_IN_TEXT = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*|-[A-Za-z0-9])(?![\w])")
_LONG = re.compile(r'\{\s*"([a-z][a-z0-9-]*)"\s*,\s*(?:no|required|optional)'
                   r'_argument')
_GETOPT = re.compile(r"getopt(?:_long)?\(\s*argc\s*,\s*argv\s*,\s*"
                     r'(?:"((?:[^"\\]|\\.)*)"|([A-Za-z_]\w*))', re.S)


def _out(*argv):
    cp = subprocess.run([str(a) for a in argv], capture_output=True,
                        text=True, stdin=subprocess.DEVNULL, timeout=60)
    return cp.stdout + cp.stderr


def options_in_text(text):
    """Every "-x" / "--long" token of a usage text ("--output=ofmt" gives
    --output)."""
    return set(_OPT_IN_TEXT.findall(text))


def short_options(optstring):
    """"-x" for each option letter of a getopt option string."""
    return {"-" + c for c in optstring if c.isalnum()}


def source_options(path):
    """The options of the getopt calls and option tables of a C file:
    (set of options, number of getopt calls found)."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    opts = {"--" + n for n in _LONG.findall(text)}
    calls = 0
    for literal, var in _GETOPT.findall(text):
        if var:  # the option string is in a variable
            m = re.search(r"\b%s(?:\[\])?\s*=\s*\"((?:[^\"\\]|\\.)*)\"" %
                          re.escape(var), text)
            literal = m.group(1) if m else None
        if literal is not None:
            opts |= short_options(literal)
            calls += 1
    return opts, calls


def blkimg_syntax(blkimg):
    """{subcommand: syntax line} from `blkimg --help`."""
    syntax, inside = {}, False
    for line in _out(blkimg, "--help").splitlines():
        if line.startswith("Command syntax:"):
            inside = True
        elif inside and not line.strip():
            break
        elif inside:
            words = line.split()
            syntax[words[0]] = line.strip()
    return syntax


def blkimg_global_options(blkimg):
    """The standard options before the subcommand (-h, -V and their long
    forms) from `blkimg --help`'s header, plus -T/--trace, which qemu-img
    and blkimg accept (blkimg to refuse it)."""
    head = _out(blkimg, "--help").split("Command syntax:")[0]
    return options_in_text(head.split("\n", 3)[-1]) | {"-T", "--trace"}


def blkimg_formats(blkimg):
    for line in _out(blkimg, "--help").splitlines():
        if line.startswith("Supported formats:"):
            return line.split(":", 1)[1].split()
    return []


def blkimg_options(blkimg):
    """{subcommand: options it accepts or advertises}: its syntax in
    `blkimg --help`, its own --help usage line and its parser's option
    tables. Raises AssertionError when a subcommand's source has no
    option table this module can read (the parsing must be fixed then,
    not the test weakened)."""
    result = {}
    for cmd, syntax in blkimg_syntax(blkimg).items():
        opts = options_in_text(syntax.split(None, 1)[1])
        usage = _out(blkimg, cmd, "--help")
        if usage.startswith("usage:"):
            opts |= options_in_text(usage.split("\n", 1)[0])
        path = os.path.join(TOOLS, "img_%s.c" % cmd)
        src, calls = source_options(path)
        assert calls == 1, "%s: expected one getopt call, found %d" % (
            path, calls)
        result[cmd] = opts | src
    return result


def blkimg_io_options(blkimg_io):
    """blkimg-io's options: `blkimg-io --help` and its option table."""
    text = _out(blkimg_io, "--help")
    opts = set()
    for line in text.splitlines():
        if line.startswith("  -"):
            opts |= options_in_text(line.split("  ", 2)[1])
    src, calls = source_options(os.path.join(TOOLS, "blkimg-io.c"))
    assert calls == 1, "blkimg-io.c: expected one getopt call"
    return opts | src


def blkimg_io_unsupported(blkimg_io):
    """The options `blkimg-io --help` says it does not support (it accepts
    them to refuse them): its "Not supported:" line."""
    for line in _out(blkimg_io, "--help").splitlines():
        if line.startswith("Not supported:"):
            return options_in_text(line)
    return set()


def blkimg_io_commands(blkimg_io):
    """{command: its options} from `blkimg-io -c help` (the usage part of
    each line) and `-c "help COMMAND"` (the option list)."""
    cmds = {}
    for line in _out(blkimg_io, "-c", "help").splitlines():
        if " -- " not in line:
            continue
        usage = line.split(" -- ", 1)[0]
        name, _, args = usage.partition(" ")
        opts = set()
        for group in re.findall(r"\[-([A-Za-z]+)\]", args):
            opts |= {"-" + c for c in group}
        opts |= options_in_text(args)
        cmds[name] = opts
    for name in cmds:
        for line in _out(blkimg_io, "-c", "help " + name).splitlines():
            m = re.match(r"^ (-[A-Za-z0-9]),", line)
            if m:
                cmds[name].add(m.group(1))
    return cmds


def blkimg_nbd_options(blkimg_nbd):
    """blkimg-nbd's options: its --help lines and its option table."""
    opts = set()
    for line in _out(blkimg_nbd, "--help").splitlines():
        if line.startswith("  -"):
            opts |= options_in_text(line.split("  ", 2)[1])
    src, calls = source_options(os.path.join(TOOLS, "blkimg-nbd.c"))
    assert calls == 1, "blkimg-nbd.c: expected one getopt call"
    return opts | src


def nbdkit_plugin_params(plugin):
    """The parameters `nbdkit PLUGIN --help` lists ("format", "file.",
    "<KEY>"...): the word before "=" of each line of the plugin's help
    text (its lines start in the first column)."""
    params = []
    text = _out("nbdkit", plugin, "--help")
    for line in text.split("[file=]", 1)[-1].splitlines()[1:]:
        m = re.match(r"^([a-z<][A-Za-z.<>-]*)=", line)
        if m:
            params.append(m.group(1))
    return ["file"] + params
