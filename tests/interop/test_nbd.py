# SPDX-License-Identifier: MIT
"""The nbd protocol driver against real servers: qemu-nbd 7.2 (raw and
qcow2 exports, -f qcow2, --allocation-depth, TLS) and nbdkit (memory,
file, pattern; block-size constraints from its blocksize-policy filter;
multi-conn), on Unix sockets in the test's directory and on TCP over
127.0.0.1. Every case is checked against qemu-img / qemu-io doing the same
thing to the same server: same bytes, same maps, same exit codes and
error wording. Servers are killed by PID when the test ends."""
import json
import os
import time

import pytest

import nbd_peers
from nbd_peers import Peers

pytestmark = [
    pytest.mark.qemu,
    pytest.mark.skipif(not nbd_peers.have("qemu-nbd", "nbdkit"),
                       reason="qemu-nbd / nbdkit missing"),
]

MiB = 1 << 20


@pytest.fixture
def peers(tmp_path):
    p = Peers(tmp_path)
    yield p
    p.stop_all()


@pytest.fixture
def src_qcow2(run, qemu_img, qemu_io, tmp_path):
    """A 64 MiB qcow2 with data, an allocated zero cluster range, a
    discarded range and unallocated space (made by QEMU)."""
    img = tmp_path / "src.qcow2"
    run(qemu_img, "create", "-q", "-f", "qcow2", img, "64M", check=True)
    run(qemu_io, "-f", "qcow2", "-c", "write -P 0x11 0 2M",
        "-c", "write -z 4M 1M", "-c", "write -P 0x22 30M 3M",
        "-c", "write -P 0x33 63M 512k", "-c", "discard 31M 1M", img,
        check=True)
    return img


def raw_copy(run, qemu_img, src, dst, fmt="qcow2"):
    run(qemu_img, "convert", "-f", fmt, "-O", "raw", src, dst, check=True)


def read_bytes(path):
    with open(path, "rb") as f:
        return f.read()


def ok(cp):
    assert cp.returncode == 0, cp.stderr
    return cp


def msg(cp):
    """stderr's first line without the program name."""
    line = cp.stderr.splitlines()[0] if cp.stderr else ""
    return line.split(": ", 1)[1] if ": " in line else line


# ------------------------------------------------------------ names, info


def names(peer):
    """The ways one export is named: (label, args before the name)."""
    out = [("url", [], peer.url)]
    if isinstance(peer.addr, str):
        out.append(("legacy", [], "nbd:unix:%s:exportname=%s" %
                    (peer.addr, peer.export)))
    else:
        out.append(("legacy", [], "nbd:%s:%d:exportname=%s" %
                    (peer.addr[0], peer.addr[1], peer.export)))
    out.append(("driver=nbd", ["--image-opts"], "driver=nbd," + peer.opts()))
    out.append(("file.driver=nbd", ["--image-opts"],
                "driver=raw,file.driver=nbd," + peer.opts("file.")))
    return out


@pytest.mark.parametrize("tcp", [False, True], ids=["unix", "tcp"])
def test_info_and_map_match_qemu(run, blkimg, qemu_img, peers, src_qcow2,
                                 tmp_path, tcp):
    """info and map (JSON) of a qemu-nbd export, named every way QEMU
    names it, are qemu-img's, byte for byte."""
    raw = tmp_path / "src.raw"
    raw_copy(run, qemu_img, src_qcow2, raw)
    peer = peers.qemu_nbd(raw, tcp=tcp)
    for label, pre, name in names(peer):
        for cmd in (["info", "--output=json"], ["info"],
                    ["map", "--output=json"], ["map"]):
            want = ok(run(qemu_img, *cmd, *pre, name))
            got = ok(run(blkimg, *cmd, *pre, name))
            assert got.stdout == want.stdout, (label, cmd)


