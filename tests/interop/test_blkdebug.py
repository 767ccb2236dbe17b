# SPDX-License-Identifier: MIT
"""The blkdebug filter injects faults as QEMU 7.2's does.

The same config files and options are given to blkimg-io and qemu-io on
copies of one image: a matrix in the spirit of QEMU's iotest 026 (qcow2
write-path events x errno x once x operations) must fail (or not) the
same command with the same line, report a failure to flush at close the
same way, leave an image that qemu-img check and blkimg check find free
of corruption (leaks allowed) and agree on, and keep the data written
and flushed before the fault. Config-file errors, options, the align
limit and set-state transitions are compared too.
"""
import re
import shutil
import subprocess

import pytest

pytestmark = pytest.mark.qemu

# qcow2 events on the write path (read_aio for reads), and the generic
# pwritev
EVENTS = ["l1_update", "l2_load", "l2_update", "l2_alloc_write", "write_aio",
          "refblock_load", "refblock_update", "refblock_alloc",
          "refblock_alloc_hookup", "refblock_alloc_write", "cluster_alloc",
          "cluster_alloc_bytes", "reftable_grow", "cow_read", "cow_write",
          "read_aio", "pwritev"]
# name -> (image, command); "pre" holds 0x11 over [0, 128k), flushed
OPS = {
    "alloc": ("empty", "write -P 0x5a 0 64k"),
    "alloc4k": ("pre", "write -P 0x5a 256k 4k"),
    "overwrite": ("pre", "write -P 0x5a 0 4k"),
    "zero": ("pre", "write -z 0 64k"),
    "discard": ("pre", "discard 0 64k"),
    "compressed": ("pre", "write -c 512k 64k"),
}
ERRORS = [(5, "off"), (28, "on")]


@pytest.fixture(scope="module")
def images(tmp_path_factory, qemu_img, qemu_io):
    d = tmp_path_factory.mktemp("blkdebug")
    empty = d / "empty.qcow2"
    pre = d / "pre.qcow2"
    for p in (empty, pre):
        r = subprocess.run(
            [qemu_img, "create", "-q", "-f", "qcow2", str(p), "1M"])
        assert r.returncode == 0
    r = subprocess.run(
        [qemu_io, "-c", "write -P 0x11 0 128k", "-c", "flush", str(pre)],
        capture_output=True)
    assert r.returncode == 0
    return {"empty": empty, "pre": pre}


def outcome(cp, tool):
    """The command's failure lines and whether closing failed."""
    lines = set()
    for line in (cp.stdout + cp.stderr).splitlines():
        line = line.replace(tool + ": ", "")
        if re.match(r"^\w+ failed: ", line):
            lines.add(line)
    close = "Failed to flush" in cp.stderr or "Failed to close" in cp.stderr
    return sorted(lines), close


def write_cfg(path, sections):
    text = ""
    for name, kv in sections:
        text += "[%s]\n" % name
        for k, v in kv.items():
            text += '%s = "%s"\n' % (k, v)
    path.write_text(text)
    return path


def check_agree(run, blkimg, qemu_img, img):
    q = run(qemu_img, "check", img)
    b = run(blkimg, "check", img)
    assert q.returncode in (0, 3), q.stdout + q.stderr
    assert b.returncode == q.returncode, (q.stdout, b.stdout, b.stderr)
    leaks = re.compile(r"(\d+) leaked clusters were found")
    assert leaks.findall(b.stdout) == leaks.findall(q.stdout)


