"""set_digest.py STEP_DIR TENSOR HEX: writes HEX (16 hex digits) as the digest that
the MANIFEST of STEP_DIR records for TENSOR (FORMAT.md 4.4: the TENSORS record's
digest field, its flag set) and re-hashes the MANIFEST's trailer, so that the
MANIFEST stays valid and every frame's checksum holds: only the digest can tell
that the tensor's data is not the one recorded. The tests make with it what a
consistent alteration looks like: another checkpoint's data (its frames hashed
for that data) under the original's digest. Needs libxxhash.so.0 (ctypes).
Prints the digest it replaced."""
import ctypes
import struct
import sys

_xxh = ctypes.CDLL("libxxhash.so.0")
_xxh.XXH3_64bits.restype = ctypes.c_uint64
_xxh.XXH3_64bits.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
TENSORS, STRINGS = 3, 1


def set_digest(step_dir, tensor, value):
    path = step_dir + "/MANIFEST"
    m = bytearray(open(path, "rb").read())
    hsize, = struct.unpack_from("<I", m, 12)
    nsec, = struct.unpack_from("<I", m, 48)
    secs = {}
    for i in range(nsec):
        typ, _, off, size, rec, count = struct.unpack_from("<IIQQII", m, hsize + 32 * i)
        secs[typ] = (off, rec, count)
    if TENSORS not in secs:
        raise SystemExit("set_digest: %s: no plain TENSORS section" % path)
    soff = secs[STRINGS][0]
    off, rec, count = secs[TENSORS]
    if rec < 160:
        raise SystemExit("set_digest: %s: TENSORS records of %d bytes hold no digest (of format 1.4)" % (path, rec))
    for i in range(count):
        r = off + i * rec
        no, nn = struct.unpack_from("<II", m, r)
        if bytes(m[soff + no:soff + no + nn]).decode() == tensor:
            old, = struct.unpack_from("<Q", m, r + 152)
            flags, = struct.unpack_from("<I", m, r + 112)
            struct.pack_into("<Q", m, r + 152, value)
            struct.pack_into("<I", m, r + 112, flags | 4)
            struct.pack_into("<Q", m, len(m) - 8, _xxh.XXH3_64bits(bytes(m[:-8]), len(m) - 8))
            open(path, "wb").write(m)
            return old
    raise SystemExit("set_digest: %s: no tensor %s" % (path, tensor))


if __name__ == "__main__":
    if len(sys.argv) != 4:
        raise SystemExit(__doc__)
    print("%016x" % set_digest(sys.argv[1], sys.argv[2], int(sys.argv[3], 16)))
