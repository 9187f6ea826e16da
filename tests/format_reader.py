#!/usr/bin/python3
"""format_reader.py: a reader of tessera checkpoints written from formats/FORMAT.md
alone (no tessera code), as the proof that the spec is complete.

    format_reader.py STEP_DIR [EXPECTED] [--trainer] [--layout]
    format_reader.py --vectors FORMAT.md

Reads STEP_DIR's MANIFEST and data files, checks the rules of FORMAT.md sections
4 and 5 it can (hashes, sizes, orders, coverage, packing, zero padding), decodes
every frame (raw, zstd through the system's libzstd, bytegroup), assembles every
tensor and blob, and with EXPECTED (formats/testdata/expected.txt, section 12)
compares each file's size and XXH3, the step, the layout, every tensor's
metadata and elements and every blob's bytes. With --trainer, checks the
checkpoint against section 11 (the six train.* blobs, the model's tensors and
their placements, as the table gives them from train.model). With --layout,
computes the boxes of every rank of the checkpoint's layout by section 10 and
checks that they tile every tensor and are its chunks, each in the data file
of a rank that holds it (as `tessera reshard` writes). Every tensor whose record
holds a digest (section 4.4, v1.4) has it recomputed from its elements and
compared, and every tensor whose record holds statistics (section 4.5, v1.3)
has them recomputed (min, max and the non-finite count exactly, the L2 norm
within a relative 1e-9), and the header's poisoned bit checked against them.
A step directory whose folder holds a FENCE (section 4.6) is refused when a
fenced writer committed it after its fence.
With --vectors, computes the digests of section 4.4's test vectors and the
statistics of section 4.5's, read from the tables in FORMAT.md, and compares them
(and the digests' keys) with the tables'.
Prints one line per problem and
exits 1 if there was any; exits 77 (SKIP) when numpy, libxxhash or libzstd is
missing. Needs: numpy; libxxhash.so.0 and libzstd.so.1 via ctypes (and
libisal.so.2 where present, for the CRC-64 of large tensors; else byte at a
time in Python).
"""
import ctypes
import os
import re
import struct
import sys

try:
    import numpy as np
except ImportError:
    print("SKIP: format_reader.py needs numpy (Debian's python3-numpy)")
    sys.exit(77)
try:
    _xxh = ctypes.CDLL("libxxhash.so.0")
    _zstd = ctypes.CDLL("libzstd.so.1")
except OSError as e:
    print("SKIP: format_reader.py needs libxxhash.so.0 and libzstd.so.1: %s" % e)
    sys.exit(77)
_xxh.XXH3_64bits.restype = ctypes.c_uint64
_xxh.XXH3_64bits.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
_xxh.XXH3_64bits_withSeed.restype = ctypes.c_uint64
_xxh.XXH3_64bits_withSeed.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_uint64]
_zstd.ZSTD_getFrameContentSize.restype = ctypes.c_ulonglong
_zstd.ZSTD_getFrameContentSize.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
_zstd.ZSTD_findFrameCompressedSize.restype = ctypes.c_size_t
_zstd.ZSTD_findFrameCompressedSize.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
_zstd.ZSTD_decompress.restype = ctypes.c_size_t
_zstd.ZSTD_decompress.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_size_t]
_zstd.ZSTD_isError.restype = ctypes.c_uint
_zstd.ZSTD_isError.argtypes = [ctypes.c_size_t]


class Refused(Exception):
    pass


def xxh3(b):
    return _xxh.XXH3_64bits(bytes(b), len(b))


def xxh3_seed(b, seed):
    return _xxh.XXH3_64bits_withSeed(bytes(b), len(b), seed)


# ------------------------------------------------------------------- section 4.4
CRC_POLY = 0xC96C5795D7870F42  # ECMA-182's polynomial 0x42F0E1EBA9EA3693, bits reflected


def _crc_table():
    t = []
    for b in range(256):
        c = b
        for _ in range(8):
            c = (c >> 1) ^ CRC_POLY if c & 1 else c >> 1
        t.append(c)
    return t


_CRC_TABLE = _crc_table()


def crc64_bytes(b, crc=0):
    """Section 4.4's CRC-64 (reflected, initial value 0, no final xor) of the
    bytes b, a byte at a time; from crc, the CRC of bytes before them."""
    t = _CRC_TABLE
    for x in bytes(b):
        crc = t[(crc ^ x) & 0xFF] ^ (crc >> 8)
    return crc


try:  # the same CRC from ISA-L (its functions invert the CRC on entry and exit), for large tensors
    _isal = ctypes.CDLL("libisal.so.2")
    _isal.crc64_ecma_refl.restype = ctypes.c_uint64
    _isal.crc64_ecma_refl.argtypes = [ctypes.c_uint64, ctypes.c_char_p, ctypes.c_uint64]
except OSError:
    _isal = None


def crc64(b):
    b = bytes(b)
    if _isal is None or len(b) < 4096:
        return crc64_bytes(b)
    return ~_isal.crc64_ecma_refl(~0 & 0xFFFFFFFFFFFFFFFF, b, len(b)) & 0xFFFFFFFFFFFFFFFF


def digest_key(name, code):
    """XXH3 of the name with the dtype code as seed."""
    return xxh3_seed(name.encode(), code)


def digest(name, code, elems):
    """The digest of a tensor whose elements, row-major, are the numpy array elems
    (any shape, its stored dtype): the key xor the CRC of its bytes, each element
    little-endian."""
    flat = np.ascontiguousarray(elems).reshape(-1)
    return digest_key(name, code) ^ crc64(flat.astype(flat.dtype.newbyteorder("<")).tobytes())


