# SPDX-License-Identifier: MIT
"""blkimg map --output=svg: a valid SVG document whose extents are those of
map --output=json (same number, starts, lengths and depths), drawn to
scale in the row of their layer, coloured by kind."""
import json
import xml.etree.ElementTree as ET

import pytest

SVG = "{http://www.w3.org/2000/svg}"
# Geometry of img_map_svg.c: the bar spans [BAR_LEFT, BAR_LEFT + BAR_WIDTH].
BAR_LEFT, BAR_WIDTH = 220, 740


def kind_of(e):
    """The kind the SVG draws for a JSON entry (compressed: see caller)."""
    if not e["present"]:
        return "unallocated"
    return "zero" if e["zero"] else "data"


def svg_extents(text):
    root = ET.fromstring(text)
    assert root.tag == SVG + "svg"
    return root, [r for r in root.iter(SVG + "rect")
                  if "extent" in r.get("class", "").split()]


def check_against_json(svg_text, entries, start, end, compressed=()):
    """The SVG's extents are the JSON entries, to scale; compressed lists
    the starts of the entries drawn as compressed."""
    root, rects = svg_extents(svg_text)
    assert len(rects) == len(entries), (len(rects), len(entries))
    layers = {int(g.get("data-row")) for g in root.iter(SVG + "g")
              if g.get("class") == "layer"}
    n_layers = len(layers) - 1  # the last row holds unallocated extents
    scale = BAR_WIDTH / (end - start)
    ys = {}
    for r, e in zip(rects, entries):
        want_kind = ("compressed" if e["start"] in compressed
                     else kind_of(e))
        assert (int(r.get("data-start")), int(r.get("data-length")),
                int(r.get("data-depth")), r.get("data-kind")) == \
            (e["start"], e["length"], e["depth"], want_kind)
        assert want_kind in r.get("class").split()
        assert float(r.get("x")) == pytest.approx(
            BAR_LEFT + (e["start"] - start) * scale, abs=1e-3)
        assert float(r.get("width")) == pytest.approx(
            e["length"] * scale, abs=2e-3)
        row = n_layers if want_kind == "unallocated" else e["depth"]
        ys.setdefault(row, set()).add(float(r.get("y")))
    # One y per row, the rows top-down: depth 0 first, unallocated last.
    assert all(len(v) == 1 for v in ys.values()), ys
    tops = [ys[r].pop() for r in sorted(ys)]
    assert tops == sorted(tops), ys
    return root


def map_json(run, blkimg, *args):
    cp = run(blkimg, "map", "--output=json", *args, check=True)
    return json.loads(cp.stdout)


def map_svg(run, blkimg, *args):
    cp = run(blkimg, "map", "--output=svg", *args)
    assert cp.returncode == 0, cp.stderr
    assert cp.stderr == ""
    return cp.stdout


@pytest.fixture
def chain(tmp_path, run, blkimg, blkimg_io):
    """base.qcow2 (data at 0-4M and 8-9M) under top.qcow2 (data, zeroes
    and a compressed cluster of its own), 16 MiB."""
    base, top = tmp_path / "base.qcow2", tmp_path / "top.qcow2"
    run(blkimg, "create", "-q", "-f", "qcow2", base, "16M", check=True)
    run(blkimg_io, "-f", "qcow2", "-c", "write -P 1 0 4M",
        "-c", "write -P 2 8M 1M", base, check=True)
    run(blkimg, "create", "-q", "-f", "qcow2", "-b", base.name, "-F",
        "qcow2", top, check=True, cwd=tmp_path)
    run(blkimg_io, "-f", "qcow2", "-c", "write -P 3 1M 1M",
        "-c", "write -z 3M 512k", "-c", "write -c -P 5 14M 64k",
        "-c", "write -P 4 12M 64k", top, check=True)
    return top


def test_svg_of_a_backing_chain_matches_json(run, blkimg, chain):
    entries = map_json(run, blkimg, chain)
    kinds = {kind_of(e) for e in entries}
    assert kinds == {"data", "zero", "unallocated"}
    assert {e["depth"] for e in entries} == {0, 1}
    compressed = {e["start"] for e in entries
                  if e["data"] and "offset" not in e}
    assert compressed == {14 << 20}
    root = check_against_json(map_svg(run, blkimg, chain), entries, 0,
                              16 << 20, compressed)
    texts = ["".join(t.itertext()) for t in root.iter(SVG + "text")]
    # Long paths are shortened from the left (the tooltip has them whole).
    assert any(t.startswith("0: ") and t.endswith("/top.qcow2 (qcow2)")
               for t in texts), texts
    assert any(t.startswith("1: ") and t.endswith("/base.qcow2 (qcow2)")
               for t in texts), texts
    assert any(t.startswith("compressed: 64 KiB") for t in texts), texts


def test_svg_rows_are_the_layers(run, blkimg, chain):
    """Depth 0 is drawn above depth 1, unallocated extents below both."""
    _, rects = svg_extents(map_svg(run, blkimg, chain))
    y = {}
    for r in rects:
        row = ("none" if r.get("data-kind") == "unallocated"
               else int(r.get("data-depth")))
        y.setdefault(row, set()).add(float(r.get("y")))
    assert all(len(v) == 1 for v in y.values()), y
    assert min(y[0]) < min(y[1]) < min(y["none"])


def test_svg_of_a_range(run, blkimg, chain):
    """--start-offset and --max-length: the bar spans that range."""
    args = ["--start-offset=2M", "--max-length=11M", chain]
    entries = map_json(run, blkimg, *args)
    check_against_json(map_svg(run, blkimg, *args), entries, 2 << 20,
                       13 << 20)


def test_svg_of_a_raw_file_with_a_hole(run, blkimg, blkimg_io, tmp_path):
    img = tmp_path / "disk.raw"
    run(blkimg, "create", "-q", "-f", "raw", img, "4M", check=True)
    run(blkimg_io, "-f", "raw", "-c", "write -P 9 1M 1M", img, check=True)
    entries = map_json(run, blkimg, "-f", "raw", img)
    assert len(entries) >= 2
    check_against_json(map_svg(run, blkimg, "-f", "raw", img), entries, 0,
                       4 << 20)


def test_svg_escapes_the_file_name(run, blkimg, tmp_path):
    img = tmp_path / 'a&b<"c">.raw'
    run(blkimg, "create", "-q", "-f", "raw", img, "1M", check=True)
    root, rects = svg_extents(map_svg(run, blkimg, "-f", "raw", img))
    assert len(rects) == len(map_json(run, blkimg, "-f", "raw", img))
    title = "".join(next(root.iter(SVG + "text")).itertext())
    assert title.endswith('a&b<"c">.raw')


def test_bad_output_keeps_qemu_img_message(run, blkimg, tmp_path):
    img = tmp_path / "disk.raw"
    run(blkimg, "create", "-q", "-f", "raw", img, "1M", check=True)
    cp = run(blkimg, "map", "--output=png", img)
    assert cp.returncode == 1
    assert "--output must be used with human or json as argument." in \
        cp.stderr
