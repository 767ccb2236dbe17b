# SPDX-License-Identifier: MIT
"""blkimg-io against qemu-io 7.2: for each command line, on identical
images, the same stdout (timing numbers masked), the same stderr (with the
program name substituted), the same exit code and the same image bytes."""
import pytest

from test_io_common import Pair, as_blkimg, cmds, mask

pytestmark = pytest.mark.qemu

MIB = 1024 * 1024


@pytest.fixture
def pair(tmp_path, blkimg_io, qemu_io):
    p = Pair(tmp_path, blkimg_io, qemu_io)
    p.create("a.img", MIB)
    return p


# Each entry: (id, -c commands). Run with -f raw on a fresh 1 MiB image.
RAW_SCRIPTS = [
    ("write-read-pattern", [
        "write -P 0xcd 0 512", "read -P 0xcd 0 512", "read -P 0xab 0 512",
        "write -P 7 512 1k", "read -P 7 512 1024", "read -P 0 1536 512"]),
    ("pattern-partial-range", [
        "write -P 1 0 4k", "write -P 2 100 10",
        "read -P 1 -s 0 -l 100 0 4k", "read -P 1 -s 100 -l 10 0 4k",
        "read -P 2 -s 100 -l 10 0 4k", "read -P 1 -s 110 0 4k",
        "read -P 1 -s 600 0 512", "read -P 1 -l 600 0 512",
        "read -l 10 0 512"]),
    ("dump", [
        "write -P 0x41 0 20", "write -P 0x7f 20 13", "write 33 3",
        "read -v 0 40", "read -v 1 1", "readv -v 5 3 4 5",
        "read -v -q 0 16", "read -v -P 0x41 -q 0 16"]),
    ("odd-offsets", [
        "write -P 0x11 1 1", "write -P 0x22 511 2", "write -P 0x33 4095 3",
        "write -P 0x44 12345 6789", "read -P 0x11 1 1", "read -P 0x22 511 2",
        "read -P 0x33 4095 3", "read -P 0x44 12345 6789", "read -v 0 16",
        "read -v 504 16"]),
    ("csv-and-quiet", [
        "write -C 0 512", "read -C 0 512", "write -q -P 3 0 512",
        "read -q -P 3 0 512", "read -q -P 4 0 512", "discard -C 0 4k",
        "discard -q 0 4k"]),
    ("vectors", [
        "writev -P 5 0 1 2 3", "readv -P 5 0 3 3", "writev 1k 512 512 1k",
        "readv -P 0xcd 1k 1k 1k", "readv -P 0xcd 1k 1k 512 513",
        "writev -P 9 7 0 1", "readv -v 0 8 8", "readv 0 0"]),
    ("aio", [
        "aio_write -P 1 0 512", "aio_flush", "aio_write -P 2 512 512 512",
        "aio_flush", "aio_read -P 1 0 512", "aio_flush",
        "aio_read -P 2 0 512", "aio_flush", "aio_read -v 512 16 16",
        "aio_flush", "aio_write -z 0 512", "aio_flush", "aio_read -P 0 0 512",
        "aio_flush", "aio_read -q -P 2 512 1k", "aio_flush",
        "aio_read -C 0 512", "aio_flush"]),
    ("aio-errors", [
        "aio_read 1M 512", "aio_flush", "aio_write 1M 512", "aio_flush",
        "aio_write -z 0 512 512", "aio_write -u 0 512",
        "aio_read -P 300 0 512", "aio_read -i 0 512", "aio_write -i 0 512",
        "aio_read -x 0 1", "aio_read 0", "aio_write 0 x"]),
    ("aio-drained-at-exit", ["aio_write -P 6 0 4k"]),
    ("aio-completes-during-sleep", [
        "aio_write -P 1 0 4k", "sleep 1000", "length",
        "aio_read -P 1 0 4k", "sleep 500", "aio_read -P 2 0 4k",
        "sleep 500", "aio_write 0 1"]),
    ("zeroes-discard", [
        "write -P 9 0 64k", "write -z 4k 4k", "read -P 0 4k 4k",
        "write -z -u 8k 8k", "read -P 0 8k 8k", "discard 16k 4k",
        "read -P 9 0 4k", "write -z 1 3", "read -v 0 8", "write -z -n 0 1k",
        "discard 1 1", "discard 0 0", "write -z 0 0"]),
    ("flag-errors", [
        "write -u 0 4k", "write -n 0 4k", "write -z -P 1 0 4k",
        "write -z -s /etc/hostname 0 1", "write -c 1 4k", "write -c 0 4097",
        "write -f -c 0 512", "write -b -z 0 512", "write -b 1 512",
        "write -c 0 4k", "write -c 1M 512", "write -c 0 0",
        "read -b 0 511", "write -f 0 512", "write -f -q 0 1"]),
    ("eof", [
        "read 1M 512", "read 1048575 2", "read 1M 0", "read 2M 0",
        "write 1M 1", "write 1048575 1", "write -z 1M 1", "write -z 2M 0",
        "discard 1M 512", "discard 0 2M", "readv 1M 512", "writev 1M 512",
        "read 1048064 512"]),
    ("parse-errors", [
        "read x 512", "read 0 1Q", "read 0 -1", "read -1 1", "read 0 3G",
        "write 0 3G", "discard 0 3G", "readv 0 3G", "readv 0 1G 1G 1G",
        "read 0 9223372036854775808", "read 8e 1", "read 0 1.5",
        "read 1.5k 0", "read 0 0x10", "read 0x1k 0", "write -P 300 0 1",
        "write -P abc 0 1", "write -P -1 0 1", "read -P 0x100 0 1",
        "write -P 0x10 0 0x10", "read -P 020 0 16"]),
    ("usage-errors", [
        "bogus", "read", "read 0", "read -x 0 1", "read 0 1 2",
        "write 0", "discard 0", "discard 0 1 2", "length 1", "map x",
        "alloc", "alloc 1 2 3", "truncate", "truncate 1 2 3 4",
        "sleep", "help a b", "readv 0", "aio_flush x", "flush x",
        "info x", "close x", "write -x 0 1", "truncate -m",
        "truncate -x 1"]),
    ("length-map-alloc", [
        "length", "map", "alloc 0", "alloc 0 1M", "alloc 4096 4096",
        "alloc 1M", "alloc 1048064 4096", "alloc 2M 1", "alloc 1 1",
        "alloc 0 0", "alloc x", "alloc 0 x", "l", "a 0"]),
    ("truncate", [
        "truncate 2M", "length", "map", "truncate -m falloc 3M", "length",
        "truncate -m bogus 3M", "truncate x", "truncate -m off 1M",
        "length", "truncate 1M 2M", "length", "truncate 1", "length",
        "truncate 1M", "t 512k", "l"]),
    ("flush-sleep-info", [
        "flush", "f", "sleep 10", "sleep x", "sleep -1", "sleep 0x10",
        "info", "i"]),
    ("sizes", ["alloc %s" % v for v in (
        "0x200", "0X10", "1.5k", "1.5", "0.5k", "1e3", "512b", "512B",
        "1kB", "1.0000001k", "-0", "+512", "0.5", "1k5", "0x", "010", "1K",
        "1g", "1t", "1p", "1e", "8e", "9223372036854775807",
        "9223372036854775808", "18446744073709551616", "1.999k",
        "0.001k", "0.0001k", "1.k", ".5k", "1E", "16E", "7.999E",
        "1000000000000000000000", "0x1.8k", "1.0", "1.00b", "1.5b", "inf",
        "nan", "0x8000000000000000", "1b2", "00x10", "0b1", "1.5e3",
        "1.5m", "1.00001k", "-1", "1kk", "1.5g", "0x1k", "0x1p3")]),
    ("open-close", [
        "close", "length", "close", "open -o driver=raw a.img", "length",
        "open a.img", "close", "o -r -o driver=raw a.img", "write 0 1",
        "read 0 1", "c", "open -o driver=raw,file.filename=a.img",
        "length", "close", "open -t bogus a.img", "open -i bogus a.img",
        "open -d bogus a.img", "open", "open a b", "open -x",
        "open nonexist.img", "open -n -o driver=raw nonexist.img",
        "read 0 1"]),
    ("quit", ["length", "quit", "length"]),
    ("quit-alias", ["q", "length"]),
    ("help-usage", [
        "help flush", "help map", "help quit", "help close", "help length",
        "help bogus", "help truncate", "help alloc", "help info",
        "help aio_flush", "help sleep"]),
]


