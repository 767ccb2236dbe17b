# SPDX-License-Identifier: MIT
"""Serving images: `nbdkit blkimg` (the plugin) and `blkimg-nbd` (qemu-nbd's
command line over it), on Unix sockets in the test's directory, read and
written by the real clients: qemu-img (convert, compare, map against
qemu-nbd 7.2 serving the same image), qemu-io, nbdinfo and nbdcopy. Raw
and qcow2 images with a backing file; writes, zeroes, trims, FUA and
flushes checked on the image afterwards with qemu-img check and compare;
read-only exports, snapshots, TLS with a PSK, and the errors for a
missing image, a bad format and options an nbdkit plugin cannot honour.
Servers are killed by PID when the test ends."""
import json
import os
import shutil
import signal
import subprocess
import time

import pytest

from conftest import sanitizer_report
import nbd_peers
from nbd_peers import Peers

pytestmark = [
    pytest.mark.qemu,
    pytest.mark.skipif(not nbd_peers.have("qemu-nbd", "nbdkit", "nbdinfo",
                                          "nbdcopy"),
                       reason="qemu-nbd / nbdkit / libnbd-bin missing"),
]

MiB = 1 << 20


@pytest.fixture
def plugin(build_dir):
    path = os.path.join(str(build_dir), "nbdkit-blkimg-plugin.so")
    if not os.path.exists(path):
        pytest.fail("%s is not built" % path)
    return path


@pytest.fixture
def blkimg_nbd(build_dir):
    return os.path.join(str(build_dir), "blkimg-nbd")


@pytest.fixture
def peer_env(sanitized):
    """nbdkit is not built with the sanitizers: a sanitized plugin needs
    their runtimes loaded first (and nbdkit's own leaks are not ours)."""
    if not sanitized:
        return None
    libs = []
    for name in ("libasan.so", "libubsan.so"):
        cp = subprocess.run(["cc", "-print-file-name=" + name],
                            capture_output=True, text=True)
        libs.append(cp.stdout.strip())
    return {"LD_PRELOAD": ":".join(libs),
            "ASAN_OPTIONS": "detect_leaks=0:halt_on_error=1:exitcode=86"}


@pytest.fixture
def peers(tmp_path):
    """The servers of one test; a sanitizer report in a server's log (the
    sanitized plugin runs inside nbdkit) fails the test."""
    p = Peers(tmp_path)
    yield p
    p.stop_all()
    for log in sorted(tmp_path.glob("peer*.log")):
        report = sanitizer_report(log.read_bytes())
        assert report is None, "%s: %s" % (log, report)


def ok(cp):
    assert cp.returncode == 0, cp.stdout + cp.stderr
    return cp


@pytest.fixture
def chain(run, qemu_img, qemu_io, tmp_path):
    """A 64 MiB qcow2 over a qcow2 backing file: data in both, zeroes
    over backing data, unallocated space (made by QEMU)."""
    base, top = tmp_path / "base.qcow2", tmp_path / "top.qcow2"
    ok(run(qemu_img, "create", "-q", "-f", "qcow2", base, "64M"))
    ok(run(qemu_io, "-f", "qcow2", "-c", "write -P 0x11 0 4M",
           "-c", "write -P 0x22 20M 2M", "-c", "write -P 0x33 63M 1M", base))
    ok(run(qemu_img, "create", "-q", "-f", "qcow2", "-b", base, "-F",
           "qcow2", top))
    ok(run(qemu_io, "-f", "qcow2", "-c", "write -P 0x44 1M 1M",
           "-c", "write -z 20M 1M", "-c", "write -P 0x55 40M 64k", top))
    return top


@pytest.fixture
def raw_image(tmp_path):
    """A sparse 16 MiB raw image with two data runs."""
    img = tmp_path / "disk.raw"
    with open(img, "wb") as f:
        f.truncate(16 * MiB)
        f.seek(MiB)
        f.write(bytes(range(256)) * 4096)
        f.seek(9 * MiB + 512)
        f.write(b"\xab" * 70000)
    return img


def raw_of(run, qemu_img, img, dst, fmt="qcow2"):
    ok(run(qemu_img, "convert", "-U", "-f", fmt, "-O", "raw", img, dst))
    with open(dst, "rb") as f:
        return f.read()


