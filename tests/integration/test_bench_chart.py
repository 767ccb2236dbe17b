# SPDX-License-Identifier: MIT
"""bench/chart.py, the charts `make bench` draws beside its tables, on a
small recorded run (no benchmark runs): one SVG per group, one bar per
ratio with its length to scale and its colour by goal (met, missed, none),
a mark at each goal, the labels and the title; and bench/lib.sh's `title`
and `result` write the records chart.py reads."""
import os
import re
import shutil
import subprocess
import xml.etree.ElementTree as ET

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
CHART = os.path.join(REPO, "bench", "chart.py")
SVG = "{http://www.w3.org/2000/svg}"
GREEN, RED, GREY = (44, 160, 44), (214, 39, 40), (127, 127, 127)

RESULTS = [
    ("title", "03_randread", "3. 4 KiB reads, QD32, cache=none"),
    ("result", "03_randread", "4 KiB reads QD32", "qemu-img bench", "IOPS",
     "90000", "40000", "2.25", ">=", "2"),
    ("result", "03_randread", "4 KiB reads QD32",
     "qemu-img bench -i io_uring", "IOPS", "90000", "60000", "1.50", "-",
     "-"),
    ("result", "03_randread", "4 KiB reads QD32", "fio", "IOPS", "90000",
     "120000", "0.75", ">=", "0.85"),
    ("title", "07_convert", '7. convert: "blkimg" vs qemu-img'),
    ("result", "07_convert", "qcow2->raw -t none -T none", "qemu-img",
     "wall s", "1.2", "2.0", "0.60", "<=", "0.8"),
    ("result", "07_convert", "qcow2->raw -t none -T none", "qemu-img",
     "CPU s", "-", "2.0", "-", "<=", "0.6"),
    ("result", "07_convert", "empty 1 TiB qcow2->raw", "nbdcopy", "wall s",
     "0.5", "0.4", "1.25", "<=", "1.0"),
]


def need_gnuplot():
    if shutil.which("gnuplot") is None:
        pytest.fail("gnuplot missing (scripts/deps.sh installs gnuplot-nox)")


def write_results(path, records):
    with open(path, "w", encoding="utf-8") as f:
        for r in records:
            f.write("\t".join(r) + "\n")


def chart(results, outdir):
    cp = subprocess.run(["python3", CHART, str(results), str(outdir)],
                        capture_output=True, text=True, timeout=120)
    return cp


def rgb(fill):
    return tuple(int(x) for x in re.findall(r"\d+", fill))


def bars(root):
    """[(x0, x1, colour)] of the bars, top-down."""
    out = []
    for g in root.iter(SVG + "g"):
        if g.get("id") == "gnuplot_plot_1":
            for poly in g.iter(SVG + "polygon"):
                pts = [tuple(map(float, p.split(",")))
                       for p in poly.get("points").split()]
                xs = [p[0] for p in pts]
                ys = [p[1] for p in pts]
                out.append((min(ys), min(xs), max(xs), rgb(poly.get("fill"))))
    return [b[1:] for b in sorted(out)]


def goal_marks(root):
    """The x of each goal mark."""
    xs = []
    for g in root.iter(SVG + "g"):
        if g.get("id") == "gnuplot_plot_2":
            for p in g.iter(SVG + "path"):
                xs += [float(x) for x in re.findall(r"M([\d.]+),",
                                                    p.get("d"))]
    return sorted(xs)


def texts(root):
    return ["".join(t.itertext()) for t in root.iter(SVG + "text")]


def test_one_chart_per_group_to_scale(tmp_path):
    need_gnuplot()
    write_results(tmp_path / "results.tsv", RESULTS)
    cp = chart(tmp_path / "results.tsv", tmp_path / "out")
    assert cp.returncode == 0, cp.stderr
    assert sorted(os.listdir(tmp_path / "out")) == ["03_randread.svg",
                                                    "07_convert.svg"]
    assert cp.stdout.split() == [str(tmp_path / "out" / f) for f in
                                 ("03_randread.svg", "07_convert.svg")]

    root = ET.parse(tmp_path / "out" / "03_randread.svg").getroot()
    t = texts(root)
    assert "3. 4 KiB reads, QD32, cache=none" in t
    for ref in ("qemu-img bench", "qemu-img bench -i io_uring", "fio"):
        assert "4 KiB reads QD32: vs %s (IOPS)" % ref in t, t
    assert "2.25 (goal >= 2)" in t and "1.50" in t
    b = bars(root)
    assert [c for _, _, c in b] == [GREEN, GREY, RED]
    x0 = b[0][0]
    assert all(abs(x - x0) < 0.01 for x, _, _ in b)
    scale = (b[0][1] - x0) / 2.25
    for (_, x1, _), ratio in zip(b, (2.25, 1.50, 0.75)):
        assert x1 - x0 == pytest.approx(ratio * scale, abs=0.05)
    marks = goal_marks(root)
    assert marks == pytest.approx([x0 + 0.85 * scale, x0 + 2 * scale],
                                  abs=0.05)

    root = ET.parse(tmp_path / "out" / "07_convert.svg").getroot()
    t = texts(root)
    assert '7. convert: "blkimg" vs qemu-img' in t
    assert "no result (goal <= 0.6)" in t
    assert "empty 1 TiB qcow2->raw: vs nbdcopy (wall s)" in t
    # the CPU bar has no result: two bars, three goal marks
    assert [c for _, _, c in bars(root)] == [GREEN, RED]
    assert len(goal_marks(root)) == 3


def test_bad_record_is_refused(tmp_path):
    need_gnuplot()
    write_results(tmp_path / "results.tsv",
                  RESULTS[:2] + [("result", "x", "too", "few")])
    cp = chart(tmp_path / "results.tsv", tmp_path / "out")
    assert cp.returncode != 0
    assert "results.tsv:3: not a record" in cp.stderr


def test_lib_sh_records_what_chart_reads(tmp_path):
    """title and result of bench/lib.sh, as a benchmark script calls
    them, write records chart.py draws."""
    need_gnuplot()
    results = tmp_path / "results.tsv"
    script = (
        '. "$1"/bench/lib.sh\n'
        'title "5. Allocating writes"\n'
        'result "64 KiB allocating writes QD16" qemu-img "MiB/s" 300 200 '
        '1.50 ">=" 1.3\n'
        'result "failed case" qemu-img "MiB/s" "" 200 "" - -\n')
    cp = subprocess.run(
        ["bash", "-c", script, "05_qcow2_alloc_write.sh", REPO],
        capture_output=True, text=True, timeout=60,
        env=dict(os.environ, BENCH_RESULTS=str(results),
                 BENCH_DIR=str(tmp_path / "scratch")))
    assert cp.returncode == 0, cp.stderr
    lines = [line.split("\t") for line in
             results.read_text().splitlines()]
    assert lines == [
        ["title", "05_qcow2_alloc_write", "5. Allocating writes"],
        ["result", "05_qcow2_alloc_write", "64 KiB allocating writes QD16",
         "qemu-img", "MiB/s", "300", "200", "1.50", ">=", "1.3"],
        ["result", "05_qcow2_alloc_write", "failed case", "qemu-img",
         "MiB/s", "-", "200", "-", "-", "-"]]
    cp = chart(results, tmp_path / "out")
    assert cp.returncode == 0, cp.stderr
    root = ET.parse(tmp_path / "out" / "05_qcow2_alloc_write.svg").getroot()
    assert [c for _, _, c in bars(root)] == [GREEN]
    assert "5. Allocating writes" in texts(root)