def check_vectors(path):
    """The test vectors of section 4.4, from FORMAT.md's table: | `name` | dtype
    (code) | (shape) | elements ... | `key` | `digest` |."""
    import re
    problems, n = [], 0
    text = open(path).read()
    table = text[text.index("### 4.4"):text.index("## 5.")]
    for row in table.splitlines():
        m = re.match(r"\| `([^`]+)` \| (\w+) \((\d+)\) \| \(([\d, ]*)\) \| ([^|]*) \| `([0-9a-f]{16})` \| `([0-9a-f]{16})` \|",
                     row)
        if not m:
            continue
        name, dname, code, shape, elems, key, want = m.groups()
        code = int(code)
        shape = tuple(int(s) for s in shape.split(",") if s.strip())
        words = [w for w in re.split(r"[ ,]+", elems.split("(")[0].strip()) if w and w != "none"]
        values = np.array([float(w) for w in words] if DTYPES[code][0] in ("f32", "f64") else
                          [int(w) for w in words] if DTYPES[code][0] != "bf16" else [], dtype=DTYPES[code][2])
        if DTYPES[code][0] == "bf16":  # no numpy bf16: the bits given in the row
            values = np.array([int(b, 16) for b in re.findall(r"`0x([0-9A-Fa-f]+)`", elems)], dtype="<u2")
        values = values.reshape(shape)
        n += 1
        if digest_key(name, code) != int(key, 16):
            problems.append("vector %s: key %016x, FORMAT.md says %s" % (name, digest_key(name, code), key))
        got = digest(name, code, values)
        if got != int(want, 16):
            problems.append("vector %s: digest %016x, FORMAT.md says %s" % (name, got, want))
    if n < 3:
        problems.append("%s: only %d test vectors found in section 4.4" % (path, n))
    # the CRC's own check values: of "123456789" as defined, and as CRC-64/XZ
    m = re.search(r"the CRC of\s+the 9 ASCII bytes `123456789` is `([0-9a-f]{16})`.*?check value,\s+`([0-9a-f]{16})`",
                  table, re.S)
    ones = (1 << 64) - 1
    if not m:
        problems.append("%s: section 4.4 gives no CRC check values" % path)
    elif crc64_bytes(b"123456789") != int(m.group(1), 16) or crc64_bytes(b"123456789", ones) ^ ones != int(m.group(2), 16):
        problems.append("CRC of 123456789: %016x (as CRC-64/XZ %016x), FORMAT.md says %s (%s)" %
                        (crc64_bytes(b"123456789"), crc64_bytes(b"123456789", ones) ^ ones, m.group(1), m.group(2)))
    elif _isal is not None and crc64(bytes(range(256)) * 64) != crc64_bytes(bytes(range(256)) * 64):
        problems.append("ISA-L's CRC-64 differs from the one computed here a byte at a time")
    return problems, n


# ------------------------------------------------------------------- section 4.5
STAT_CODES = (1, 2, 3, 4, 5, 6)  # the floating dtypes


def fp8_values(code):
    """The 256 values of f8e4m3 (code 5: bias 7, no infinity, S.1111.111 NaN) or
    f8e5m2 (code 6: bias 15, IEEE-like), by section 2's OCP rules."""
    ebits, mbits, bias = (4, 3, 7) if code == 5 else (5, 2, 15)
    out = []
    for b in range(256):
        sign = -1.0 if b & 0x80 else 1.0
        e, m = (b >> mbits) & ((1 << ebits) - 1), b & ((1 << mbits) - 1)
        if code == 5 and e == 15 and m == 7:
            v = float("nan")
        elif code == 6 and e == 31:
            v = float("inf") if m == 0 else float("nan")
        elif e == 0:
            v = m / (1 << mbits) * 2.0 ** (1 - bias)
        else:
            v = (1 + m / (1 << mbits)) * 2.0 ** (e - bias)
        out.append(sign * v)
    return np.array(out, dtype=np.float64)


def as_f64(code, elems):
    """The exact values of a floating tensor's elements (its stored dtype) as binary64."""
    flat = np.ascontiguousarray(elems).reshape(-1)
    if code == 3:  # bf16: the high half of an f32
        return (flat.astype(np.uint32) << np.uint32(16)).view("<f4").astype(np.float64)
    if code in (5, 6):
        return fp8_values(code)[flat.astype(np.int64)]
    return flat.astype(np.float64)


def stats(code, elems):
    """(min, max, l2, nonfinite) of section 4.5, or None for a dtype without them."""
    if code not in STAT_CODES:
        return None
    v = as_f64(code, elems)
    fin = v[np.isfinite(v)]
    lo = float(fin.min()) + 0.0 if len(fin) else float("inf")  # + 0.0: a zero is +0
    hi = float(fin.max()) + 0.0 if len(fin) else float("-inf")
    return lo, hi, float(np.sqrt(np.sum(fin * fin))), int(len(v) - len(fin))


def stats_problem(what, got, want):
    """A message if the statistics `got` (recomputed) are not `want` (recorded), else None."""
    import math
    same = lambda a, b: a == b and math.copysign(1, a) == math.copysign(1, b)
    l2_ok = got[2] == want[2] or abs(got[2] - want[2]) <= 1e-9 * max(abs(got[2]), abs(want[2]))
    if not (same(got[0], want[0]) and same(got[1], want[1]) and l2_ok and got[3] == want[3]):
        return "%s: statistics (min, max, l2, nonfinite) %r from its elements, recorded %r" % (what, got, want)
    return None


def check_stat_vectors(text):
    """The test vectors of section 4.5: | `name` | dtype | (shape) | elements (`bits`) |
    min | max | l2 | nonfinite |."""
    import re
    problems, n = [], 0
    table = text[text.index("### 4.5"):text.index("## 5.")]
    codes = {v[0]: k for k, v in DTYPES.items()}
    num = lambda w: float(w.split()[0].replace("+inf", "inf"))
    for row in table.splitlines():
        m = re.match(r"\| `([^`]+)` \| (\w+) \| \(([\d, ]*)\) \| [^|`]*\(((?:`[0-9A-F ]+`[ a-z]*)+)\) \| "
                     r"([^|]+) \| ([^|]+) \| ([^|]+) \| (\d+) \|", row)
        if not m:
            continue
        name, dname, shape, bits, lo, hi, l2, nf = m.groups()
        code, n = codes[dname], n + 1
        words = " ".join(re.findall(r"`([0-9A-F ]+)`", bits)).split()
        if "twice" in bits:
            words = words * 2
        elems = np.array([int(w, 16) for w in words], dtype=np.uint64)
        size = DTYPES[code][1]
        raw = b"".join(int(w).to_bytes(size, "little") for w in elems)
        values = np.frombuffer(raw, dtype=DTYPES[code][2])
        want = (num(lo), num(hi), num(l2), int(nf))
        p = stats_problem("vector " + name, stats(code, values), want)
        if p:
            problems.append(p)
    if n < 4:
        problems.append("only %d statistics test vectors found in section 4.5" % n)
    return problems, n