@pytest.mark.parametrize("script", [s for _, s in RAW_SCRIPTS],
                         ids=[i for i, _ in RAW_SCRIPTS])
def test_raw_script(pair, script):
    pair.compare(["-f", "raw"] + cmds(*script) + ["a.img"], files=["a.img"])


@pytest.mark.parametrize("cache", ["none", "writeback", "writethrough",
                                   "directsync", "unsafe"])
def test_cache_modes(pair, cache):
    script = ["write -P 0x5a 1 1", "write -P 0x5b 4095 2",
              "write -P 0x5c 8191 4098", "read -P 0x5a 1 1",
              "read -P 0x5c 8191 4098", "writev -P 0x5d 3 5 7 9",
              "readv -P 0x5d 3 21", "aio_write -P 0x5e 77 1000",
              "aio_flush", "aio_read -P 0x5e 77 1000", "aio_flush",
              "flush"]
    pair.compare(["-f", "raw", "-t", cache] + cmds(*script) + ["a.img"],
                 files=["a.img"])


def test_misalign(pair):
    pair.compare(["-m", "-t", "none", "-f", "raw"] +
                 cmds("write -P 3 1 4095", "read -P 3 1 4095", "readv -v 0 3 5",
                      "aio_write -P 4 4096 4096", "aio_flush",
                      "aio_read -P 4 4096 4096", "aio_flush") + ["a.img"],
                 files=["a.img"])