def test_qcow2_export_convert_and_map(run, blkimg, qemu_img, peers,
                                      src_qcow2, tmp_path):
    """qemu-nbd -f qcow2 serves the guest view: convert NBD -> raw gives
    qemu-img's bytes and allocation, map is qemu-img's."""
    peer = peers.qemu_nbd(src_qcow2, fmt="qcow2")
    a, b = tmp_path / "a.raw", tmp_path / "b.raw"
    ok(run(blkimg, "convert", "-O", "raw", peer.url, a))
    ok(run(qemu_img, "convert", "-O", "raw", peer.url, b))
    assert read_bytes(a) == read_bytes(b)
    assert os.stat(a).st_blocks == os.stat(b).st_blocks
    for out in (["--output=json"], []):
        assert ok(run(blkimg, "map", *out, peer.url)).stdout == \
            ok(run(qemu_img, "map", *out, peer.url)).stdout
    ok(run(blkimg, "compare", "-U", src_qcow2, peer.url))
    # to qcow2 too: the same clusters allocated as qemu-img allocates
    qa, qb = tmp_path / "a.qcow2", tmp_path / "b.qcow2"
    ok(run(blkimg, "convert", "-O", "qcow2", peer.url, qa))
    ok(run(qemu_img, "convert", "-O", "qcow2", peer.url, qb))
    assert ok(run(qemu_img, "map", "--output=json", qa)).stdout == \
        ok(run(qemu_img, "map", "--output=json", qb)).stdout


def test_allocation_depth(run, blkimg, blkimg_io, qemu_img, qemu_io, peers,
                          tmp_path):
    """qemu-nbd -A offers qemu:allocation-depth: a range allocated nowhere
    in the chain is unallocated for the protocol node (driver=nbd), where
    base:allocation alone calls it a zero run; data and zero clusters stay
    as qemu-img maps them. Through raw (the usual name) qemu-img's map."""
    base = tmp_path / "base.qcow2"
    top = tmp_path / "top.qcow2"
    run(qemu_img, "create", "-q", "-f", "qcow2", base, "8M", check=True)
    run(qemu_io, "-c", "write -P 1 0 1M", base, check=True)
    run(qemu_img, "create", "-q", "-f", "qcow2", "-b", base, "-F", "qcow2",
        top, check=True)
    run(qemu_io, "-c", "write -z 2M 1M", "-c", "write -P 2 4M 1M", top,
        check=True)
    peer = peers.qemu_nbd(top, fmt="qcow2", extra=["-A"])
    m = json.loads(ok(run(blkimg, "map", "--output=json", "--image-opts",
                          "driver=nbd," + peer.opts())).stdout)
    present = {(e["start"], e["length"]): e["present"] for e in m}
    data = {(e["start"], e["length"]): e["data"] for e in m}
    assert present[(0, MiB)] and data[(0, MiB)]          # backing's data
    assert present[(MiB, MiB)] is False                 # nowhere: depth 0
    assert present[(2 * MiB, MiB)] and not data[(2 * MiB, MiB)]  # zeroes
    assert present[(4 * MiB, MiB)] and data[(4 * MiB, MiB)]
    assert ok(run(blkimg, "map", "--output=json", peer.url)).stdout == \
        ok(run(qemu_img, "map", "--output=json", peer.url)).stdout
    # imageio's way to read the depth: qemu-img map of x-dirty-bitmap=
    # qemu:allocation-depth (depths read as base:allocation bits)
    opts = "driver=nbd,x-dirty-bitmap=qemu:allocation-depth," + peer.opts()
    assert ok(run(blkimg, "map", "--output=json", "--image-opts",
                  opts)).stdout == \
        ok(run(qemu_img, "map", "--output=json", "--image-opts",
               opts)).stdout
    # what a write allocates is seen at once (status is cached per reply
    # and dropped by writes); qemu-io, deaf to the depth, says allocated
    cp = ok(run(blkimg_io, "--image-opts", "-c", "alloc 6M 64k",
                "-c", "write -P 3 6M 64k", "-c", "alloc 6M 64k",
                "driver=nbd," + peer.opts()))
    assert [l for l in cp.stdout.splitlines() if "allocated" in l] == [
        "0/65536 bytes allocated at offset 6 MiB",
        "65536/65536 bytes allocated at offset 6 MiB"]


# ------------------------------------------------------------- targets


@pytest.mark.parametrize("target", ["url", "target-image-opts", "tcp",
                                    "file-plugin", "no -n"])
