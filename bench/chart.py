#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Draws the charts of a benchmark run: one SVG per group (benchmark
script), one bar per measured ratio (blkimg / reference: qemu-img,
qemu-io, fio, nbdcopy...), with the parity line at 1 and each ratio's goal
marked on its bar. Bars are green where the goal is met, red where it is
not, grey without a goal. Drawn by gnuplot (Debian's gnuplot-nox).

  bench/chart.py RESULTS OUTDIR

RESULTS is the file bench/run.sh records (bench/lib.sh's `result` and
`title`), tab-separated, one record a line:

  title   GROUP  TEXT
  result  GROUP  CASE  REFERENCE  METRIC  BLKIMG  REF  RATIO  GOAL_OP  GOAL

RATIO is BLKIMG / REF; GOAL_OP is ">=" or "<=" and GOAL a number, both "-"
when the ratio has no goal; a RATIO of "-" (a failed measurement) draws no
bar but keeps its label. Writes OUTDIR/GROUP.svg for every group with at
least one result and prints their paths.
"""
import math
import os
import shutil
import subprocess
import sys
import tempfile

COLOURS = {"met": "#2ca02c", "missed": "#d62728", "none": "#7f7f7f"}


def number(s):
    try:
        v = float(s)
    except ValueError:
        return None
    return v if math.isfinite(v) else None


def read_results(path):
    """({group: title}, {group: [result dicts]}) in file order."""
    titles, groups = {}, {}
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            fields = line.rstrip("\n").split("\t")
            if fields[0] == "title" and len(fields) == 3:
                titles[fields[1]] = fields[2]
            elif fields[0] == "result" and len(fields) == 10:
                (_, group, case, ref, metric, _ours, _theirs, ratio, op,
                 goal) = fields
                groups.setdefault(group, []).append({
                    "case": case, "reference": ref, "metric": metric,
                    "ratio": number(ratio), "op": op, "goal": number(goal)})
            elif line.strip():
                sys.exit("chart.py: %s:%d: not a record: %r" % (path, n,
                                                                line))
    return titles, groups


def verdict(r):
    if r["goal"] is None or r["op"] not in (">=", "<="):
        return "none"
    if r["ratio"] is None:
        return "missed"
    ok = r["ratio"] >= r["goal"] if r["op"] == ">=" else \
        r["ratio"] <= r["goal"]
    return "met" if ok else "missed"


def gp_string(s):
    """A gnuplot double-quoted string."""
    return '"%s"' % s.replace("\\", "\\\\").replace('"', '\\"')


def label(r):
    return "%s: vs %s (%s)" % (r["case"], r["reference"], r["metric"])


def gnuplot_script(title, results, data, svg):
    """The gnuplot commands for one group's chart (bars top-down in
    recorded order)."""
    n = len(results)
    known = [r["ratio"] for r in results if r["ratio"] is not None] + \
        [r["goal"] for r in results if r["goal"] is not None] + [1.0]
    xmax = max(known) * 1.25
    height = 110 + 34 * n
    ytics = ", ".join("%s %d" % (gp_string(label(r)), n - i)
                      for i, r in enumerate(results))
    lines = [
        'set terminal svg size 1000,%d dynamic noenhanced font "sans,11" '
        'background "white"' % height,
        "set output %s" % gp_string(svg),
        "set title %s" % gp_string(title),
        "set xlabel %s" % gp_string(
            "ratio blkimg / reference (1 = parity; the black mark on a bar "
            "is its goal)"),
        "unset key",
        "set xrange [0:%g]" % xmax,
        "set yrange [0.3:%g]" % (n + 0.7),
        "set ytics (%s)" % ytics,
        "set grid xtics",
        "set style fill solid 0.85 border -1",
        "set datafile missing 'NaN'",
        "set arrow from 1, graph 0 to 1, graph 1 nohead front linewidth 1.5 "
        'linecolor rgb "#333333"',
        "plot %s using (0):2:(0):1:($2-0.35):($2+0.35):4 "
        "with boxxyerror linecolor rgb variable title 'ratio', \\" %
        gp_string(data),
        "     '' using 3:($2-0.45):(0):(0.9) with vectors nohead "
        'linewidth 3 linecolor rgb "black" title \'goal\', \\',
        "     '' using 6:2:5 with labels left offset 0.6,0 title 'value'",
    ]
    return "\n".join(lines) + "\n"


def data_rows(results):
    """ratio y goal colour text label-x, one line per result (NaN:
    none)."""
    n = len(results)
    rows = []
    for i, r in enumerate(results):
        ratio = r["ratio"]
        goal = r["goal"] if verdict(r) != "none" else None
        colour = int(COLOURS[verdict(r)][1:], 16)
        text = "%.2f" % ratio if ratio is not None else "no result"
        if goal is not None:
            text += " (goal %s %g)" % (r["op"], goal)
        rows.append("%s %d %s %d %s %s" % (
            "NaN" if ratio is None else repr(ratio), n - i,
            "NaN" if goal is None else repr(goal), colour, gp_string(text),
            repr(max(ratio or 0.0, goal or 0.0))))
    return "\n".join(rows) + "\n"


def draw(group, title, results, outdir, tmp):
    data = os.path.join(tmp, group + ".dat")
    script = os.path.join(tmp, group + ".gp")
    svg = os.path.join(outdir, group + ".svg")
    with open(data, "w", encoding="utf-8") as f:
        f.write(data_rows(results))
    with open(script, "w", encoding="utf-8") as f:
        f.write(gnuplot_script(title, results, data, svg))
    cp = subprocess.run(["gnuplot", script], capture_output=True, text=True)
    if cp.returncode != 0:
        sys.exit("chart.py: gnuplot failed for %s: %s" % (group, cp.stderr))
    return svg


def main(argv):
    if len(argv) != 2:
        sys.exit("usage: chart.py RESULTS OUTDIR")
    if shutil.which("gnuplot") is None:
        sys.exit("chart.py: gnuplot missing (apt-get install gnuplot-nox)")
    titles, groups = read_results(argv[0])
    os.makedirs(argv[1], exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="blkimg-chart.") as tmp:
        for group, results in groups.items():
            print(draw(group, titles.get(group, group), results, argv[1],
                       tmp))


if __name__ == "__main__":
    main(sys.argv[1:])