def nbdinfo_json(run, url):
    cp = ok(run("nbdinfo", "--json", url))
    return json.loads(cp.stdout)["exports"][0]


def test_plugin_serves_raw(run, qemu_img, peers, plugin, peer_env, raw_image,
                           tmp_path):
    p = peers.nbdkit(plugin, "file=%s" % raw_image, "format=raw",
                     env=peer_env)
    assert ok(run("nbdinfo", "--size", p.url)).stdout.strip() == \
        str(16 * MiB)
    ok(run(qemu_img, "compare", "-f", "raw", "-F", "raw", p.url, raw_image))
    out = tmp_path / "copy.raw"
    ok(run("nbdcopy", p.url, out))
    assert out.read_bytes() == raw_image.read_bytes()
    info = nbdinfo_json(run, p.url)
    assert info["can_multi_conn"] and info["can_fua"] and info["can_zero"]
    assert info["can_fast_zero"] and info["can_cache"] and info["can_trim"]
    assert not info["is_read_only"]
    assert info["block_size_minimum"] == 1  # buffered: any size
    assert info["block_size_preferred"] == 4096
    assert info["block_size_maximum"] == 32 * MiB
    assert "base:allocation" in info["contexts"]


def test_plugin_direct_io_block_size(run, peers, plugin, peer_env,
                                     raw_image):
    p = peers.nbdkit(plugin, raw_image, "format=raw", "cache=none",
                     env=peer_env)
    info = nbdinfo_json(run, p.url)
    # the request alignment O_DIRECT needs here (the file system's)
    assert info["block_size_minimum"] in (512, 4096)
    assert info["block_size_preferred"] >= info["block_size_minimum"]


def test_plugin_serves_backing_chain_like_qemu_nbd(run, qemu_img, peers,
                                                   plugin, peer_env, chain,
                                                   tmp_path):
    ours = peers.nbdkit(plugin, chain, "readonly=true", env=peer_env)
    theirs = peers.qemu_nbd(chain, fmt="qcow2", extra=["-r"])
    expect = raw_of(run, qemu_img, chain, tmp_path / "expect.raw")
    # bytes: qemu-img convert from the export, and compare with the source
    out = tmp_path / "out.raw"
    ok(run(qemu_img, "convert", "-f", "raw", "-O", "raw", ours.url, out))
    assert out.read_bytes() == expect
    ok(run(qemu_img, "compare", "-U", "-f", "raw", "-F", "qcow2", ours.url,
           chain))
    # the map a client sees: the same as through qemu-nbd
    maps = [json.loads(ok(run(qemu_img, "map", "--output=json", "-f", "raw",
                              p.url)).stdout) for p in (ours, theirs)]
    assert maps[0] == maps[1]
    assert any(not e["data"] for e in maps[0])
    nmaps = [ok(run("nbdinfo", "--map", p.url)).stdout for p in
             (ours, theirs)]
    assert nmaps[0] == nmaps[1]
    assert "hole,zero" in nmaps[0] and "data" in nmaps[0]
    # nbdcopy over 4 connections (multi-conn)
    out2 = tmp_path / "out2.raw"
    ok(run("nbdcopy", "--connections=4", ours.url, out2))
    assert out2.read_bytes() == expect


def test_blkimg_nbd_serves_qcow2(run, qemu_img, peers, blkimg_nbd, peer_env,
                                 chain, tmp_path):
    p = peers.blkimg_nbd(blkimg_nbd, chain, export="disk",
                         extra=["-f", "qcow2", "-r", "-D", "a test disk",
                                "--aio=threads", "--cache=none"],
                         env=peer_env)
    expect = raw_of(run, qemu_img, chain, tmp_path / "expect.raw")
    out = tmp_path / "out.raw"
    ok(run("nbdcopy", p.url, out))
    assert out.read_bytes() == expect
    info = nbdinfo_json(run, p.url)
    assert info["export-name"] == "disk"
    assert info["description"] == "a test disk"
    assert info["is_read_only"]
    # only the export named by -x is served, as qemu-nbd
    cp = run("nbdinfo", "nbd+unix:///other?socket=%s" % p.addr)
    assert cp.returncode != 0