def run_case(tmp_path, run, tools, images, event, op, errno, once,
             opts=(), cmds_after=()):
    """One matrix case: the same command through both tools, compared."""
    blkimg, blkimg_io, qemu_img, qemu_io = tools
    base, cmd = OPS[op]
    cfg = write_cfg(tmp_path / "cfg", [("inject-error", {
        "event": event, "errno": errno, "once": once})])
    qimg, bimg = tmp_path / "q.qcow2", tmp_path / "b.qcow2"
    shutil.copy(images[base], qimg)
    shutil.copy(images[base], bimg)
    args = list(opts) + ["-c", cmd]
    for c in cmds_after:
        args += ["-c", c]
    q = run(qemu_io, *args, "blkdebug:%s:%s" % (cfg, qimg))
    b = run(blkimg_io, *args, "blkdebug:%s:%s" % (cfg, bimg))
    assert outcome(b, "blkimg-io") == outcome(q, "qemu-io"), \
        (q.stdout, q.stderr, b.stdout, b.stderr)
    # the command's status as qemu-io's; blkimg-io also exits 1 when
    # closing fails (qemu-io only says so)
    assert (b.returncode != 0) == (q.returncode != 0 or
                                   outcome(b, "blkimg-io")[1])
    check_agree(run, blkimg, qemu_img, bimg)
    if base == "pre":
        # what was flushed before the fault is still there
        keep = "read -P 0x11 64k 64k" if cmd.split()[-2] == "0" \
            else "read -P 0x11 0 128k"
        r = run(qemu_io, "-r", "-c", keep, bimg)
        assert r.returncode == 0 and "failed" not in r.stdout, r.stdout


@pytest.fixture
def tools(blkimg, blkimg_io, qemu_img, qemu_io):
    return blkimg, blkimg_io, qemu_img, qemu_io


@pytest.mark.parametrize("errno,once", ERRORS)
@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("event", EVENTS)
def test_matrix(tmp_path, run, tools, images, event, op, errno, once):
    if op == "discard" and event in ("refblock_load", "refblock_alloc"):
        pytest.xfail("QEMU frees a discarded cluster's refcount at once "
                     "(and warns 'qcow2_free_clusters failed'); blkimg "
                     "defers the free to its next metadata flush")
    run_case(tmp_path, run, tools, images, event, op, errno, once)


# (event, op) pairs where blkimg differs, with the reason
ALLOC_SPACE = ("QEMU zeroes a new cluster with a zero write first "
               "(cluster_alloc_space); blkimg writes the zeroes with the data")
FLUSH_XFAIL = {
    ("flush_to_disk", "compressed"):
        "qemu-io fails its close-time flush, blkimg's does not (not "
        "analysed yet)",
    ("pwritev_done", "alloc4k"): ALLOC_SPACE,
    ("pwritev_zero", "alloc4k"): ALLOC_SPACE,
}


@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("event", ["flush_to_os", "flush_to_disk",
                                   "pwritev_done", "pwritev_zero"])
def test_matrix_flush(tmp_path, run, tools, images, event, op):
    """The generic events, in writeback mode with an explicit flush
    (writethrough flushes after every write in QEMU, not in blkimg)."""
    if (event, op) in FLUSH_XFAIL:
        pytest.xfail(FLUSH_XFAIL[(event, op)])
    run_case(tmp_path, run, tools, images, event, op, 5, "off",
             opts=("-t", "writeback"), cmds_after=("flush",))


CONFIG_ERRORS = [
    ('[inject-error]\nevent = "bogus"\n', "invalid parameter value: bogus"),
    ('[inject-error]\nerrno = "5"\n', "Missing event name for rule"),
    ('[foo]\n', "There is no option group 'foo'"),
    ('garbage\n', "no group defined"),
    ('[inject-error]\nevent="l2_load"\n',
     "Invalid parameter 'event=\"l2_load\"'"),
    ('[inject-error]\nevent = "l2_load"\nerrno = 5\n',
     "Parameter 'errno' expects a number"),
    ('[inject-error]\nevent = "l2_load"\nonce = "maybe"\n',
     "Parameter 'once' expects 'on' or 'off'"),
    ('[inject-error]\nevent = "l2_load"\niotype = "foo"\n',
     "invalid parameter value: foo"),
    ('[inject-error]\nevent = "l2_load"\nnew_state = "2"\n',
     "Invalid parameter 'new_state'"),
    ('[set-state]\nevent = "l2_load"\nsector = "2"\n',
     "Invalid parameter 'sector'"),
    ('[inject-error]\n   \n', "parse error"),
]