def test_nocache_option(pair):
    pair.compare(["-n", "-f", "raw"] +
                 cmds("write -P 3 1 1", "read -v 0 16") + ["a.img"],
                 files=["a.img"])


def test_probed_raw_warning(pair):
    pair.compare(cmds("write -P 1 512 512", "read -P 1 512 512") +
                 ["a.img"], files=["a.img"])


def test_read_only(pair):
    pair.compare(["-r", "-f", "raw"] +
                 cmds("write 0 1", "discard 0 1", "truncate 2M",
                      "write -z 0 1", "aio_write 0 512", "writev 0 1",
                      "read 0 1", "length", "flush", "aio_flush", "map",
                      "info") + ["a.img"], files=["a.img"])


def test_no_file(pair):
    pair.compare(cmds("read 0 512", "length", "map", "help length",
                      "sleep 1", "bogus"))


@pytest.mark.parametrize("args", [
    ["-t", "bogus", "a.img"], ["-i", "bogus", "a.img"],
    ["-d", "bogus", "a.img"], ["--image-opts", "-f", "raw", "a.img"],
    ["-c", "length", "nonexist"],
    ["-f", "bogus", "-c", "length", "a.img"],
    ["-U", "-f", "raw", "-c", "length", "a.img"],
    ["-U", "-r", "-f", "raw", "-c", "length", "a.img"],
    ["-i", "native", "-f", "raw", "-c", "length", "a.img"],
    ["-k", "-f", "raw", "-c", "length", "a.img"],
    ["-k", "-t", "none", "-f", "raw", "-c", "length", "a.img"],
    ["-i", "threads", "-f", "raw", "-c", "write -P 1 0 1",
     "-c", "read -P 1 0 1", "a.img"],
    ["-i", "io_uring", "-f", "raw", "-c", "read -P 0 0 1", "a.img"],
    ["-d", "ignore", "-f", "raw", "-c", "write -P 1 0 4k", "-c",
     "discard 0 4k", "-c", "read -P 1 0 4k", "a.img"],
    ["-d", "unmap", "-f", "raw", "-c", "discard 0 4k", "a.img"],
    ["--cache=writeback", "--format=raw", "--cmd=read 0 1", "a.img"],
    ["-f", "file", "-c", "info", "-c", "map", "-c", "alloc 0 1M", "-c",
     "write -P 3 0 1", "-c", "read -v 0 4", "a.img"],
], ids=lambda a: " ".join(a))
def test_command_line(pair, args):
    pair.compare(args, files=["a.img"])