def zstd_frame(b, n):
    """One zstd frame that declares content size n, with nothing after it (section 6)."""
    b = bytes(b)
    if _zstd.ZSTD_getFrameContentSize(b, len(b)) != n:
        raise Refused("zstd frame does not declare %d bytes" % n)
    if _zstd.ZSTD_findFrameCompressedSize(b, len(b)) != len(b):
        raise Refused("bytes after the zstd frame")
    out = ctypes.create_string_buffer(max(n, 1))
    r = _zstd.ZSTD_decompress(out, n, b, len(b))
    if _zstd.ZSTD_isError(r) or r != n:
        raise Refused("zstd frame does not decode to %d bytes" % n)
    return out.raw[:n]


# section 2: code -> (name, bytes, numpy dtype)
DTYPES = {1: ("f32", 4, "<f4"), 2: ("f16", 2, "<f2"), 3: ("bf16", 2, "<u2"), 4: ("f64", 8, "<f8"),
          5: ("f8e4m3", 1, "u1"), 6: ("f8e5m2", 1, "u1"), 7: ("i8", 1, "i1"), 8: ("i16", 2, "<i2"),
          9: ("i32", 4, "<i4"), 10: ("i64", 8, "<i8"), 11: ("u8", 1, "u1"), 12: ("u16", 2, "<u2"),
          13: ("u32", 4, "<u4"), 14: ("u64", 8, "<u8"), 15: ("bool", 1, "u1")}