def test_convert_into_export(run, blkimg, qemu_img, peers, src_qcow2,
                             tmp_path, target):
    """convert -n into an nbdkit memory export (multi-conn: several
    connections at once), or the file plugin's, or without -n (QEMU's
    creation fallback: the export must be large enough) gives the bytes
    qemu-img reads back, and the same as qemu-img's own convert into a
    twin export."""
    if target == "file-plugin":
        exports = []
        for name in ("mine.img", "twin.img"):
            with open(tmp_path / name, "wb") as f:
                f.truncate(64 * MiB)
            exports.append(peers.nbdkit("file", tmp_path / name))
        mine, twin = exports
    else:
        mine = peers.nbdkit("memory", "64M", tcp=target == "tcp")
        twin = peers.nbdkit("memory", "64M")
    n = [] if target == "no -n" else ["-n"]
    if target == "target-image-opts":
        # (no -O: qemu-img takes the format from the options then)
        dst = ["--target-image-opts", "driver=raw,file.driver=nbd," +
               mine.opts("file.")]
    else:
        dst = ["-O", "raw", mine.url]
    ok(run(blkimg, "convert", *n, "-f", "qcow2", src_qcow2, *dst))
    ok(run(qemu_img, "convert", *n, "-f", "qcow2", "-O", "raw", src_qcow2,
           twin.url))
    ok(run(qemu_img, "compare", "-f", "qcow2", "-F", "raw", src_qcow2,
           mine.url))
    a, b = tmp_path / "a.raw", tmp_path / "b.raw"
    raw_copy(run, qemu_img, mine.url, a, fmt="raw")
    raw_copy(run, qemu_img, twin.url, b, fmt="raw")
    assert read_bytes(a) == read_bytes(b)


def test_qcow2_on_export(run, blkimg, blkimg_io, qemu_img, qemu_io, peers,
                         src_qcow2, tmp_path):
    """create -f qcow2 on an export, convert and write into it with
    blkimg: qemu-img checks it clean, reads the same bytes, and maps it as
    blkimg does."""
    peer = peers.nbdkit("memory", "128M")
    ok(run(blkimg, "create", "-q", "-f", "qcow2", peer.url, "64M"))
    ok(run(blkimg, "convert", "-n", "-O", "qcow2", src_qcow2, peer.url))
    ok(run(blkimg_io, "-f", "qcow2", "-c", "write -P 0x44 5M 100k",
           "-c", "write -z 40M 2M", peer.url))
    ok(run(qemu_io, "-f", "qcow2", "-c", "read -P 0x44 5M 100k", peer.url))
    cp = ok(run(qemu_img, "check", "-f", "qcow2", peer.url))
    assert "No errors were found" in cp.stdout
    assert ok(run(blkimg, "map", "--output=json", "-f", "qcow2",
                  peer.url)).stdout == \
        ok(run(qemu_img, "map", "--output=json", "-f", "qcow2",
               peer.url)).stdout
    assert ok(run(blkimg, "info", "-f", "qcow2", peer.url)).stdout == \
        ok(run(qemu_img, "info", "-f", "qcow2", peer.url)).stdout


def test_block_size_constraints(run, blkimg, blkimg_io, qemu_io, peers,
                                mask_timing):
    """nbdkit's blocksize-policy filter states 4 KiB minimum, 64 KiB
    preferred and 1 MiB maximum and fails any request that breaks them:
    blkimg takes them as the node's limits (probe shows them) and its
    unaligned and large requests succeed, with qemu-io's bytes."""
    pol = ["blocksize-minimum=4096", "blocksize-preferred=65536",
           "blocksize-maximum=1M", "blocksize-error-policy=error"]
    mine = peers.nbdkit("memory", "16M", *pol, filters=["blocksize-policy"])
    twin = peers.nbdkit("memory", "16M", *pol, filters=["blocksize-policy"])
    j = json.loads(ok(run(blkimg, "probe", "--output=json", "-f", "raw",
                          mine.url)).stdout)
    assert (j["request-alignment"], j["request-alignment-source"]) == \
        (4096, "server")
    assert (j["opt-transfer"], j["max-transfer"]) == (65536, MiB)
    cmds = ["write -P 0x5a 1000 3000", "write -P 0xa5 12345 3M",
            "write -z 9000 5000"]
    args = sum([["-c", c] for c in cmds], [])
    ok(run(blkimg_io, "-f", "raw", *args, mine.url))
    ok(run(qemu_io, "-f", "raw", *args, twin.url))
    dump = ["-c", "read -v 0 16k", "-c", "read -v 3M 64k"]
    assert mask_timing(ok(run(blkimg_io, "-r", "-f", "raw", *dump,
                              mine.url)).stdout) == \
        mask_timing(ok(run(blkimg_io, "-r", "-f", "raw", *dump,
                           twin.url)).stdout)
    ok(run(qemu_io, "-f", "raw", "-c", "read -P 0xa5 14000 3000000",
           "-c", "read -P 0x5a 1000 3000", mine.url))