def test_bad_option_exit_code(pair):
    # Usage texts differ (ours lists our options); the verdict must not.
    for args in (["-x", "a.img"], ["--bogus", "a.img"], ["-c"],
                 ["-f", "raw", "a.img", "a.img"]):
        q, b = pair.run_both(args)
        assert q.returncode == 1 and b.returncode == 1, (args, b.stderr)
        assert b.stdout.startswith("Usage: blkimg-io "), b.stdout
        # getopt names the program by argv[0] (the full path here)
        want = q.stderr.replace(pair.qemu_io, "PROG")
        assert b.stderr.replace(pair.blkimg_io, "PROG") == want, \
            (args, b.stderr, q.stderr)


@pytest.mark.parametrize("opts", [
    "driver=raw,file.filename=a.img",
    "file.filename=a.img",
    "driver=file,filename=a.img",
    "driver=raw,file.driver=file,file.filename=a.img,cache.direct=on,"
    "cache.no-flush=on,file.locking=off",
    "driver=raw,file.filename=a.img,file.aio=io_uring",
    "driver=raw,file.filename=a.img,file.aio=threads",
    "driver=raw,file.filename=a.img,cache.direct=on",
    "driver=raw,file.filename=a.img,cache.no-flush=on",
    "driver=raw,file.filename=a.img,file.locking=auto",
    "driver=raw,file=a.img",
    "driver=raw,file.driver=file,file.filename=a.img,file.bogus=1",
    "driver=raw,file.filename=a.img,read-only=on",
    "driver=raw,file.filename=a.img,cache.direct=x",
    "driver=raw,file.filename=a.img,,x",
    "driver=raw,file.filename=a.img,force-share=on",
    "driver=raw,file.filename=nonexist",
    "driver=raw",
    "driver=raw,file.filename=a.img,file.driver=host_device",
    "a.img",
])
def test_image_opts(pair, opts):
    pair.compare(["--image-opts"] +
                 cmds("length", "write -P 4 1 1", "read -P 4 1 1",
                      "open a.img") + [opts], files=["a.img"])


def test_image_opts_conflicts(pair):
    pair.compare(["--image-opts", "-U"] + cmds("length") +
                 ["driver=raw,file.filename=a.img,force-share=off"])
    pair.compare(["--image-opts"] +
                 cmds("close", "open -o driver=raw a.img",
                      "open driver=raw,file.filename=a.img", "length") +
                 ["driver=raw,file.filename=a.img"])


def test_stdin_commands(pair):
    script = ("write -P 1 0 512\nread -P 1 0 512\n\nbogus\nlength\n"
              "read -P 2 0 512\n   map  \nlength\tx\nhelp quit\n")
    pair.compare(["-f", "raw", "a.img"], stdin=script, files=["a.img"])


def test_stdin_no_trailing_newline(pair):
    pair.compare(["-f", "raw", "a.img"], stdin="write 0 1\nlength")


def test_stdin_quit_and_open(pair):
    pair.compare(["-f", "raw", "a.img"], stdin="length\nquit\nlength\n")
    pair.compare([], stdin="open -o driver=raw a.img\nlength\nclose\n"
                           "length\n")


def test_stdin_ignored_with_commands(pair):
    pair.compare(["-f", "raw", "-c", "length", "a.img"], stdin="map\n")