def write_cmds(unmap):
    return ["write -P 0x66 100k 300k",     # partial clusters
            "write -f -P 0x77 8M 128k",    # FUA
            "write -z 1M 512k",            # zeroes over the top's data
            "write -z %s 21M 1M" % ("-u" if unmap else ""),
            "write -z 22M 64k",            # zeroes over backing data
            "discard 40M 64k",
            "write -P 0x88 63M 4k",
            "flush"]


@pytest.mark.parametrize("tool", ["plugin", "blkimg-nbd"])
def test_writes_through_the_export(run, qemu_img, qemu_io, peers, plugin,
                                   blkimg_nbd, peer_env, chain, tmp_path,
                                   tool):
    expect_raw = tmp_path / "model.raw"
    raw_of(run, qemu_img, chain, expect_raw)
    if tool == "plugin":
        p = peers.nbdkit(plugin, chain, env=peer_env)
    else:
        p = peers.blkimg_nbd(blkimg_nbd, chain,
                             extra=["-f", "qcow2", "--discard=unmap"],
                             env=peer_env)
    args = []
    for c in write_cmds(unmap=True):
        args += ["-c", c]
    ok(run(qemu_io, "-f", "raw", *args, p.url))
    # the same commands on a raw model (discard of data reads as zeroes
    # there, as a discarded qcow2 cluster over no backing data)
    ok(run(qemu_io, "-f", "raw", *args, expect_raw))
    ok(run(qemu_img, "compare", "-U", "-f", "raw", "-F", "raw", p.url,
           expect_raw))
    p.stop()
    ok(run(qemu_img, "check", chain))
    ok(run(qemu_img, "compare", "-f", "qcow2", "-F", "raw", chain,
           expect_raw))
    # the zeroes written over backing data are zero clusters in the top
    m = json.loads(ok(run(qemu_img, "map", "--output=json", chain)).stdout)
    at = [e for e in m if e["start"] <= 22 * MiB < e["start"] + e["length"]]
    assert at and at[0]["zero"] and at[0]["depth"] == 0


def test_read_only_refuses_writes(run, qemu_io, peers, blkimg_nbd, peer_env,
                                  raw_image):
    before = raw_image.read_bytes()
    p = peers.blkimg_nbd(blkimg_nbd, raw_image, extra=["-f", "raw", "-r"],
                         env=peer_env)
    q = peers.qemu_nbd(raw_image, fmt="raw", export="", extra=["-r"])
    res = [run(qemu_io, "-f", "raw", "-c", "write 0 4k", x.url)
           for x in (p, q)]
    assert res[0].returncode == res[1].returncode
    assert res[0].stderr.replace(p.addr, "S") == \
        res[1].stderr.replace(q.addr, "S")
    assert "read-only" in res[0].stderr or "denied" in res[0].stderr
    assert nbdinfo_json(run, p.url)["is_read_only"]
    assert raw_image.read_bytes() == before


def test_discard_ignored_by_default(run, peers, blkimg_nbd, peer_env,
                                    raw_image):
    p = peers.blkimg_nbd(blkimg_nbd, raw_image, extra=["-f", "raw"],
                         env=peer_env)
    assert not nbdinfo_json(run, p.url)["can_trim"]


def test_snapshot_export(run, qemu_img, qemu_io, peers, blkimg_nbd, peer_env,
                         tmp_path):
    img = tmp_path / "snap.qcow2"
    ok(run(qemu_img, "create", "-q", "-f", "qcow2", img, "8M"))
    ok(run(qemu_io, "-f", "qcow2", "-c", "write -P 0x12 0 1M", img))
    ok(run(qemu_img, "snapshot", "-c", "before", img))
    ok(run(qemu_io, "-f", "qcow2", "-c", "write -P 0x34 0 1M", img))
    p = peers.blkimg_nbd(blkimg_nbd, img, extra=["-l", "before"],
                         env=peer_env)
    assert nbdinfo_json(run, p.url)["is_read_only"]
    ok(run(qemu_io, "-r", "-f", "raw", "-c", "read -P 0x12 0 1M", p.url))