def test_dd_bench_measure_compare(run, blkimg, qemu_img, peers, src_qcow2,
                                  tmp_path):
    """dd into an export, bench, measure and compare on one, as
    qemu-img does them (outputs equal; bench prints its header)."""
    mine = peers.nbdkit("memory", "64M")
    twin = peers.nbdkit("memory", "64M")
    for tool, peer in ((blkimg, mine), (qemu_img, twin)):
        ok(run(tool, "dd", "-f", "qcow2", "-O", "raw", "if=%s" % src_qcow2,
               "of=%s" % peer.url, "bs=1M", "count=40"))
    for cmd in (["compare", "-f", "raw", "-F", "raw"],):
        assert ok(run(blkimg, *cmd, mine.url, twin.url)).stdout == \
            ok(run(qemu_img, *cmd, mine.url, twin.url)).stdout
    for cmd in (["measure", "-O", "qcow2", "-f", "raw"],
                ["measure", "--output=json", "-O", "qcow2", "-f", "raw"]):
        assert ok(run(blkimg, *cmd, mine.url)).stdout == \
            ok(run(qemu_img, *cmd, twin.url)).stdout
    for w in ([], ["-w"]):
        cp = ok(run(blkimg, "bench", *w, "-f", "raw", "-c", "2000", "-d",
                    "16", "-s", "4k", mine.url))
        want = ok(run(qemu_img, "bench", *w, "-f", "raw", "-c", "2000", "-d",
                      "16", "-s", "4k", twin.url))
        assert cp.stdout.splitlines()[0] == want.stdout.splitlines()[0]


def test_threads_engine(run, blkimg_io, qemu_io, peers):
    """The thread-pool engine watches sockets with poll(2): writes and
    reads through it, checked by qemu-io."""
    peer = peers.nbdkit("memory", "16M")
    ok(run(blkimg_io, "-i", "threads", "-c", "aio_write -P 0x61 0 1M",
           "-c", "aio_write -P 0x62 1M 1M", "-c", "aio_flush",
           "-c", "read -P 0x62 1M 1M", "--image-opts",
           "driver=raw,file.driver=nbd," + peer.opts("file.")))
    ok(run(qemu_io, "-f", "raw", "-c", "read -P 0x61 0 1M", peer.url))


def test_resize_and_create(run, blkimg, qemu_img, peers):
    """An export has its server's size: resize and create answer as
    qemu-img does (same size fine, growing refused)."""
    peer = peers.nbdkit("memory", "64M")
    for args in (["resize", "-f", "raw", peer.url, "1G"],
                 ["resize", "-f", "raw", peer.url, "64M"],
                 ["create", "-f", "raw", peer.url, "128M"],
                 ["create", "-f", "raw", peer.url, "32M"]):
        want = run(qemu_img, *args)
        got = run(blkimg, *args)
        assert (got.returncode, got.stdout, msg(got)) == \
            (want.returncode, want.stdout, msg(want)), args


# ------------------------------------------------------------------ TLS