def test_stdin_aio_completes_while_waiting(pair):
    """A completion arriving while the prompt waits for input is printed
    right away, after the prompt, as qemu-io's main loop does."""
    import subprocess
    import time
    outs = []
    for tool, d in ((pair.qemu_io, pair.q), (pair.blkimg_io, pair.b)):
        p = subprocess.Popen([tool, "-f", "raw", "a.img"], cwd=str(d),
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
        # the first prompt (flushed) says the tool is ready for input
        prompt = "qemu-io> " if tool == pair.qemu_io else "blkimg-io> "
        assert p.stdout.read(len(prompt)) == prompt
        p.stdin.write("aio_write -P 1 0 4k\n")
        p.stdin.flush()
        time.sleep(1.0)
        p.stdin.write("length\n")
        p.stdin.flush()
        time.sleep(0.2)
        out, err = p.communicate("", timeout=60)
        out = prompt + out
        outs.append((mask(as_blkimg(out)), as_blkimg(err), p.returncode))
    assert outs[1] == outs[0]
    assert outs[0][0].startswith("blkimg-io> blkimg-io> wrote 4096/4096")


def test_stdin_aio(pair):
    pair.compare(["-f", "raw", "a.img"],
                 stdin="aio_write -P 8 0 4k\naio_flush\naio_read -P 8 0 4k\n"
                       "aio_flush\n", files=["a.img"])


def test_holes_and_data_map(pair, tmp_path):
    # A raw image with data, a hole, data: allocation as qemu-io sees it.
    data = b"\x01" * 65536 + b"\0" * 65536 + b"\x02" * 4096
    pair.put("h.img", data)
    for d in (pair.q, pair.b):
        with open(d / "h.img", "r+b") as f:
            f.truncate(2 * MIB)
    pair.compare(["-f", "raw"] + cmds("map", "alloc 0 2M", "alloc 64k 64k",
                                      "read -P 0 64k 64k", "length") +
                 ["h.img"], files=["h.img"])


QCOW2_SCRIPTS = [
    ("write-map-info", [
        "write -P 1 64k 64k", "write -z 512k 64k", "write -P 2 1000 100",
        "info", "map", "alloc 0 1M", "alloc 64k", "alloc 100k 1k",
        "read -P 1 64k 64k", "read -P 0 128k 64k", "read -P 2 1000 100",
        "read -P 0 0 1000", "length"]),
    ("compressed", [
        "write -c 0 512", "write -c 0 64k", "write -c 1 64k",
        "write -c 64k 65024", "write -c -P 3 128k 128k",
        "read -P 3 128k 128k", "read -P 0xcd 0 64k",
        "write -c 4032k 64k", "read -P 0xcd 4032k 64k", "write -c 4M 64k",
        "map", "alloc 0 4M"]),
    ("truncate", [
        "write -P 1 0 64k", "truncate 8M", "length", "map",
        "write -P 2 7M 64k", "read -P 2 7M 64k", "truncate 1M", "length",
        "map", "read -P 1 0 64k", "info"]),
    ("discard-zero", [
        "write -P 5 0 256k", "discard 64k 64k", "write -z -u 128k 64k",
        "map", "read -P 0 64k 128k", "read -P 5 0 64k",
        "read -P 5 192k 64k"]),
]


@pytest.mark.parametrize("script", [s for _, s in QCOW2_SCRIPTS],
                         ids=[i for i, _ in QCOW2_SCRIPTS])
def test_qcow2_script(tmp_path, blkimg_io, qemu_io, script):
    p = Pair(tmp_path, blkimg_io, qemu_io)
    p.create("a.qcow2", 4 * MIB, fmt="qcow2")
    p.compare(cmds(*script) + ["a.qcow2"])


def test_qcow2_backing_map(tmp_path, blkimg_io, qemu_io):
    p = Pair(tmp_path, blkimg_io, qemu_io)
    p.create("base.qcow2", 4 * MIB, fmt="qcow2")
    p.compare(cmds("write -P 1 64k 64k") + ["base.qcow2"])
    for d in (p.q, p.b):
        import subprocess
        subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", "-b",
                        "base.qcow2", "-F", "qcow2", "top.qcow2"],
                       cwd=str(d), check=True)
    p.compare(cmds("write -P 2 0 4k", "map", "alloc 0 1M", "alloc 64k",
                   "read -P 1 64k 64k", "read -P 2 0 4k",
                   "read -P 0 4k 60k") + ["top.qcow2"])