PLANE_DTYPES = (1, 2, 3)
RECORD_SIZES = {1: 1, 2: 16, 3: 104, 4: 160, 5: 48, 6: 32}
NAME_CHARS = set(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.:+-")
MAX_FRAME_RAW = 256 << 20


def bytegroup(b, dtype, raw_size):
    """Section 6: b planes, each with an 8-byte header, back to elements."""
    es = DTYPES[dtype][1]
    if raw_size % es:
        raise Refused("bytegroup raw size not a whole number of elements")
    n = raw_size // es
    if len(b) < 8 * es:
        raise Refused("bytegroup: no room for the plane headers")
    planes, pos = [], 8 * es
    for p in range(es):
        method, r0, r1, r2, slen = struct.unpack_from("<BBBBI", b, 8 * p)
        if (r0, r1, r2) != (0, 0, 0) or pos + slen > len(b):
            raise Refused("bytegroup plane %d header" % p)
        payload = bytes(b[pos:pos + slen])
        pos += slen
        if method == 0:
            if slen != n:
                raise Refused("bytegroup plane %d: %d bytes, not %d" % (p, slen, n))
            plane = payload
        elif method == 1:
            plane = zstd_frame(payload, n)
        else:
            raise Refused("bytegroup plane %d: method %d" % (p, method))
        planes.append(np.frombuffer(plane, dtype=np.uint8).astype(np.uint32))
    if pos != len(b):
        raise Refused("bytegroup: %d bytes after the planes" % (len(b) - pos))
    if dtype == 1:
        p0, p1, p2, p3 = planes
        x = ((p1 & 0x80) << 24) | (p0 << 23) | ((p1 & 0x7F) << 16) | (p2 << 8) | p3
        return x.astype("<u4").tobytes()
    p0, p1 = planes
    if dtype == 3:
        x = ((p1 & 0x80) << 8) | (p0 << 7) | (p1 & 0x7F)
    else:
        x = (p0 << 8) | p1
    return x.astype("<u2").tobytes()


def check_name(b, what):
    if not 1 <= len(b) <= 255 or any(c not in NAME_CHARS for c in b) or b"" in b.split(b"."):
        raise Refused("%s: bad name %r" % (what, b))
    return b.decode()


def frame_boxes(offset, extent, split_dim, rows):
    """Section 3: the frames of a chunk, in order, as (offset, extent) sub-boxes."""
    ndim = len(extent)
    if ndim == 0:
        return [((), ())]
    s = split_dim
    out = []
    for idx in np.ndindex(*extent[:s]) if s else [()]:
        for j in range((extent[s] + rows - 1) // rows):
            off = list(idx) + [j * rows] + [0] * (ndim - s - 1)
            ext = [1] * s + [min(rows, extent[s] - j * rows)] + list(extent[s + 1:])
            out.append((tuple(o + offset[d] for d, o in enumerate(off)), tuple(ext)))
    return out


def volume(ext):
    v = 1
    for e in ext:
        v *= e
    return v


def parse_fence(b):
    """The records (epoch, step or None) of a FENCE's bytes (section 4.6)."""
    lines = b.split(b"\n")
    if len(b) > 1 << 20 or lines[0] != b"tessera-fence 1" or lines[-1] != b"" or len(lines) < 3:
        raise Refused("FENCE: not a FENCE")
    recs = []
    for ln in lines[1:-1]:
        w = ln.split(b" ")
        num = lambda x: x.isdigit() and (x == b"0" or not x.startswith(b"0")) and int(x) < 1 << 64
        if len(w) != 4 or w[0] != b"epoch" or w[2] != b"step" or not num(w[1]) or int(w[1]) == 0 or \
                not (w[3] == b"none" or num(w[3])):
            raise Refused("FENCE: bad line %r" % ln)
        e, s = int(w[1]), None if w[3] == b"none" else int(w[3])
        if recs and e <= recs[-1][0]:
            raise Refused("FENCE: epochs do not grow")
        recs.append((e, s))
    return recs


def check_fence(d, epoch, step):
    """Section 4.6: a step directory (step-N) of a folder with a FENCE is not a
    valid commit when a fence of a newer epoch recorded an older newest step."""
    name = os.path.basename(os.path.normpath(d))
    if not (name.startswith("step-") and name[5:].isdigit() and 8 <= len(name) - 5 <= 20):
        return
    path = os.path.join(os.path.dirname(os.path.normpath(d)) or ".", "FENCE")
    if not os.path.exists(path):
        return
    for e, s in parse_fence(open(path, "rb").read()):
        if e > epoch and (s is None or step > s):
            raise Refused("fenced: step %d of epoch %d, committed after the fence of epoch %d (newest step %s)" %
                          (step, epoch, e, "none" if s is None else s))


class Checkpoint:
    def __init__(self, d):
        self.dir = d
        m = open(os.path.join(d, "MANIFEST"), "rb").read()
        self.parse_manifest(m)
        check_fence(d, self.epoch, self.step)
        self.read_files()

    # ---------------------------------------------------------------- section 4
    def parse_manifest(self, m):
        if len(m) < 136 or len(m) > 4 << 30:
            raise Refused("MANIFEST: %d bytes" % len(m))
        if m[:8] != b"TSRMNFST":
            raise Refused("MANIFEST: bad magic")
        vmaj, vmin, hsize, fsize, step = struct.unpack_from("<HHIQQ", m, 8)
        if fsize != len(m) or struct.unpack_from("<Q", m, len(m) - 8)[0] != xxh3(m[:-8]):
            raise Refused("MANIFEST: size or trailer hash")
        if vmaj != 1 or hsize < 128 or hsize > len(m):
            raise Refused("MANIFEST: version %d or header size %d" % (vmaj, hsize))
        self.step, self.version = step, (vmaj, vmin)
        self.save_id = m[32:48]
        nsec, flags = struct.unpack_from("<II", m, 48)
        self.poisoned = bool(flags & 1)  # section 4.5 (v1.3); other bits ignored
        self.epoch = struct.unpack_from("<Q", m, 88)[0]  # section 4.6 (v1.5); reserved zero before
        pp, dpr, dps, tp, nl, lflags = struct.unpack_from("<6I", m, 64)
        if 0 in (pp, dpr, dps, tp) or pp * dpr * dps * tp > 1 << 31 or nl > 1 << 31:
            raise Refused("MANIFEST: layout")
        self.layout = dict(pp=pp, dp_replicate=dpr, dp_shard=dps, tp=tp, n_layers=nl, flat=lflags & 1)
        if hsize + 32 * nsec > len(m) - 8:
            raise Refused("MANIFEST: section table")
        secs, spans = {}, []
        for i in range(nsec):
            typ, sflags, off, size, rec, count = struct.unpack_from("<IIQQII", m, hsize + 32 * i)
            packed = 16 + 2 <= typ <= 16 + 6  # section 4.3: FILES to BLOBS packed
            if off % 8 or off < hsize + 32 * nsec or off + size > len(m) - 8 or (size != rec * count and not packed):
                raise Refused("MANIFEST: section %d placement" % typ)
            spans.append((off, off + size))
            base = typ - 16 if packed else typ
            if base in RECORD_SIZES:
                if base in secs or rec < RECORD_SIZES[base]:
                    raise Refused("MANIFEST: section %d repeated or records too small" % typ)
                if packed and rec * count > 4 << 30:
                    raise Refused("MANIFEST: packed section %d over 4 GiB" % typ)
                secs[base] = (m[off:off + size], rec, count, packed)
            elif sflags & 1:
                raise Refused("MANIFEST: unknown required section %d" % typ)
        spans.sort()
        if any(a[1] > b[0] for a, b in zip(spans, spans[1:])):
            raise Refused("MANIFEST: sections overlap")
        if set(secs) != set(RECORD_SIZES):
            raise Refused("MANIFEST: sections missing")

        strings = secs[1][0]
        ssize = len(strings)

        def string(o, n, what):
            if o + n > ssize:
                raise Refused("%s: string out of bounds" % what)
            return check_name(bytes(strings[o:o + n]), what)

        def records(typ):
            """The records of section typ; a packed one's decoded only now, once the
            records read before it have justified its count (its size costs nothing to
            declare: 4 GiB of records pack into 130 KB)."""
            data, rec, count, packed = secs[typ]
            if packed:
                shuffled = np.frombuffer(zstd_frame(bytes(data), rec * count), dtype=np.uint8)
                blocks = []  # blocks of 65536 records: byte j of record b + i at b * rec + j * n + i
                for b in range(0, count, 65536):
                    n = min(65536, count - b)
                    blocks.append(shuffled[b * rec:(b + n) * rec].reshape(rec, n).T.tobytes())
                data = b"".join(blocks)
            return [data[i * rec:(i + 1) * rec] for i in range(count)]

        self.files = {}
        last = -1
        for r in records(2):
            fid, res, size = struct.unpack_from("<IIQ", r)
            if fid <= last or size < 4096 or size % 4096 or size > 1 << 62:
                raise Refused("FILES: file %d" % fid)
            last = fid
            self.files[fid] = size

        self.tensors, next_chunk = [], 0
        for i, r in enumerate(records(3)):
            no, nn, go, gn, dtype, ndim, tp_dim, fsdp, pp_role = struct.unpack_from("<IIIIBBbBB", r)
            layer, cfirst, ccount = struct.unpack_from("<iII", r, 24)
            shape = struct.unpack_from("<8Q", r, 40)
            name = string(no, nn, "tensor %d" % i)
            if dtype not in DTYPES or ndim > 8 or any(shape[ndim:]):
                raise Refused("tensor %s: dtype or shape" % name)
            if not (-1 <= tp_dim < ndim) or fsdp > 1 or pp_role > 3 or \
                    (pp_role == 3) != (layer != -1) or (pp_role == 3 and not 0 <= layer < nl):
                raise Refused("tensor %s: placement" % name)
            if cfirst != next_chunk or (self.tensors and self.tensors[-1]["name"].encode() >= name.encode()):
                raise Refused("tensor %s: order or chunk range" % name)
            if ccount > volume(shape[:ndim]):  # its chunks are disjoint, none empty
                raise Refused("tensor %s: %d chunks for %d elements" % (name, ccount, volume(shape[:ndim])))
            next_chunk += ccount
            dg = None  # section 4.4: in records of 160 bytes or more, with bit 2 of its flags
            if len(r) >= 160 and struct.unpack_from("<I", r, 112)[0] & 4:
                dg = struct.unpack_from("<Q", r, 152)[0]
            st = None  # section 4.5: in records of 152 bytes or more, with bit 1, of a floating dtype
            if len(r) >= 152 and struct.unpack_from("<I", r, 112)[0] & 2 and dtype in STAT_CODES:
                st = struct.unpack_from("<dddQ", r, 120)
                if st[3] > volume(shape[:ndim]):
                    raise Refused("tensor %s: %d non-finite elements, over its volume" % (name, st[3]))
                if st[3] and not self.poisoned:
                    raise Refused("tensor %s: non-finite elements, the header not poisoned" % name)
            self.tensors.append(dict(name=name, group=string(go, gn, "group of " + name), dtype=dtype,
                                     shape=tuple(shape[:ndim]), tp_dim=tp_dim, fsdp=fsdp, pp_role=pp_role,
                                     layer=layer, chunks=range(cfirst, cfirst + ccount), digest=dg, stats=st))
        if next_chunk != secs[4][2]:
            raise Refused("CHUNKS: %d records, the tensors' chunk ranges cover %d" % (secs[4][2], next_chunk))
        chunk_recs, blob_recs = records(4), records(6)
        nframes = sum(struct.unpack_from("<I", r, 12)[0] for r in chunk_recs) + \
            sum(struct.unpack_from("<I", r, 20)[0] for r in blob_recs)
        if nframes != secs[5][2]:
            raise Refused("FRAMES: %d records, the chunks and blobs have %d frames" % (secs[5][2], nframes))

        fr = []
        for r in records(5):
            off, stored, raw, rh, sh, codec = struct.unpack_from("<5QB", r)
            fr.append(dict(offset=off, stored=stored, raw=raw, raw_hash=rh, stored_hash=sh, codec=codec))
        self.frames, next_frame = fr, 0
        self.chunks = []
        for i, r in enumerate(chunk_recs):
            ti, fid, ffirst, fcount, sd = struct.unpack_from("<IIIIB", r)
            rows = struct.unpack_from("<Q", r, 24)[0]
            off, ext = struct.unpack_from("<8Q", r, 32), struct.unpack_from("<8Q", r, 96)
            if ti >= len(self.tensors) or i not in self.tensors[ti]["chunks"] or fid not in self.files:
                raise Refused("chunk %d: tensor or file" % i)
            t = self.tensors[ti]
            nd = len(t["shape"])
            off, ext = off[:nd], ext[:nd]
            if any(struct.unpack_from("<8Q", r, 32)[nd:]) or any(struct.unpack_from("<8Q", r, 96)[nd:]) or \
                    any(o + e > s for o, e, s in zip(off, ext, t["shape"])) or volume(ext) == 0:
                raise Refused("chunk %d of %s: box" % (i, t["name"]))
            if nd == 0:
                if sd != 0 or rows != 1:
                    raise Refused("chunk %d: split" % i)
            elif sd >= nd or not 1 <= rows <= ext[sd]:
                raise Refused("chunk %d: split" % i)
            boxes = frame_boxes(off, ext, sd, rows)
            if ffirst != next_frame or fcount != len(boxes):
                raise Refused("chunk %d of %s: frames" % (i, t["name"]))
            es = DTYPES[t["dtype"]][1]
            for k, (_, fe) in enumerate(boxes):
                f = fr[ffirst + k]
                f["file"] = fid
                if f["raw"] != volume(fe) * es:
                    raise Refused("chunk %d frame %d: raw size" % (i, k))
                if f["codec"] == 2 and t["dtype"] not in PLANE_DTYPES:
                    raise Refused("chunk %d frame %d: bytegroup for %s" % (i, k, DTYPES[t["dtype"]][0]))
                f["dtype"] = t["dtype"]
            next_frame += fcount
            self.chunks.append(dict(tensor=ti, file=fid, offset=off, extent=ext, frames=boxes, first=ffirst))
        for t in self.tensors:  # sorted by offset; together every element exactly once
            cs = [self.chunks[c] for c in t["chunks"]]
            if [c["offset"] for c in cs] != sorted(c["offset"] for c in cs):
                raise Refused("tensor %s: chunks out of order" % t["name"])
            cover = np.zeros(t["shape"], dtype=np.int32)
            for c in cs:
                cover[tuple(slice(o, o + e) for o, e in zip(c["offset"], c["extent"]))] += 1
            if not np.all(cover == 1):
                raise Refused("tensor %s: chunks overlap or leave a gap" % t["name"])

        self.blobs, last = [], None
        for r in blob_recs:
            no, nn, rank, fid, ffirst, fcount, size = struct.unpack_from("<IIiIIIQ", r)
            name = string(no, nn, "blob")
            key = (name.encode(), rank)
            if rank < -1 or fid not in self.files or (last is not None and key <= last) or ffirst != next_frame:
                raise Refused("blob %s rank %d" % (name, rank))
            last = key
            fs = fr[ffirst:ffirst + fcount]
            if len(fs) != fcount or sum(f["raw"] for f in fs) != size or any(f["codec"] > 1 for f in fs):
                raise Refused("blob %s: frames" % name)
            for f in fs:
                f["file"], f["dtype"] = fid, 11
            next_frame += fcount
            self.blobs.append(dict(name=name, rank=rank, size=size, first=ffirst, count=fcount))
        if next_frame != len(fr):
            raise Refused("FRAMES not covered by chunks and blobs")
        for f in fr:
            if f["codec"] > 2 or not 1 <= f["raw"] <= MAX_FRAME_RAW or \
                    not 1 <= f["stored"] <= f["raw"] + f["raw"] // 128 + 4096 or \
                    (f["codec"] == 0 and f["stored"] != f["raw"]) or f["offset"] < 4096 or f["offset"] % 4096 or \
                    f["offset"] + f["stored"] > self.files[f["file"]]:
                raise Refused("frame at %d of file %d" % (f["offset"], f["file"]))

    # ---------------------------------------------------------------- section 5
    def read_files(self):
        self.data = {}
        for fid, size in self.files.items():
            path = os.path.join(self.dir, "data-%05d.tsd" % fid)
            b = open(path, "rb").read()
            if len(b) != size:
                raise Refused("%s: %d bytes, FILES says %d" % (path, len(b), size))
            magic, vmaj, vmin, hid = struct.unpack_from("<8sHHI", b)
            if magic != b"TSRDATA1" or vmaj != 1 or hid != fid or b[16:32] != self.save_id or \
                    struct.unpack_from("<Q", b, 32)[0] != xxh3(b[:32]):
                raise Refused("%s: header" % path)
            mask = np.ones(len(b), dtype=bool)  # bytes that must be zero
            mask[:40] = False
            end = 4096
            for f in sorted((f for f in self.frames if f["file"] == fid), key=lambda f: f["offset"]):
                if f["offset"] != end:
                    raise Refused("%s: frames not packed at %d" % (path, f["offset"]))
                mask[f["offset"]:f["offset"] + f["stored"]] = False
                end = (f["offset"] + f["stored"] + 4095) // 4096 * 4096
            if end != len(b) or np.frombuffer(b, dtype=np.uint8)[mask].any():
                raise Refused("%s: size or a nonzero padding byte" % path)
            self.data[fid] = b

    def frame(self, i):
        f = self.frames[i]
        s = self.data[f["file"]][f["offset"]:f["offset"] + f["stored"]]
        if xxh3(s) != f["stored_hash"]:
            raise Refused("frame %d: stored hash" % i)
        raw = s if f["codec"] == 0 else zstd_frame(s, f["raw"]) if f["codec"] == 1 else \
            bytegroup(s, f["dtype"], f["raw"])
        if len(raw) != f["raw"] or xxh3(raw) != f["raw_hash"]:
            raise Refused("frame %d: raw size or hash" % i)
        return raw

    def tensor(self, ti):
        t = self.tensors[ti]
        out = np.zeros(t["shape"], dtype=DTYPES[t["dtype"]][2])
        for c in t["chunks"]:
            ch = self.chunks[c]
            for k, (off, ext) in enumerate(ch["frames"]):
                a = np.frombuffer(self.frame(ch["first"] + k), dtype=out.dtype).reshape(ext)
                out[tuple(slice(o, o + e) for o, e in zip(off, ext))] = a
        return out

    def blob(self, bi):
        b = self.blobs[bi]
        return b"".join(self.frame(b["first"] + k) for k in range(b["count"]))


# ------------------------------------------------------------------- expected.txt

def compare(ck, expected):
    words = []
    for line in open(expected):
        words += line.split("#", 1)[0].split()
    problems = []
    names = {t["name"]: i for i, t in enumerate(ck.tensors)}
    blobs = {(b["name"], b["rank"]): i for i, b in enumerate(ck.blobs)}
    seen_t, seen_b, seen_f = set(), set(), set()
    i = 0
    while i < len(words):
        kw = words[i]
        if kw == "file":
            name, size, h = words[i + 1], int(words[i + 2]), int(words[i + 3], 16)
            b = open(os.path.join(ck.dir, name), "rb").read()
            if len(b) != size or xxh3(b) != h:
                problems.append("%s: %d bytes, XXH3 %016x; expected %d, %016x" % (name, len(b), xxh3(b), size, h))
            seen_f.add(name)
            i += 4
        elif kw == "step":
            if ck.step != int(words[i + 1]):
                problems.append("step %d, expected %s" % (ck.step, words[i + 1]))
            i += 2
        elif kw == "layout":
            want = dict(w.split("=") for w in words[i + 1:i + 7])
            if {k: str(v) for k, v in ck.layout.items()} != want:
                problems.append("layout %s, expected %s" % (ck.layout, want))
            i += 7
        elif kw == "tensor":
            name, group, dt, shape, tp, fsdp, pp, layer = words[i + 1:i + 9]
            shp = () if shape == "-" else tuple(int(x) for x in shape.split("x"))
            n = volume(shp)
            vals = words[i + 9:i + 9 + n]
            i += 9 + n
            seen_t.add(name)
            if name not in names:
                problems.append("no tensor %s" % name)
                continue
            t = ck.tensors[names[name]]
            meta = (t["group"], DTYPES[t["dtype"]][0], t["shape"], t["tp_dim"], t["fsdp"], t["pp_role"], t["layer"])
            if meta != (group, dt, shp, int(tp), int(fsdp), int(pp), int(layer)):
                problems.append("tensor %s: %s, expected %s" % (name, meta, words[i - 8 - n:i - n]))
                continue
            got = ck.tensor(names[name]).reshape(-1)
            if dt == "bf16":
                want = (np.array([float(v) for v in vals], dtype="<f4").view("<u4") >> 16).astype("<u2")
                back = (want.astype("<u4") << 16).view("<f4")
                if not np.array_equal(back, np.array([float(v) for v in vals], dtype="<f4")):
                    problems.append("expected.txt: %s holds values that are not bf16" % name)
            elif dt in ("f32", "f16", "f64"):
                want = np.array([float(v) for v in vals], dtype=got.dtype)
            else:
                want = np.array([int(v) for v in vals], dtype=got.dtype)
            if got.tobytes() != want.tobytes():
                k = int(np.nonzero(got.view(np.uint8) != want.view(np.uint8))[0][0]) // got.itemsize
                problems.append("tensor %s element %d: %r, expected %s" % (name, k, got[k], vals[k]))
        elif kw == "blob":
            name, rank, size = words[i + 1], int(words[i + 2]), int(words[i + 3])
            i += 4
            hexs = ""
            while len(hexs) < 2 * size:
                hexs += words[i]
                i += 1
            seen_b.add((name, rank))
            if (name, rank) not in blobs:
                problems.append("no blob %s rank %d" % (name, rank))
            elif ck.blob(blobs[(name, rank)]) != bytes.fromhex(hexs):
                problems.append("blob %s rank %d differs" % (name, rank))
        else:
            problems.append("expected.txt: unknown word %r" % kw)
            break
    if seen_t != set(names) or seen_b != set(blobs):
        problems.append("tensors %s and blobs %s, expected.txt lists %s and %s" %
                        (sorted(names), sorted(blobs), sorted(seen_t), sorted(seen_b)))
    listed = set(["MANIFEST"] + ["data-%05d.tsd" % f for f in ck.files])
    if seen_f != listed:
        problems.append("files %s, expected.txt lists %s" % (sorted(listed), sorted(seen_f)))
    return problems


# ------------------------------------------------------------------- section 10

def cut(n, k, i):
    c = -(-n // k)
    return (i * c, min((i + 1) * c, n)) if i * c < n else (n, n)


def range_boxes(off, ext, b, e):
    """The row-major range [b, e) of the box (off, ext) as boxes, by section 10's steps."""
    n = len(ext)
    if n == 0:
        return [((), ())] if b < e else []
    st = [volume(ext[d + 1:]) for d in range(n)]
    out = []

    def rec(d, fixed, b, e):
        s = st[d]

        def emit(lo, hi):
            out.append((tuple(off[k] + fixed[k] for k in range(d)) + (off[d] + lo,) + tuple(off[d + 1:]),
                        (1,) * d + (hi - lo,) + tuple(ext[d + 1:])))
        if b % s == 0 and e % s == 0:
            emit(b // s, e // s)
        elif b // s == (e - 1) // s:
            i = b // s
            rec(d + 1, fixed + [i], b - i * s, e - i * s)
        else:
            if b % s:
                rec(d + 1, fixed + [b // s], b % s, s)
            if -(-b // s) < e // s:
                emit(-(-b // s), e // s)
            if e % s:
                rec(d + 1, fixed + [e // s], 0, e % s)
    if b < e:
        rec(0, [], b, e)
    return out


def rank_boxes(lay, tensors, r):
    """Section 10: the boxes (tensor index, offset, extent) rank r holds."""
    P, R, S, T, N = lay["pp"], lay["dp_replicate"], lay["dp_shard"], lay["tp"], lay["n_layers"]
    t_, ds, p = r % T, (r // T) % S, r // (T * S * R)

    def holds(t):
        role = t["pp_role"]
        return role == 0 or (role == 1 and p == 0) or (role == 2 and p == P - 1) or \
            (role == 3 and (P == 1 or t["layer"] // -(-N // P) == p))

    def tp_local(t):
        off, ext = [0] * len(t["shape"]), list(t["shape"])
        k = t["tp_dim"]
        if k >= 0:
            lo, hi = cut(ext[k], T, t_)
            off[k], ext[k] = lo, hi - lo
        return off, ext
    out = []
    if lay["flat"]:
        buffers = {}
        for i, t in enumerate(tensors):
            if holds(t):
                cls = (1 if t["pp_role"] == 0 else 0) + (2 if t["tp_dim"] == -1 else 0)
                buffers.setdefault((t["group"], cls), []).append(i)
        for members in buffers.values():
            members.sort(key=lambda i: tensors[i]["name"].encode())
            F = sum(volume(tp_local(tensors[i])[1]) for i in members)
            lo, hi = cut(F, S, ds)
            Fj = 0
            for i in members:
                off, ext = tp_local(tensors[i])
                v = volume(ext)
                for box in range_boxes(off, ext, max(lo, Fj) - Fj, min(hi, Fj + v) - Fj):
                    out.append((i,) + box)
                Fj += v
        return out
    for i, t in enumerate(tensors):
        if not holds(t):
            continue
        off, ext = tp_local(t)
        if t["fsdp"] and not ext:
            if ds != 0:
                continue
        elif t["fsdp"]:
            lo, hi = cut(ext[0], S, ds)
            off[0], ext[0] = off[0] + lo, hi - lo
        if volume(ext) > 0:
            out.append((i, tuple(off), tuple(ext)))
    return out


def check_layout(ck):
    """A checkpoint that tessera reshard wrote for its layout holds exactly the
    distinct boxes of the layout, each in the data file of a rank that holds it."""
    lay, problems = ck.layout, []
    holders = {}
    for r in range(lay["pp"] * lay["dp_replicate"] * lay["dp_shard"] * lay["tp"]):
        for i, off, ext in rank_boxes(lay, ck.tensors, r):
            holders.setdefault((i, off, ext), set()).add(r)
    for ti, t in enumerate(ck.tensors):
        boxes = [k for k in holders if k[0] == ti]
        cover = np.zeros(t["shape"], dtype=np.int32)
        for _, off, ext in boxes:
            cover[tuple(slice(o, o + e) for o, e in zip(off, ext))] += 1
        if not np.all(cover == 1):
            problems.append("tensor %s: the layout's distinct boxes do not tile it" % t["name"])
        chunks = sorted((tuple(c["offset"]), tuple(c["extent"]), c["file"]) for c in ck.chunks if c["tensor"] == ti)
        if sorted(k[1:] for k in boxes) != [c[:2] for c in chunks]:
            problems.append("tensor %s: chunks %s, the layout's boxes %s" % (t["name"], [c[:2] for c in chunks],
                                                                          sorted(k[1:] for k in boxes)))
            continue
        for off, ext, f in chunks:
            if f not in holders[(ti, off, ext)]:
                problems.append("tensor %s: chunk %s %s in file %d, held by ranks %s" %
                                (t["name"], off, ext, f, sorted(holders[(ti, off, ext)])))
    return problems


# ------------------------------------------------------------------- section 11

MODEL_KEYS = ["flavor", "dim", "n_layers", "n_heads", "n_kv_heads", "ffn_dim", "vocab_size", "norm_eps",
              "rope_theta", "rope_factor", "rope_low", "rope_high", "rope_orig", "max_seq_len"]
LAYER = [("attention_norm.weight", "C", -1), ("attention.wq.weight", "QC", 0), ("attention.wk.weight", "KC", 0),
         ("attention.wv.weight", "KC", 0), ("attention.wo.weight", "CQ", 1), ("ffn_norm.weight", "C", -1),
         ("feed_forward.w1.weight", "FC", 0), ("feed_forward.w2.weight", "CF", 1),
         ("feed_forward.w3.weight", "FC", 0)]


def check_trainer(ck):
    """A training checkpoint against section 11: its six blobs and its tensors."""
    problems = []
    blobs = {b["name"]: ck.blob(i) for i, b in enumerate(ck.blobs) if b["rank"] == -1}
    names = ["train.step", "train.data_pos", "train.rng", "train.model", "train.config", "train.lr_scheduler"]
    missing = [n for n in names if n not in blobs]
    if missing:
        return ["no blob %s" % ", ".join(missing)]
    step = blobs["train.step"]
    if len(step) != 8 or struct.unpack("<Q", step)[0] != ck.step:
        problems.append("train.step %r, the header's step %d" % (step, ck.step))
    pos, rng = blobs["train.data_pos"], blobs["train.rng"]
    if len(pos) != 24 or len(rng) != 8:
        problems.append("train.data_pos of %d bytes, train.rng of %d" % (len(pos), len(rng)))
    else:
        epoch, sample, seed = struct.unpack("<3Q", pos)
        if seed != struct.unpack("<Q", rng)[0]:
            problems.append("train.data_pos seed %d, train.rng %d" % (seed, struct.unpack("<Q", rng)[0]))
        if "\nseed = %d\n" % seed not in blobs["train.config"].decode("utf-8"):
            problems.append("train.config has no 'seed = %d'" % seed)
    text = blobs["train.model"].decode("ascii")
    words = text.split(" ")
    if len(text) >= 4096 or "\n" in text or [w.split("=")[0] for w in words] != MODEL_KEYS:
        return problems + ["train.model %r: not the keys %s" % (text, MODEL_KEYS)]
    a = {w.split("=")[0]: w.split("=")[1] for w in words}
    sched = blobs["train.lr_scheduler"].decode("ascii").split(" ")
    origins = [w.partition("=")[::2] for w in sched[2:]]
    nums = {"opt_origin": r"-?[0-9]+", "lr_origin": r"-?[0-9]+", "next_lr": r"[-+.0-9e]+"}
    if (len(sched) not in (2, 4, 5) or sched[0] != "last_step=%d" % ck.step or not sched[1].startswith("last_lr=")
            or [k for k, _ in origins] not in ([], ["opt_origin", "lr_origin"], ["opt_origin", "lr_origin", "next_lr"])
            or not all(re.fullmatch(nums[k], v) for k, v in origins)):
        problems.append("train.lr_scheduler %r" % blobs["train.lr_scheduler"])
    C, L, NH, NKV, F, V = (int(a[k]) for k in ["dim", "n_layers", "n_heads", "n_kv_heads", "ffn_dim", "vocab_size"])
    hd = C // NH
    size = {"C": C, "Q": NH * hd, "K": NKV * hd, "F": F, "V": V}
    want = {"tok_embeddings.weight": ((V, C), -1, 1, -1), "norm.weight": ((C,), -1, 2, -1),
            "output.weight": ((V, C), 0, 2, -1)}
    for layer in range(L):
        for name, shape, tp in LAYER:
            want["layers.%d.%s" % (layer, name)] = (tuple(size[c] for c in shape), tp, 3, layer)
    model_only = not any(t["group"] == "optim" for t in ck.tensors)  # ROOT/model-step-N: f32 or bf16
    for n in [] if model_only else list(want):
        for m in ("exp_avg", "exp_avg_sq"):
            want["optim.%s.%s" % (m, n)] = want[n]
    got = {}
    for t in ck.tensors:
        group = "optim" if t["name"].startswith("optim.") else "model"
        if t["group"] != group or t["dtype"] not in ((1, 3) if model_only else (1,)) or t["fsdp"] != 1:
            problems.append("tensor %s: group %s, dtype %d, fsdp %d" % (t["name"], t["group"], t["dtype"], t["fsdp"]))
        got[t["name"]] = (t["shape"], t["tp_dim"], t["pp_role"], t["layer"])
    if got != want:
        diff = sorted(set(got.items()) ^ set(want.items()))[:4]
        problems.append("tensors differ from section 11's table: %s" % diff)
    if ck.layout["n_layers"] != L:
        problems.append("layout n_layers %d, model %d" % (ck.layout["n_layers"], L))
    return problems


def main():
    if sys.argv[1:2] == ["--vectors"] and len(sys.argv) == 3:
        problems, n = check_vectors(sys.argv[2])
        sp, ns = check_stat_vectors(open(sys.argv[2]).read())
        for p in problems + sp:
            print("FAIL: " + p)
        if problems + sp:
            sys.exit(1)
        print("%s: the digests of its %d test vectors (section 4.4) and the statistics of its %d (4.5) as "
              "computed here" % (sys.argv[2], n, ns))
        return
    args = [a for a in sys.argv[1:] if a not in ("--trainer", "--layout")]
    if len(args) not in (1, 2):
        sys.exit(__doc__)
    digests = n_stats = 0
    try:
        ck = Checkpoint(args[0])
        problems = []
        for i, t in enumerate(ck.tensors):
            elems = ck.tensor(i)
            if t["digest"] is not None:
                digests += 1
                got = digest(t["name"], t["dtype"], elems)
                if got != t["digest"]:
                    problems.append("tensor %s: digest %016x from its elements, the MANIFEST's %016x" %
                                    (t["name"], got, t["digest"]))
            if t["stats"] is not None:
                n_stats += 1
                p = stats_problem("tensor " + t["name"], stats(t["dtype"], elems), tuple(t["stats"]))
                if p:
                    problems.append(p)
        for i in range(len(ck.blobs)):
            ck.blob(i)
        problems += compare(ck, args[1]) if len(args) == 2 else []
        if "--trainer" in sys.argv:
            problems += check_trainer(ck)
        if "--layout" in sys.argv:
            problems += check_layout(ck)
    except Refused as e:
        problems = ["%s: refused: %s" % (args[0], e)]
    for p in problems:
        print("FAIL: " + p)
    if problems:
        sys.exit(1)
    print("%s: %d tensors (%d digests checked, %d statistics%s), %d blobs, %d frames read%s" %
          (args[0], len(ck.tensors), digests, n_stats, ", poisoned" if ck.poisoned else "", len(ck.blobs),
           len(ck.frames), ", as expected" if len(args) == 2 else ""))


if __name__ == "__main__":
    main()