@pytest.mark.skipif(not nbd_peers.have("psktool"), reason="no psktool")
def test_tls_psk(run, blkimg, qemu_img, peers, src_qcow2, tmp_path):
    """qemu-nbd with tls-creds-psk: blkimg with the same --object reads
    and writes as qemu-img; nbds+unix:// with tls-creds= names it too.
    Without credentials both fail alike; a user missing from keys.psk is
    refused before connecting."""
    psk = nbd_peers.make_psk(tmp_path / "psk")
    raw = tmp_path / "exp.raw"
    run(qemu_img, "create", "-q", "-f", "raw", raw, "64M", check=True)
    peer = peers.qemu_nbd(raw, extra=[
        "--object", "tls-creds-psk,id=tls0,endpoint=server,dir=" + psk,
        "--tls-creds", "tls0"])
    obj = ["--object", "tls-creds-psk,id=tls0,endpoint=client,dir=" + psk]
    img = "driver=raw,file.driver=nbd,file.tls-creds=tls0," + \
        peer.opts("file.")
    ok(run(blkimg, "convert", "-n", *obj, "-f", "qcow2", src_qcow2,
           "--target-image-opts", img))
    ok(run(qemu_img, "compare", *obj, "--image-opts",
           "driver=qcow2,file.filename=%s" % src_qcow2, img))
    url = "nbds+unix:///exp?socket=%s&tls-creds=tls0" % peer.addr
    ok(run(blkimg, "compare", *obj, "-f", "qcow2", "-F", "raw", src_qcow2,
           url))
    want, got = run(qemu_img, "info", peer.url), run(blkimg, "info", peer.url)
    assert (got.returncode, msg(got)) == (want.returncode, msg(want)) == \
        (1, "Could not open '%s': TLS negotiation required before option 7 "
         "(go)" % peer.url)
    bad = ["--object", "tls-creds-psk,id=tls0,endpoint=client,username=bob,"
           "dir=" + psk]
    got = run(blkimg, "info", *bad, "--image-opts", img)
    assert got.returncode == 1
    assert got.stderr.endswith("Username bob not found in PSK file %s/"
                               "keys.psk\n" % psk)


@pytest.mark.skipif(not nbd_peers.have("certtool"), reason="no certtool")
def test_tls_x509(run, blkimg, qemu_img, peers, src_qcow2, tmp_path):
    """qemu-nbd with tls-creds-x509 on TCP: blkimg verifies the server's
    certificate against the CA and copies as qemu-img does; a client that
    asks for TLS of a plain server is denied alike."""
    srv, cli = nbd_peers.make_x509(tmp_path / "pki")
    raw = tmp_path / "exp.raw"
    run(qemu_img, "create", "-q", "-f", "raw", raw, "64M", check=True)
    peer = peers.qemu_nbd(raw, tcp=True, extra=[
        "--object", "tls-creds-x509,id=tls0,endpoint=server,dir=" + srv,
        "--tls-creds", "tls0"])
    obj = ["--object", "tls-creds-x509,id=tls0,endpoint=client,dir=" + cli]
    img = "driver=nbd,tls-creds=tls0,server.type=inet,server.host=localhost," \
        "server.port=%d,export=exp" % peer.addr[1]
    ok(run(blkimg, "convert", "-n", *obj, "-f", "qcow2", src_qcow2,
           "--target-image-opts", img))
    ok(run(qemu_img, "compare", *obj, "--image-opts",
           "driver=qcow2,file.filename=%s" % src_qcow2, img))
    assert ok(run(blkimg, "info", *obj, "--image-opts", img)).stdout == \
        ok(run(qemu_img, "info", *obj, "--image-opts", img)).stdout
    plain = peers.qemu_nbd(raw, extra=["-r"], export="ro")
    img = "driver=nbd,tls-creds=tls0," + plain.opts()
    cli_obj = ["--object", "tls-creds-x509,id=tls0,endpoint=client,"
               "verify-peer=off,dir=" + cli]
    want = run(qemu_img, "info", *cli_obj, "--image-opts", img)
    got = run(blkimg, "info", *cli_obj, "--image-opts", img)
    assert (got.returncode, msg(got)) == (want.returncode, msg(want))
    assert msg(got).endswith("Denied by server for option 5 (starttls)")


# --------------------------------------------------------------- errors