def test_qcow2_info_compat010(tmp_path, blkimg_io, qemu_io):
    p = Pair(tmp_path, blkimg_io, qemu_io)
    p.create("c.qcow2", MIB, fmt="qcow2", opts="compat=0.10")
    p.compare(cmds("info") + ["c.qcow2"])


def test_probed_raw_protects_block0(pair):
    # A probed raw image refuses writes making sector 0 look like another
    # format (here a qcow2 header); -f raw lifts the restriction.
    pair.put("qfi.bin", b"QFI\xfb\0\0\0\3")
    pair.compare(cmds("write -s qfi.bin 0 512", "write -s qfi.bin 512 512",
                      "read -v 0 8", "read -v 512 8") + ["a.img"],
                 files=["a.img"])
    pair.compare(["-f", "raw"] + cmds("write -s qfi.bin 0 512",
                                      "read -v 0 8") + ["a.img"],
                 files=["a.img"])


def test_stdin_empty(pair):
    pair.compare([], stdin="")
    pair.compare(["-f", "raw", "a.img"], stdin="\n\n")


def test_stdin_long_line(pair):
    # Lines are read 1023 bytes at a time: a longer one is two commands.
    line = "read -v 0 4" + " " * 1100 + "length"
    pair.compare(["-f", "raw", "a.img"], stdin=line + "\nlength\r\n")


@pytest.mark.parametrize("script", [
    ["write -P 1 0 1", "sigraise 15", "read 0 1"],
    ["write -P 2 0 1", "abort", "read 0 1"],
    ["sigraise 100"], ["sigraise x"],
], ids=["sigterm", "abort", "too-large", "bad"])
def test_signals(pair, script):
    pair.compare(["-f", "raw"] + cmds(*script) + ["a.img"], files=["a.img"])


@pytest.mark.parametrize("opts", [
    "lazy_refcounts=on", "compression_type=zstd", "extended_l2=on",
    "refcount_bits=8,cluster_size=4096", "cluster_size=2M",
    "extended_l2=on,cluster_size=2M", "data_file=d.raw",
    "data_file=d.raw,data_file_raw=on", "compat=0.10,cluster_size=512",
])
def test_qcow2_variants(tmp_path, blkimg_io, qemu_io, opts):
    p = Pair(tmp_path, blkimg_io, qemu_io)
    import shutil
    import subprocess
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", "-o", opts,
                    "a.qcow2", "64M"], cwd=str(p.q), check=True)
    for f in p.q.iterdir():
        shutil.copyfile(f, p.b / f.name)
    p.compare(cmds("write -P 1 0 64k", "write -P 2 1000000 3", "info", "map",
                   "alloc 0 64M", "read -P 1 0 64k", "read -v 999999 5",
                   "length") + ["a.qcow2"])
    for f in p.q.iterdir():
        if f.name.endswith(".raw"):
            assert (p.b / f.name).read_bytes() == f.read_bytes()


@pytest.mark.parametrize("args", [
    ["top.qcow2"], ["dir.img"], ["badver.qcow2"], ["short.qcow2"],
    ["-f", "qcow2", "dir.img"], ["-f", "raw", "-t", "none", "nonexist"],
    ["-f", "raw,x", "ok.qcow2"], ["-f", "qcow2", "top.qcow2"],
    ["-f", "qcow2", "a.img"], ["-r", "-U", "top.qcow2"],
], ids=lambda a: " ".join(a))
def test_open_errors(pair, args):
    import subprocess
    for d in (pair.q, pair.b):
        subprocess.run("qemu-img create -q -f qcow2 base.qcow2 1M && "
                       "qemu-img create -q -f qcow2 -b base.qcow2 -F qcow2 "
                       "top.qcow2 && rm base.qcow2 && mkdir dir.img && "
                       "printf 'QFI\\373\\0\\0\\0\\011' > badver.qcow2 && "
                       "truncate -s 1M badver.qcow2 && "
                       "printf 'QFI\\373' > short.qcow2 && "
                       "qemu-img create -q -f qcow2 ok.qcow2 1M",
                       shell=True, cwd=str(d), check=True)
    pair.compare(args[:-1] + cmds("length", "read 0 1") + args[-1:])