@pytest.mark.parametrize("text,msg", CONFIG_ERRORS)
def test_config_errors(tmp_path, run, blkimg_io, qemu_io, images, text, msg):
    cfg = tmp_path / "cfg"
    cfg.write_text(text)
    name = "blkdebug:%s:%s" % (cfg, images["pre"])
    q = run(qemu_io, "-r", "-c", "read 0 512", name)
    b = run(blkimg_io, "-r", "-c", "read 0 512", name)
    assert q.returncode == b.returncode == 1
    assert q.stderr.strip() == "qemu-io: can't open device %s: %s" % (name,
                                                                      msg)
    assert b.stderr.replace("blkimg-io:", "qemu-io:") == q.stderr


@pytest.mark.parametrize("name", [
    "blkdebug:%(img)s", "blkdebug:/nonexistent:%(img)s"])
def test_name_errors(run, blkimg_io, qemu_io, images, name):
    name = name % {"img": images["pre"]}
    q = run(qemu_io, "-r", "-c", "read 0 512", name)
    b = run(blkimg_io, "-r", "-c", "read 0 512", name)
    assert q.returncode == b.returncode == 1
    assert b.stderr.replace("blkimg-io:", "qemu-io:") == q.stderr


@pytest.mark.parametrize("opts", [
    "file.align=3000", "file.max-transfer=1000", "file.bogus=1",
    "file.align=4096,file.max-transfer=6000",
    "file.inject-error.0.event=l2_load,file.inject-error.0.errno=28",
    "file.inject-error.0.event=l2_load,file.inject-error.0.once=on",
    "file.inject-error.0.event=nope",
    "file.set-state.0.event=l2_load,file.set-state.0.new_state=2,"
    "file.inject-error.0.event=write_aio,file.inject-error.0.state=2",
])
def test_options(tmp_path, run, blkimg_io, qemu_io, images, opts, mask_timing):
    img = tmp_path / "a.qcow2"
    shutil.copy(images["pre"], img)
    spec = "driver=qcow2,file.driver=blkdebug,file.image.filename=%s,%s" % (
        img, opts)
    cmds = ["-c", "write -P 0x22 0 4k", "-c", "write -P 0x22 256k 4k"]
    q = run(qemu_io, "--image-opts", *cmds, spec)
    shutil.copy(images["pre"], img)
    b = run(blkimg_io, "--image-opts", *cmds, spec)
    assert mask_timing(b.stdout) == mask_timing(q.stdout)
    assert outcome(b, "blkimg-io") == outcome(q, "qemu-io")


@pytest.mark.parametrize("align", ["", ",file.align=4096"])
@pytest.mark.parametrize("event", ["none", "pwritev_rmw_head"])
def test_align(tmp_path, run, blkimg_io, qemu_io, qemu_img, align, event,
               mask_timing):
    """With align=4096 a 512-byte write at 512 reaches the filter as a
    read-modify-write of [0, 4096): a rule on sector 0 hits it."""
    raw = tmp_path / "r.raw"
    run(qemu_img, "create", "-q", "-f", "raw", raw, "1M", check=True)
    cfg = write_cfg(tmp_path / "cfg", [("inject-error", {
        "event": event, "sector": 0})])
    spec = "driver=raw,file.driver=blkdebug,file.config=%s," \
        "file.image.filename=%s%s" % (cfg, raw, align)
    q = run(qemu_io, "--image-opts", "-c", "write 512 512", spec)
    b = run(blkimg_io, "--stats", "--image-opts", "-c", "write 512 512", spec)
    assert outcome(b, "blkimg-io")[0] == outcome(q, "qemu-io")[0]
    assert mask_timing(b.stdout).startswith(mask_timing(q.stdout))
    assert ("rmw operations: 1" in b.stdout) == bool(align)