def test_missing_image_and_bad_format(run, plugin, blkimg_nbd, peer_env,
                                      tmp_path):
    env = peer_env or {}
    sock = str(tmp_path / "x.sock")
    missing = str(tmp_path / "missing.img")
    cp = run(blkimg_nbd, "-k", sock, missing, env=env)
    ref = run("qemu-nbd", "-k", sock, missing)
    assert cp.returncode == ref.returncode == 1
    assert cp.stderr == ref.stderr.replace("qemu-nbd:", "blkimg-nbd:")
    cp = run(blkimg_nbd, "-k", sock, "-f", "bogus", "/etc/hostname", env=env)
    ref = run("qemu-nbd", "-k", sock, "-f", "bogus", "/etc/hostname")
    assert cp.returncode == ref.returncode == 1
    assert cp.stderr == ref.stderr.replace("qemu-nbd:", "blkimg-nbd:")
    # the plugin itself: one error line, nbdkit exits 1
    for args in ([missing], ["/etc/hostname", "format=bogus"]):
        cp = run("nbdkit", "-f", "-U", sock, plugin, *args, env=env)
        assert cp.returncode == 1
        lines = cp.stderr.strip().splitlines()
        assert len(lines) == 1, cp.stderr
        assert ("No such file or directory" in lines[0] or
                "Unknown driver 'bogus'" in lines[0])


def test_bad_options(run, blkimg_nbd, raw_image):
    cp = run(blkimg_nbd, "--bogus", raw_image)
    ref = run("qemu-nbd", "--bogus", raw_image)
    assert cp.returncode == ref.returncode == 1
    assert cp.stderr == ref.stderr.replace("qemu-nbd", "blkimg-nbd")
    cp = run(blkimg_nbd)
    ref = run("qemu-nbd")
    assert cp.returncode == ref.returncode == 1
    assert cp.stderr == ref.stderr.replace("qemu-nbd", "blkimg-nbd")
    for opt in (["-A"], ["-B", "b0"], ["--allocation-depth"],
                ["--bitmap=b0"]):
        cp = run(blkimg_nbd, *opt, raw_image)
        assert cp.returncode == 1
        assert cp.stderr.count("\n") == 1 and "base:allocation" in cp.stderr
    cp = run(blkimg_nbd, "--detect-zeroes=unmap", raw_image)
    assert cp.returncode == 1 and "discard operation to unmap" in cp.stderr


@pytest.mark.skipif(not nbd_peers.have("psktool"), reason="psktool missing")
def test_tls_psk(run, qemu_img, peers, blkimg_nbd, peer_env, raw_image,
                 tmp_path):
    keys = nbd_peers.make_psk(tmp_path / "psk")
    p = peers.blkimg_nbd(
        blkimg_nbd, raw_image,
        extra=["-f", "raw", "--object",
               "tls-creds-psk,id=tls0,endpoint=server,dir=%s" % keys,
               "--tls-creds", "tls0"], env=peer_env)
    opts = "driver=nbd,%s,tls-creds=tls0" % p.opts()
    ok(run(qemu_img, "compare", "--object",
           "tls-creds-psk,id=tls0,endpoint=client,dir=%s,username=qemu"
           % keys, "--image-opts", opts,
           "driver=raw,file.filename=%s" % raw_image))
    # without TLS the server refuses
    cp = run(qemu_img, "info", "-f", "raw", p.url)
    assert cp.returncode != 0
    cp = run(blkimg_nbd, "--tls-creds", "nope", raw_image)
    assert cp.returncode == 1 and "No TLS credentials with id 'nope'" in \
        cp.stderr


def test_fork_pid_file_and_last_client_exit(run, blkimg_nbd, peer_env,
                                            raw_image, tmp_path):
    """--fork returns once the server listens; without -t the server
    exits when its last client disconnects, as qemu-nbd."""
    sock, pidf = str(tmp_path / "f.sock"), str(tmp_path / "f.pid")
    cp = run(blkimg_nbd, "--fork", "--pid-file", pidf, "-k", sock, "-f",
             "raw", raw_image, env=peer_env or {})
    assert cp.returncode == 0, cp.stderr
    pid = int(open(pidf).read())
    try:
        assert os.path.exists(sock)
        # one client at a time (-e 1): no multi-conn offered, so nbdcopy
        # copies over one connection instead of failing on the second
        out = tmp_path / "out.raw"
        ok(run("nbdcopy", "nbd+unix:///?socket=" + sock, out))
        assert out.read_bytes() == raw_image.read_bytes()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.05)
        else:
            pytest.fail("the server did not exit after its last client")
    finally:
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass


def test_concurrent_writers_many_connections(run, qemu_img, peers, plugin,
                                             peer_env, tmp_path):
    """Four nbdcopy connections writing a qcow2 at once, many requests in
    flight on the one loop thread: the image checks clean and holds the
    bytes."""
    src = tmp_path / "src.raw"
    with open(src, "wb") as f:
        f.write(os.urandom(8 * MiB))
        f.truncate(32 * MiB)
    img = tmp_path / "dst.qcow2"
    ok(run(qemu_img, "create", "-q", "-f", "qcow2", img, "32M"))
    p = peers.nbdkit(plugin, img, env=peer_env)
    ok(run("nbdcopy", "--connections=4", "--requests=16", "--flush", src,
           p.url))
    p.stop()
    ok(run(qemu_img, "check", img))
    ok(run(qemu_img, "compare", "-f", "qcow2", "-F", "raw", img, src))
    assert shutil.which("nbdcopy")


@pytest.mark.parametrize("aio", ["io_uring", "threads"])
def test_sigterm_flushes_the_image(run, qemu_img, qemu_io, peers, plugin,
                                   peer_env, tmp_path, aio):
    """Writes the client never flushed reach the image when the server is
    stopped with SIGTERM (nbdkit's cleanup closes the node), and nbdkit
    exits cleanly after many requests (its dlclose of the plugin must not
    unmap the library under the engine's worker threads)."""
    img = tmp_path / "t.qcow2"
    ok(run(qemu_img, "create", "-q", "-f", "qcow2", img, "16M"))
    p = peers.nbdkit(plugin, img, "aio=" + aio, env=peer_env)
    ok(run(qemu_io, "-f", "raw", "-c", "write -P 0x5a 0 3M",
           "-c", "write -P 0xa5 8M 64k", p.url))
    for _ in range(3):
        ok(run("nbdcopy", "--connections=4", "--request-size=4096",
               p.url, "null:"))
    p.proc.send_signal(signal.SIGTERM)
    assert p.proc.wait(timeout=30) == 0
    ok(run(qemu_img, "check", img))
    ok(run(qemu_io, "-r", "-f", "qcow2", "-c", "read -P 0x5a 0 3M",
           "-c", "read -P 0xa5 8M 64k", "-c", "read -P 0 3M 5M", img))


def test_image_opts_and_format_options(run, qemu_img, peers, plugin,
                                       blkimg_nbd, peer_env, chain,
                                       tmp_path):
    p = peers.blkimg_nbd(
        blkimg_nbd, "driver=qcow2,file.filename=%s,l2-cache-size=1M" % chain,
        extra=["-r", "--image-opts"], env=peer_env)
    ok(run(qemu_img, "compare", "-U", "-f", "raw", "-F", "qcow2", p.url,
           chain))
    sock = str(tmp_path / "bad.sock")
    for args, msg in ((["bogus-key=1"], "'bogus-key' needs format=FMT"),
                      (["format=qcow2", "bogus-key=1"],
                       "the qcow2 format has no option 'bogus-key'")):
        cp = run("nbdkit", "-f", "-U", sock, plugin, chain, *args,
                 env=peer_env or {})
        assert cp.returncode == 1 and msg in cp.stderr, cp.stderr