@pytest.mark.parametrize("spec", [
    "--image-opts driver=raw,file.filename=a.img,bogus=1",
    "--image-opts driver=qcow2,file.filename=ok.qcow2,bogus=1",
    "--image-opts driver=qcow2,file.filename=ok.qcow2,l2-cache-size=1M,"
    "lazy-refcounts=on,cache-clean-interval=0,refcount-cache-size=64k",
    "-c|open -o bogus=1 ok.qcow2",
    "-c|open -o l2-cache-size=1M,overlap-check=none ok.qcow2",
], ids=["raw-bogus", "qcow2-bogus", "qcow2-tuning", "probed-bogus",
        "probed-tuning"])
def test_driver_options(pair, spec):
    import subprocess
    for d in (pair.q, pair.b):
        subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", "ok.qcow2",
                        "1M"], cwd=str(d), check=True)
    if spec.startswith("--image-opts "):
        args = ["--image-opts"] + cmds("length", "write -P 1 0 1") + \
            [spec.split(" ", 1)[1]]
    else:
        args = ["-c", spec.split("|", 1)[1]] + cmds("length")
    pair.compare(args, files=["a.img", "ok.qcow2"] if "qcow2" not in spec
                 else ["a.img"])


def test_raw_window(pair):
    """qemu's raw offset/size window: the write lands inside it, as in
    qemu-io (tests/interop/test_raw_window.py has the rest)."""
    pair.compare(["--image-opts", "-c", "write -P 1 0 1k", "-c",
                  "write -P 2 1k 1", "-c", "read -P 1 0 1k",
                  "driver=raw,file.filename=a.img,offset=512,size=1024"],
                 files=["a.img"])


def test_merged_streams(pair):
    """With stdout and stderr on one pipe (2>&1), lines interleave as in
    qemu-io: same buffering of stdout, unbuffered stderr."""
    import subprocess
    script = cmds("read x 1", "bogus", "read -x 0 1", "length",
                  "truncate -m bogus 1", "map x", "help length",
                  "write -P 1 0 1", "read 1M 1")
    outs = []
    for tool, d in ((pair.qemu_io, pair.q), (pair.blkimg_io, pair.b)):
        cp = subprocess.run([tool, "-f", "raw"] + script + ["a.img"],
                            cwd=str(d), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True,
                            stdin=subprocess.DEVNULL)
        outs.append((mask(as_blkimg(cp.stdout)), cp.returncode))
    assert outs[1] == outs[0]


@pytest.mark.parametrize("args", [
    ["-s", "-f", "raw"] + cmds("write -P 1 0 512", "read -P 1 0 512", "info",
                               "map", "alloc 0 1M", "length",
                               "truncate 2M", "length"),
    ["-s"] + cmds("write -P 7 0 1", "read -P 7 0 1", "read -P 0 1 511"),
    ["-s", "-r", "-f", "raw"] + cmds("write 0 1", "read -P 0 0 1"),
    ["-s", "-t", "none", "-f", "raw"] + cmds("write -P 2 1 1",
                                             "read -v 0 4"),
    cmds("open -s -o driver=raw a.img", "write 0 1", "map", "close",
         "open -o driver=raw a.img", "read -P 0 0 1"),
], ids=["raw", "probed", "read-only", "nocache", "open-s"])
def test_snapshot_mode(pair, tmp_path, args):
    """-s: writes go to a temporary overlay; the image stays as it was and
    the overlay leaves nothing behind."""
    tmpdir = tmp_path / "tmpdir"
    tmpdir.mkdir()
    before = (pair.b / "a.img").read_bytes()
    pair.compare(args + ["a.img"] if "open -s" not in " ".join(args)
                 else args, files=["a.img"], env={"TMPDIR": str(tmpdir)})
    assert (pair.b / "a.img").read_bytes() == before
    assert list(tmpdir.iterdir()) == []