STATE_CASES = [
    # l2_update moves to state 2; write_aio fails only in state 2
    [("set-state", {"event": "l2_update", "state": 1, "new_state": 2}),
     ("inject-error", {"event": "write_aio", "state": 2})],
    # the state changes after all rules of the event ran
    [("set-state", {"event": "write_aio", "state": 1, "new_state": 2}),
     ("inject-error", {"event": "write_aio", "state": 2})],
    [("set-state", {"event": "write_aio", "state": 1, "new_state": 2}),
     ("set-state", {"event": "write_aio", "state": 2, "new_state": 3}),
     ("inject-error", {"event": "write_aio", "state": 3, "once": "on"})],
    [("set-state", {"event": "none", "new_state": 2}),
     ("inject-error", {"event": "write_aio", "state": 2, "errno": 28})],
    [("inject-error", {"event": "write_aio", "errno": 0}),
     ("inject-error", {"event": "write_aio", "errno": 5})],
]


@pytest.mark.parametrize("case", range(len(STATE_CASES)))
def test_set_state(tmp_path, run, blkimg_io, qemu_io, images, case,
                   mask_timing):
    cfg = write_cfg(tmp_path / "cfg", STATE_CASES[case])
    cmds = []
    for i in range(4):
        cmds += ["-c", "write -P 0x3%d %dk 4k" % (i, 256 + 64 * i)]
    img = tmp_path / "a.qcow2"
    shutil.copy(images["pre"], img)
    q = run(qemu_io, *cmds, "blkdebug:%s:%s" % (cfg, img))
    shutil.copy(images["pre"], img)
    b = run(blkimg_io, *cmds, "blkdebug:%s:%s" % (cfg, img))
    assert mask_timing(b.stdout) == mask_timing(q.stdout)


# ------------------------------------------------ qemu-img's write paths

# name -> (image, qemu-img arguments; "@" stands for the image's name)
IMG_OPS = {
    "snapshot-create": ("pre", ["snapshot", "-c", "s1", "@"]),
    "snapshot-delete": ("snap", ["snapshot", "-d", "s0", "@"]),
    "resize": ("pre", ["resize", "@", "2G"]),
    "shrink": ("pre", ["resize", "--shrink", "@", "512k"]),
    "amend": ("pre", ["amend", "-o", "refcount_bits=64", "@"]),
    "amend-compat": ("pre", ["amend", "-o", "compat=0.10", "@"]),
    "commit": ("overlay", ["commit", "@"]),
}
# what was written and flushed before the operation, read back after it
# (the overlay's through its backing file)
KEEP = {
    "pre": ["read -P 0x11 0 128k"],
    "snap": ["read -P 0x22 0 64k", "read -P 0x11 64k 64k"],
    "overlay": ["read -P 0x5a 0 64k", "read -P 0x11 64k 64k",
                "read -P 0x5a 256k 64k"],
}
# every event but those raised at open (none, reftable_load)
IMG_EVENTS = EVENTS + [
    "l1_grow_alloc_table", "l1_grow_write_table", "l1_grow_activate_table",
    "l1_shrink_write_table", "l1_shrink_free_l2_clusters",
    "refblock_update_part", "refblock_alloc_write_blocks",
    "refblock_alloc_write_table", "refblock_alloc_switch_table",
    "reftable_update", "cluster_free", "empty_image_prepare",
    "flush_to_os", "flush_to_disk", "pwritev_zero", "pwritev_done"]
# the normal run's share: the metadata writes every operation goes
# through, the data path and the flushes
IMG_EVENTS_QUICK = ["l2_update", "refblock_update_part", "cluster_alloc",
                    "pwritev", "flush_to_disk"]

# QEMU's qcow2 reports its close-time cache flush failures on its own;
# blkimg's close does not print them
CLOSE_LINES = re.compile(r"^Failed to flush the (L2 table|refcount block) "
                         r"cache: ")


def img_outcome(cp, tool, img):
    """The first error line of the command (the operation's; the image's
    name as IMG) and its exit code."""
    lines = [ln.replace(tool + ": ", "", 1).replace(str(img), "IMG")
             for ln in cp.stderr.splitlines() if ln.startswith(tool + ": ")]
    lines = [ln for ln in lines if not CLOSE_LINES.match(ln)]
    return cp.returncode, lines[:1]


