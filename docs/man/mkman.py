#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Builds the man pages from their scdoc sources (docs/man/*.scd).

  mkman.py render --scdoc SCDOC --version V -o OUT SRC [HEADER...]
      fills in the source and runs scdoc(1) on it, writing the roff page
      OUT: @VERSION@ becomes V, and a line @PROTOTYPES@ (in the SYNOPSIS
      of a libblkimg(3) page) becomes the #include lines and the
      declarations, taken from the public headers, of the functions the
      page's NAME line lists

A function of the NAME line that no header declares is an error, so a
page cannot document a function that went away.
"""
import argparse
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "..", "scripts"))
import libsymbols  # noqa: E402

WIDTH = 68  # + the page margin and the block indent: 80 columns


def name_line_functions(text):
    """The names before " - " on the first line of the NAME section."""
    m = re.search(r"^# NAME\s*\n\s*\n?(.+?) - ", text, re.M)
    if not m:
        return []
    return [n.strip() for n in m.group(1).split(",")]


def wrap(decl):
    """A declaration wrapped at WIDTH columns after commas, continuation
    lines aligned after the opening parenthesis."""
    if len(decl) <= WIDTH:
        return [decl]
    indent = " " * (decl.index("(") + 1)
    lines, cur, depth, start = [], "", 0, 0
    for i, ch in enumerate(decl):
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 1:
            piece = decl[start:i + 1]
            if cur and len(cur) + len(piece) > WIDTH:
                lines.append(cur.rstrip())
                cur = indent + piece.lstrip()
            else:
                cur += piece
            start = i + 1
    piece = decl[start:]
    if cur and len(cur) + len(piece) > WIDTH:
        lines.append(cur.rstrip())
        cur = indent + piece.lstrip()
    else:
        cur += piece
    lines.append(cur)
    return lines


def sized_macros(protos):
    """{name: (header, declaration)} for the calls that are macros over a
    NAME_sized function (the structs that grow, blkimg.h): the function's
    declaration under the macro's name without its size_t size argument,
    which the macro fills in."""
    out = {}
    for f, (h, decl) in protos.items():
        if not f.endswith("_sized"):
            continue
        name = f[:-len("_sized")]
        m = re.search(r"(\w+)\s*,\s*size_t size(?=[,)])", decl)
        if not m:
            continue
        d = decl.replace(f + "(", name + "(", 1)
        d = re.sub(r",\s*size_t size(?=[,)])", "", d)
        out[name] = (h, d, "/* a macro: %s() with sizeof(*%s) */"
                     % (f, m.group(1)))
    return out


def prototypes(functions, headers, src):
    protos = libsymbols.header_prototypes(headers)
    notes = {}
    for name, (h, decl, note) in sized_macros(protos).items():
        if name not in protos:
            protos[name] = (h, decl)
            notes[name] = note
    missing = [f for f in functions if f not in protos]
    if missing:
        sys.exit("mkman: %s names functions no public header declares: %s"
                 % (src, " ".join(missing)))
    out, seen = [], []
    for f in functions:
        h = protos[f][0]
        if h not in seen:
            seen.append(h)
    out += ["#include <blkimg/%s>" % h for h in seen]
    out.append("")
    for f in functions:
        out += wrap(protos[f][1])
        if f in notes:
            out.append("    " + notes[f])
    return out


def render(a):
    with open(a.src, encoding="utf-8") as f:
        text = f.read()
    text = text.replace("@VERSION@", a.version)
    if "@PROTOTYPES@" in text:
        lines = prototypes(name_line_functions(text), a.headers, a.src)
        text = re.sub(r"^@PROTOTYPES@$", lambda m: "\n".join(lines), text,
                      flags=re.M)
    cp = subprocess.run([a.scdoc], input=text, capture_output=True,
                        text=True)
    if cp.returncode != 0:
        sys.exit("mkman: scdoc failed on %s: %s" % (a.src, cp.stderr))
    with open(a.output, "w", encoding="utf-8") as f:
        f.write(cp.stdout)


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("render")
    p.add_argument("--scdoc", required=True)
    p.add_argument("--version", required=True)
    p.add_argument("-o", "--output", required=True)
    p.add_argument("src")
    p.add_argument("headers", nargs="*")
    a = ap.parse_args(argv)
    render(a)


if __name__ == "__main__":
    main(sys.argv[1:])
