# SPDX-License-Identifier: MIT
"""Generator of damaged qcow2 images (the hostile-image corpus).

cases(base) takes the bytes of a small valid image made by
`qemu-img create -f qcow2 x 1M` and written with
`qemu-io -c 'write -P 1 0 128k' -c 'write -c -P 2 256k 64k'`
(64 KiB clusters: header 0, refcount table 0x10000, refcount block
0x20000, L1 0x30000, L2 0x40000, data from 0x50000) and returns
(name, image bytes, expected error text or None) triples. With expected
text, opening the image must fail with a message containing it ("": any
message); with
None, opening may succeed but reading, mapping and checking must end
cleanly (an error or data, never a crash, a hang or a write).
"""
import struct

L1 = 0x30000
L2 = 0x40000
RT = 0x10000


def _set(img, off, fmt, value):
    b = bytearray(img)
    struct.pack_into(fmt, b, off, value)
    return bytes(b)


def _ext(img, exts):
    """Replaces the header extension area (after a 112-byte header)."""
    b = bytearray(img)
    area = b""
    for typ, data in exts:
        area += struct.pack(">II", typ, len(data)) + data
        area += b"\0" * (-len(data) % 8)
    area += b"\0" * 8  # end of the extension area
    b[112:112 + len(area)] = area
    return bytes(b)