def img_state(run, qemu_img, img):
    """What the operation changes: virtual size, snapshots, refcount
    width, compat."""
    import json
    r = run(qemu_img, "info", "-U", "--output=json", img, check=True)
    info = json.loads(r.stdout)
    spec = info.get("format-specific", {}).get("data", {})
    return (info["virtual-size"],
            sorted(s["name"] for s in info.get("snapshots", [])),
            spec.get("refcount-bits"), spec.get("compat"))


def dirty(img):
    """Whether the qcow2 header's incompatible dirty bit is set."""
    with open(img, "rb") as f:
        return int.from_bytes(f.read(80)[72:80], "big") & 1 == 1


def check_same(run, blkimg, blkimg_io, qemu_img, qimg, bimg):
    """bimg checks as qimg does, clean or leaks only; or, where QEMU
    leaves the same, with refcounts above the references (a failed
    snapshot operation's +1/-1 pass: OFLAG_COPIED errors, no data at
    risk); or broken refcounts under the dirty bit (a make_empty that
    failed half-way, as QEMU's), which the next writable open repairs."""
    q = run(qemu_img, "check", qimg)
    b = run(qemu_img, "check", bimg)
    bb = run(blkimg, "check", bimg)
    assert bb.returncode == b.returncode, (b.stdout, bb.stdout)
    # as QEMU's, or better (errors in QEMU's image, none in blkimg's)
    assert b.returncode == q.returncode or \
        (q.returncode == 2 and b.returncode in (0, 3)), (q.stdout, b.stdout)
    if b.returncode == 2 and dirty(bimg):
        run(blkimg_io, "-c", "flush", bimg, check=True)
        assert not dirty(bimg)
        for tool in (qemu_img, blkimg):
            r = run(tool, "check", bimg)
            assert r.returncode in (0, 3), r.stdout + r.stderr
    elif b.returncode == 2:
        errors = [ln for ln in b.stderr.splitlines() + b.stdout.splitlines()
                  if ln.startswith("ERROR")]
        assert errors and all(e.startswith("ERROR OFLAG_COPIED")
                              for e in errors), b.stdout + b.stderr
    else:
        assert b.returncode in (0, 3), b.stdout + b.stderr
    leaks = re.compile(r"(\d+) leaked clusters were found")
    assert leaks.findall(bb.stdout) == leaks.findall(b.stdout)


def img_prepare(run, qemu_img, qemu_io, images, base, path):
    """A copy of image base at path; for the overlay, a fresh base of its
    own beside it."""
    if base != "overlay":
        shutil.copy(images[base], path)
        return
    backing = path.with_suffix(".base")
    shutil.copy(images["pre"], backing)
    run(qemu_img, "create", "-q", "-f", "qcow2", "-b", backing, "-F",
        "qcow2", path, "1M", check=True)
    run(qemu_io, "-c", "write -P 0x5a 0 64k", "-c", "write -P 0x5a 256k 64k",
        "-c", "flush", path, check=True)


# (event, op) pairs where blkimg differs, with the reason
SHRINK_L2 = ("a shrink rewrites the L2 table of the cropped range (zero "
             "flags, then none) where QEMU's full discard leaves unchanged "
             "entries alone and writes nothing")
CLUSTER_FREE = ("blkimg raises cluster_free when it queues a free, QEMU "
                "when it frees: the rule fails another request")
FLUSH_TO_OS = ("QEMU flushes the qcow2 node in the middle (flush_to_os on "
               "its file); blkimg flushes the file node itself, which "
               "raises none")