def test_commands_through_libnbd(run, qemu_img, peers, plugin, peer_env,
                                 chain):
    """Each NBD command with its flags, through libnbd's Python binding:
    FUA writes, zeroes that may trim or must not, fast zero (ENOTSUP where
    it would need a fallback), trim, cache, flush, block status with
    REQ_ONE; then the image checks clean and holds the bytes."""
    nbd = pytest.importorskip("nbd")
    p = peers.nbdkit(plugin, chain, env=peer_env)
    h = nbd.NBD()
    h.add_meta_context(nbd.CONTEXT_BASE_ALLOCATION)
    h.connect_uri(p.url)
    try:
        assert h.can_fua() and h.can_fast_zero() and h.can_cache()
        assert h.can_trim() and h.can_zero() and h.can_flush()
        assert h.can_multi_conn() and not h.is_read_only()
        h.pwrite(b"\x61" * 8192, 3 * MiB, nbd.CMD_FLAG_FUA)
        h.zero(MiB, 20 * MiB)                       # may trim
        h.zero(65536, 4 * MiB, nbd.CMD_FLAG_NO_HOLE)  # must not
        h.zero(2 * 65536, 30 * MiB, nbd.CMD_FLAG_FAST_ZERO)
        with pytest.raises(nbd.Error) as e:
            # half a cluster over backing data: zeroing needs a write
            h.zero(512, 2 * MiB + 512, nbd.CMD_FLAG_FAST_ZERO)
        assert e.value.errno == "ENOTSUP"
        h.trim(65536, 40 * MiB, nbd.CMD_FLAG_FUA)
        h.cache(4 * MiB, 0)
        h.flush()
        seen = []
        h.block_status(64 * MiB, 0,
                       lambda ctx, off, ents, err: seen.append(ents),
                       nbd.CMD_FLAG_REQ_ONE)
        assert len(seen) == 1 and len(seen[0]) == 2  # one (length, flags)
        assert h.pread(8192, 3 * MiB) == b"\x61" * 8192
        assert h.pread(MiB, 20 * MiB) == bytes(MiB)
        assert h.pread(65536, 4 * MiB) == bytes(65536)
        assert h.pread(2 * 65536, 30 * MiB) == bytes(2 * 65536)
        assert h.pread(512, 2 * MiB + 512) == b"\x11" * 512
    finally:
        h.shutdown()
    p.stop()
    ok(run(qemu_img, "check", chain))


@pytest.mark.skipif(not nbd_peers.have("certtool"), reason="certtool missing")
def test_tls_x509_over_tcp(run, qemu_img, peers, blkimg_nbd, peer_env,
                           raw_image, tmp_path):
    """tls-creds-x509 (verify-peer on, QEMU's default): nbdkit's
    --tls-certificates with --tls-verify-peer; qemu-img connects with a
    client certificate of the same CA over TCP."""
    srv, cli = nbd_peers.make_x509(tmp_path / "pki")
    p = peers.blkimg_nbd(
        blkimg_nbd, raw_image, tcp=True,
        extra=["-f", "raw", "--object",
               "tls-creds-x509,id=tls0,endpoint=server,dir=%s" % srv,
               "--tls-creds", "tls0"], env=peer_env)
    opts = "driver=nbd,%s,tls-creds=tls0" % p.opts()
    ok(run(qemu_img, "compare", "--object",
           "tls-creds-x509,id=tls0,endpoint=client,dir=%s" % cli,
           "--image-opts", opts,
           "driver=raw,file.filename=%s" % raw_image))
    cp = run(qemu_img, "info", "-f", "raw", p.url)
    assert cp.returncode != 0


def test_detect_zeroes_unmap(run, qemu_img, qemu_io, peers, blkimg_nbd,
                             peer_env, tmp_path):
    """--detect-zeroes=unmap: a written cluster of zeroes becomes a zero
    cluster (no data allocated), as with qemu-nbd."""
    img = tmp_path / "dz.qcow2"
    ok(run(qemu_img, "create", "-q", "-f", "qcow2", img, "8M"))
    p = peers.blkimg_nbd(blkimg_nbd, img,
                         extra=["-f", "qcow2", "--discard=unmap",
                                "--detect-zeroes=unmap"], env=peer_env)
    ok(run(qemu_io, "-f", "raw", "-c", "write -P 0 0 1M",
           "-c", "write -P 0x9 2M 64k", "-c", "flush", p.url))
    p.stop()
    m = json.loads(ok(run(qemu_img, "map", "--output=json", img)).stdout)
    first = [e for e in m if e["start"] == 0][0]
    assert first["zero"] and not first["data"], m
    at2m = [e for e in m if e["start"] <= 2 * MiB < e["start"] + e["length"]]
    assert at2m[0]["data"], m