def cases(base):
    c = []
    add = c.append
    add(("bad-magic", _set(base, 0, ">I", 0x514649fc),
         "Image is not in qcow2 format"))
    add(("version-1", _set(base, 4, ">I", 1), "Unsupported qcow2 version 1"))
    add(("version-4", _set(base, 4, ">I", 4), "Unsupported qcow2 version 4"))
    for bits in (0, 8, 22, 63, 0xffffffff):
        add(("cluster-bits-%d" % bits, _set(base, 20, ">I", bits),
             "Unsupported cluster size"))
    add(("header-length-short", _set(base, 100, ">I", 72),
         "qcow2 header too short"))
    add(("header-length-huge", _set(base, 100, ">I", 0x10008),
         "qcow2 header exceeds cluster size"))
    add(("backing-offset-past-cluster",
         _set(_set(base, 8, ">Q", 0x20000), 16, ">I", 4),
         "Invalid backing file offset"))
    add(("backing-name-too-long",
         _set(_set(base, 8, ">Q", 0x1000), 16, ">I", 1024),
         "Backing file name too long"))
    add(("backing-name-past-cluster",
         _set(_set(base, 8, ">Q", 0xff00), 16, ">I", 0x200),
         "Invalid backing file offset"))
    b = bytearray(base)
    name = b'json:{"driver":"nbd","host":"localhost"}'
    b[0x1000:0x1000 + len(name)] = name
    add(("backing-json", _set(_set(bytes(b), 8, ">Q", 0x1000), 16, ">I",
                              len(name)),
         "not a plain local file name"))
    add(("l1-size-huge", _set(base, 36, ">I", 0x7fffffff),
         "Active L1 table too large"))
    add(("l1-size-zero", _set(base, 36, ">I", 0), "L1 table is too small"))
    add(("l1-offset-unaligned", _set(base, 40, ">Q", L1 + 8),
         "Invalid L1 table offset"))
    add(("l1-offset-past-eof", _set(base, 40, ">Q", 1 << 40),
         "Invalid L1 table offset"))
    add(("l1-offset-overflow", _set(base, 40, ">Q", 0xffffffffffff0000),
         "Invalid L1 table offset"))
    add(("reftable-huge", _set(base, 56, ">I", 0x100000),
         "Reference count table too large"))
    add(("reftable-zero", _set(base, 56, ">I", 0),
         "does not contain a reference count table"))
    add(("reftable-unaligned", _set(base, 48, ">Q", RT + 512),
         "Invalid reference count table offset"))
    add(("reftable-past-eof", _set(base, 48, ">Q", 1 << 50),
         "Invalid reference count table offset"))
    add(("snapshots-too-many", _set(base, 60, ">I", 65537),
         "Too many snapshots"))
    add(("snapshots-unaligned",
         _set(_set(base, 60, ">I", 1), 64, ">Q", 0x10001),
         "Invalid snapshot table offset"))
    add(("snapshots-past-eof",
         _set(_set(base, 60, ">I", 1000), 64, ">Q", L2),
         ""))
    add(("refcount-order-7", _set(base, 96, ">I", 7),
         "Reference count entry width too large"))
    add(("incompat-unknown", _set(base, 72, ">Q", 1 << 40),
         "Unsupported qcow2 feature(s): Unknown incompatible feature: "
         "10000000000"))
    add(("incompat-named",
         _ext(_set(base, 72, ">Q", 1 << 9),
              [(0x6803f857, bytes([0, 9]) + b"frobnicated".ljust(46, b"\0"))]),
         "Unsupported qcow2 feature(s): frobnicated"))
    # encrypted: data needs the key secret (QEMU's words)
    no_key = "Parameter 'encrypt.key-secret' is required for cipher"
    add(("crypt-aes", _set(base, 32, ">I", 1), no_key))
    add(("crypt-luks", _set(base, 32, ">I", 2), no_key))
    add(("crypt-unknown", _set(base, 32, ">I", 9),
         "Unsupported encryption method: 9"))
    add(("ext-too-long",
         _set(_ext(base, [(0xe2792aca, b"qcow2")]), 116, ">I", 0x20000),
         "Header extension too large"))
    add(("ext-backing-format-too-long",
         _ext(base, [(0xe2792aca, b"x" * 40)]), "too large"))
    add(("compression-bit-zlib", _set(base, 72, ">Q", 1 << 3),
         "Compression type"))
    add(("compression-type-no-bit", _set(base, 104, ">B", 1),
         "Invalid compression type"))
    add(("compression-type-unknown",
         _set(_set(base, 104, ">B", 7), 72, ">Q", 1 << 3),
         "unknown compression type"))
    add(("extl2-small-clusters",
         _set(_set(base, 72, ">Q", 1 << 4), 20, ">I", 12),
         "Extended L2 entries are only supported"))
    add(("size-huge", _set(base, 24, ">Q", 1 << 63), "too large"))
    add(("size-needs-bigger-l1", _set(base, 24, ">Q", 1 << 40),
         "L1 table is too small"))
    add(("data-file-raw-no-data-file", _set(base, 88, ">Q", 2),
         "data-file-raw requires a data file"))
    add(("data-file-json",
         _ext(_set(base, 72, ">Q", 1 << 2),
              [(0x44415441, b"json:{}")]),
         "not a plain local file name"))
    add(("data-file-missing-name", _set(base, 72, ">Q", 1 << 2),
         "Missing data_file"))
    add(("truncated-header", base[:60], "Image is not in qcow2 format"))

    # table damage: opening works, using the tables must fail cleanly
    add(("l1-entry-unaligned", _set(base, L1, ">Q", (1 << 63) | (L2 + 8)),
         None))
    add(("l1-entry-header", _set(base, L1, ">Q", (1 << 63) | 0), None))
    add(("l1-entry-huge", _set(base, L1, ">Q", (1 << 63) | (1 << 54)), None))
    add(("l2-entry-unaligned", _set(base, L2, ">Q", (1 << 63) | 0x50200),
         None))
    add(("l2-entry-past-eof", _set(base, L2, ">Q", (1 << 63) | (1 << 50)),
         None))
    add(("l2-entry-self", _set(base, L2, ">Q", (1 << 63) | L2), None))
    # the compressed cluster (guest 256k = L2 index 4): garbage descriptor
    add(("compressed-garbage-offset",
         _set(base, L2 + 4 * 8, ">Q", (1 << 62) | (0xff << 54) | 0x123),
         None))
    b = bytearray(base)
    comp = struct.unpack_from(">Q", base, L2 + 4 * 8)[0]
    coff = comp & ((1 << 54) - 1)
    b[coff:coff + 64] = b"\xff" * 64
    add(("compressed-garbage-data", bytes(b), None))
    add(("reftable-entry-unaligned", _set(base, RT, ">Q", 0x20100), None))
    add(("reftable-entry-zero", _set(base, RT, ">Q", 0), None))
    add(("refblock-all-ones",
         base[:0x20000] + b"\xff" * 0x10000 + base[0x30000:], None))
    add(("l2-table-garbage",
         base[:L2] + bytes(range(256)) * 256 + base[L2 + 0x10000:], None))
    return c