IMG_XFAIL = {
    ("l2_update", "shrink"): SHRINK_L2,
    ("pwritev", "shrink"): SHRINK_L2,
    ("pwritev_done", "shrink"):
        "QEMU's shrink ends by shrinking the refcount table ('Failed to "
        "discard unused refblocks'); blkimg keeps it and fails elsewhere",
    ("pwritev_done", "amend-compat"):
        "QEMU's downgrade first writes zero clusters out as data ('Failed "
        "to turn zero into data clusters'); blkimg's writes come in "
        "another order",
    ("cluster_free", "resize"): CLUSTER_FREE,
    ("cluster_free", "amend"): CLUSTER_FREE,
    ("cluster_free", "snapshot-delete"): CLUSTER_FREE,
    ("flush_to_os", "snapshot-create"): FLUSH_TO_OS,
    ("flush_to_os", "snapshot-delete"): FLUSH_TO_OS,
    ("flush_to_os", "amend"): FLUSH_TO_OS,
    ("refblock_update_part", "snapshot-delete"):
        "QEMU writes the refcount blocks during the -1 pass over the "
        "snapshot's tables (its cache is small); blkimg at the flush "
        "before the COPIED pass, so the step that fails differs",
}


def run_img_case(tmp_path, run, tools, images, event, op, errno, once):
    blkimg, blkimg_io, qemu_img, qemu_io = tools
    if (event, op) in IMG_XFAIL:
        pytest.xfail(IMG_XFAIL[(event, op)])
    base, argv = IMG_OPS[op]
    cfg = write_cfg(tmp_path / "cfg", [("inject-error", {
        "event": event, "errno": errno, "once": once})])
    res = {}
    for tool, name in ((qemu_img, "q.qcow2"), (blkimg, "b.qcow2")):
        img = tmp_path / name
        img_prepare(run, qemu_img, qemu_io, images, base, img)
        spec = "blkdebug:%s:%s" % (cfg, img)
        res[tool] = (run(tool, *[spec if a == "@" else a for a in argv]),
                     img)
    (q, qimg), (b, bimg) = res[qemu_img], res[blkimg]
    assert img_outcome(b, "blkimg", bimg) == \
        img_outcome(q, "qemu-img", qimg), \
        (q.stderr, b.stderr)
    check_same(run, blkimg, blkimg_io, qemu_img, qimg, bimg)
    assert img_state(run, qemu_img, bimg) == img_state(run, qemu_img, qimg)
    args = []
    for c in KEEP[base]:
        args += ["-c", c]
    r = run(qemu_io, "-r", *args, bimg)
    assert r.returncode == 0 and "failed" not in r.stdout and \
        "Pattern" not in r.stdout, r.stdout


@pytest.fixture(scope="module")
def img_images(images, tmp_path_factory, qemu_img, qemu_io):
    """images plus "snap": a snapshot s0 of "pre", then 0x22 over
    [0, 64k) in the active layer."""
    snap = tmp_path_factory.mktemp("blkdebug-img") / "snap.qcow2"
    shutil.copy(images["pre"], snap)
    r = subprocess.run([qemu_img, "snapshot", "-c", "s0", str(snap)])
    assert r.returncode == 0
    r = subprocess.run([qemu_io, "-c", "write -P 0x22 0 64k", str(snap)],
                       capture_output=True)
    assert r.returncode == 0
    return dict(images, snap=snap)


@pytest.mark.parametrize("errno,once", ERRORS[:1])
@pytest.mark.parametrize("op", list(IMG_OPS))
@pytest.mark.parametrize("event", IMG_EVENTS_QUICK)
def test_matrix_img(tmp_path, run, tools, img_images, event, op, errno,
                    once):
    """qemu-img's snapshot, resize, amend and commit under a fault: the
    same first error line and exit code as qemu-img, an image that checks
    as QEMU's does, the same result, the flushed data intact."""
    run_img_case(tmp_path, run, tools, img_images, event, op, errno, once)


@pytest.mark.torture
@pytest.mark.parametrize("errno,once", ERRORS)
@pytest.mark.parametrize("op", list(IMG_OPS))
@pytest.mark.parametrize("event", IMG_EVENTS)
def test_matrix_img_full(tmp_path, run, tools, img_images, event, op, errno,
                         once):
    """The whole cross product (make torture)."""
    run_img_case(tmp_path, run, tools, img_images, event, op, errno, once)