def test_snapshot_qcow2(tmp_path, blkimg_io, qemu_io):
    p = Pair(tmp_path, blkimg_io, qemu_io)
    p.create("a.qcow2", MIB, fmt="qcow2")
    p.compare(cmds("write -P 3 0 64k") + ["a.qcow2"])
    p.compare(["-s"] + cmds("write -P 7 0 4k", "map", "read -P 7 0 4k",
                            "read -P 3 4k 60k", "info") + ["a.qcow2"],
              files=["a.qcow2"])
    p.compare(cmds("read -P 3 0 64k", "map") + ["a.qcow2"])


def test_drop_in_as_qemu_io(pair, tmp_path):
    """Installed under the name qemu-io (a symlink), blkimg-io names itself
    so: prompt and messages are byte for byte qemu-io's."""
    import os
    link = tmp_path / "bin" / "qemu-io"
    link.parent.mkdir()
    os.symlink(pair.blkimg_io, link)
    alias = Pair.__new__(Pair)
    alias.q, alias.b = pair.q, pair.b
    alias.qemu_io, alias.blkimg_io = pair.qemu_io, "qemu-io"
    env = {"PATH": "%s:%s" % (link.parent, os.environ.get("PATH", ""))}
    script = "write -P 1 0 512\nread -P 2 0 512\nbogus\nread 2M 1\nopen x\n"
    q, b = alias.run_both(["-f", "raw", "a.img"], stdin=script, env=env)
    assert (mask(b.stdout), b.stderr, b.returncode) == \
        (mask(q.stdout), q.stderr, q.returncode)
    assert b.stdout.startswith("qemu-io> wrote 512/512 bytes at offset 0\n")


def _map_json(path):
    import json
    import subprocess
    cp = subprocess.run(["qemu-img", "map", "--output=json", str(path)],
                        capture_output=True, text=True, check=True)
    out = json.loads(cp.stdout)
    for e in out:
        e.pop("offset", None)  # host placement may differ
    return out


@pytest.mark.parametrize("script", [
    ["-C"] + cmds("read -P 1 70k 1k", "map", "read 1M 10k", "map",
                  "read -P 1 100k 100k", "map", "aio_read 2M 1", "aio_flush",
                  "readv 3M 512 512", "map", "read 4M 1", "read 4194303 1",
                  "map"),
    cmds("open -C top.qcow2", "read -P 0 0 64k", "read -v 65535 2", "map"),
    ["-C", "-r"] + cmds("read 0 1"),
    ["-C", "-t", "none"] + cmds("read -P 1 64k 100k", "map", "info"),
], ids=["reads", "open-C", "read-only", "nocache"])
def test_copy_on_read(tmp_path, blkimg_io, qemu_io, script):
    import subprocess
    p = Pair(tmp_path, blkimg_io, qemu_io)
    for d in (p.q, p.b):
        subprocess.run("qemu-img create -q -f qcow2 base.qcow2 4M && "
                       "qemu-io -c 'write -P 1 64k 100k' base.qcow2 && "
                       "qemu-img create -q -f qcow2 -b base.qcow2 -F qcow2 "
                       "top.qcow2", shell=True, cwd=str(d), check=True,
                       capture_output=True)
    args = script if "open -C top.qcow2" in script else script + ["top.qcow2"]
    p.compare(args, files=["base.qcow2"])
    assert _map_json(p.b / "top.qcow2") == _map_json(p.q / "top.qcow2")
    cmp = subprocess.run(["qemu-img", "compare", str(p.q / "top.qcow2"),
                          str(p.b / "top.qcow2")], capture_output=True)
    assert cmp.returncode == 0


def test_copy_on_read_without_backing(pair):
    pair.compare(["-C", "-f", "raw"] + cmds("read 0 4k", "map") + ["a.img"],
                 files=["a.img"])