def test_open_errors_match_qemu(run, blkimg, qemu_img, peers, tmp_path):
    """A wrong export name, a refused TCP port, a missing socket, bad URLs
    and a read-only export opened for writing: exit 1 and qemu-img's
    line; convert creates no target."""
    raw = tmp_path / "exp.raw"
    run(qemu_img, "create", "-q", "-f", "raw", raw, "1M", check=True)
    peer = peers.qemu_nbd(raw, extra=["-r"])
    port = nbd_peers.free_port()
    cases = [
        ["info", "nbd+unix:///wrong?socket=%s" % peer.addr],
        ["info", "nbd://127.0.0.1:%d/x" % port],
        ["info", "nbd:127.0.0.1:%d:exportname=x" % port],
        ["info", "nbd:unix:%s/none.sock" % tmp_path],
        ["info", "nbd+unix:///x"],
        ["info", "nbd://h/x?socket=/s"],
        ["info", "nbd:localhost"],
        ["info", "--image-opts", "driver=nbd,server.type=unix,server.path=%s"
         % peer.addr],
        ["info", "--object", "tls-creds-psk,id=t,dir=/nonexistent",
         peer.url],
        ["info", "--image-opts", "driver=nbd,tls-creds=none," + peer.opts()],
        ["info", "--image-opts", "driver=nbd"],
        ["info", "--image-opts", "driver=nbd,foo=1," + peer.opts()],
        ["info", "--image-opts", "driver=nbd,path=/x,host=y"],
        ["info", "nbd:"],
        ["map", "--image-opts", "driver=nbd,x-dirty-bitmap=qemu:dirty-bitmap:"
         "b0," + peer.opts()],
        ["info", "--image-opts", "driver=nbd,path=%s,export=wrong"
         % peer.addr],
        ["convert", "-n", "-O", "raw", str(raw), peer.url],
        ["convert", "-O", "raw", "nbd+unix:///wrong?socket=%s" % peer.addr,
         str(tmp_path / "never.raw")],
        ["convert", "-O", "raw", str(raw),
         "nbd+unix:///wrong?socket=%s" % peer.addr],
        ["convert", "-n", "-O", "raw", str(raw),
         "nbd+unix:///wrong?socket=%s" % peer.addr],
    ]
    for args in cases:
        want, got = run(qemu_img, *args), run(blkimg, *args)
        assert (got.returncode, msg(got)) == (1, msg(want)), args
    assert not os.path.exists(tmp_path / "never.raw")


def start_and_kill(run, tool, args, peer, after=0.5):
    """Runs tool args and kills the server after `after` seconds; returns
    the result (the run must end by itself: no hang)."""
    import subprocess
    p = subprocess.Popen([str(tool)] + [str(a) for a in args],
                         stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    time.sleep(after)
    peer.stop()
    try:
        out, err = p.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        p.kill()
        p.communicate()
        pytest.fail("%s hung after its server died" % tool)
    return p.returncode, out, err


@pytest.mark.parametrize("direction", ["read", "write"])
def test_server_gone_mid_convert(run, blkimg, qemu_img, peers, tmp_path,
                                 direction):
    """The server dies while convert runs (nbdkit slowed by its delay
    filter so that the copy is far from done): convert ends by itself,
    exit 1, qemu-img's error (the first of its lines), and the source is
    untouched."""
    res = {}
    for tool in (qemu_img, blkimg):
        if direction == "read":
            peer = peers.nbdkit("pattern", "256M", "delay-read=1",
                                filters=["delay"])
            out = tmp_path / "out.raw"
            args = ["convert", "-f", "raw", "-O", "raw", peer.url, out]
        else:
            peer = peers.nbdkit("memory", "256M", "delay-write=1",
                                filters=["delay"])
            src = tmp_path / "src.raw"
            if not src.exists():
                with open(src, "wb") as f:
                    f.write(b"\x5a" * (64 * MiB))
            args = ["convert", "-n", "-f", "raw", "-O", "raw", src, peer.url]
        res[tool] = start_and_kill(run, tool, args, peer)
    rc, _, err = res[blkimg]
    qrc, _, qerr = res[qemu_img]
    assert rc == qrc == 1, err
    lines = err.splitlines()
    assert len(lines) == 1, err
    verb = "reading" if direction == "read" else "writing"
    causes = (": Input/output error",  # requests in flight when it died
              ": Cannot send after transport endpoint shutdown")  # later
    for e in (lines[0], qerr.splitlines()[0]):
        assert e.split(": ", 1)[1].startswith("error while %s at byte " % verb)
        assert e.endswith(causes), e
    if direction == "write":
        assert read_bytes(tmp_path / "src.raw") == b"\x5a" * (64 * MiB)
