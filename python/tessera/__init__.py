"""tessera checkpoints from Python, over libtessera's core library through ctypes.

    ck = tessera.open("runs/small/checkpoint")      # a step directory, or a root: its newest step
    ck.tensors["layers.0.attention.wq.weight"]      # shape, dtype, group, placement
    w = ck.read("layers.0.attention.wq.weight")     # a NumPy array (bf16: uint16 unless bf16="float32")
                                                    # held to the tensor's MANIFEST digest (FORMAT.md 4.4)
    part = ck.read(name, offset=(0, 64), extent=(128, 64), torch=True)   # a torch.Tensor
    ck.blobs, ck.blob("train.step"), ck.verify()
    tessera.latest("runs/small/checkpoint")         # (step, its directory): the newest committed, or None
    tessera.save("out/step-00000001", {"w": array}, step=1, blobs={"note": b"..."})

Local paths and s3://bucket/prefix both work (S3 credentials as for the command).
Every error is a tessera.Error carrying the library's message, which names the
file, tensor or request and the reason.

A read of a whole tensor whose MANIFEST records its digest (FORMAT.md 4.4: every
checkpoint of format 1.4 on) is held to it (the library's tsr_ckpt_read_whole:
the digest of the elements that land, taken frame by frame while they are in
cache, in place of the frames' checksums), and raises Error naming the tensor
and both values when they differ: the elements are the tensor that was saved,
each in its place, from the file through the decoder. tessera.open(path,
check_digests=False), or read(..., check_digest=False), reads with the frames'
checksums only; a read of part of a tensor cannot be held to the digest.

The library is the core, libtessera-core.so.0: the checkpoint reader and writer
over local files, without MPI, BLAS or libcurl; an s3:// location is read and
written through libtessera-core-s3.so.0, the core with the S3 store (libcurl),
loaded the first time one is named. Each is looked for where make install put
it beside this package (PREFIX/lib), then in the source tree's build/release,
then on the loader's path; in each place the full libtessera.so.0 stands in for
a core that is not there. $TESSERA_LIB names a library file to load instead,
for everything, or a folder to look in instead of those places.
"""

import ctypes
import os
from collections import namedtuple

import numpy as np

__all__ = ["open", "latest", "save", "Checkpoint", "Tensor", "Error", "library"]

MAX_DIMS = 8
ERROR_MSG = 1024


class Error(Exception):
    """A failure of libtessera: .code is its status (negative), str() its message."""

    def __init__(self, code, msg):
        super().__init__(msg)
        self.code = code


# Each structure names the C struct it mirrors (_c_name_): tests/abi_layout.py
# compares their sizes and field offsets.
class _Err(ctypes.Structure):
    _c_name_ = "tsr_error"
    _fields_ = [("code", ctypes.c_int), ("msg", ctypes.c_char * ERROR_MSG)]


class _Box(ctypes.Structure):
    _c_name_ = "tsr_box"
    _fields_ = [("ndim", ctypes.c_uint32), ("offset", ctypes.c_uint64 * MAX_DIMS),
                ("extent", ctypes.c_uint64 * MAX_DIMS)]


class _ReadReq(ctypes.Structure):
    _c_name_ = "tsr_read_req"
    _fields_ = [("tensor", ctypes.c_size_t), ("box", _Box), ("dst", ctypes.c_void_p), ("blob", ctypes.c_int)]


class _WriteOpts(ctypes.Structure):
    _c_name_ = "tsr_write_opts"
    _fields_ = [("codec", ctypes.c_int), ("level", ctypes.c_int), ("frame_bytes", ctypes.c_size_t),
                ("threads", ctypes.c_int), ("expected_bytes", ctypes.c_uint64), ("spare_dir", ctypes.c_char_p),
                ("encode_share", ctypes.c_double), ("no_digests", ctypes.c_int), ("epoch", ctypes.c_uint64),
                ("id_stride", ctypes.c_uint32)]


# checkpoint.codec's names (tsr_formats.h's TSR_CODEC_*)
CODECS = {"auto": -1, "raw": 0, "zstd": 1, "bytegroup": 2}


def _codec(codec, who="tessera"):
    """The TSR_CODEC_* of a name of CODECS; Error naming it otherwise."""
    if codec not in CODECS:
        raise Error(-1, "%s: codec %r: not one of %s" % (who, codec, ", ".join(CODECS)))
    return CODECS[codec]


def _write_opts(lib, codec):
    """lib's default write options with codec (a name of CODECS)."""
    o = lib.tsr_write_opts_default()
    o.codec = _codec(codec)
    return o


class _Placement(ctypes.Structure):
    _c_name_ = "tsr_placement"
    _fields_ = [("tp_dim", ctypes.c_int8), ("fsdp", ctypes.c_uint8), ("pp_role", ctypes.c_uint8),
                ("layer", ctypes.c_int32)]


class _Layout(ctypes.Structure):
    _c_name_ = "tsr_layout"
    _fields_ = [("pp", ctypes.c_uint32), ("dp_replicate", ctypes.c_uint32), ("dp_shard", ctypes.c_uint32),
                ("tp", ctypes.c_uint32), ("n_layers", ctypes.c_uint32), ("flags", ctypes.c_uint32)]


class _TensorInfo(ctypes.Structure):
    _c_name_ = "tsr_tensor_info"
    _fields_ = [("name", ctypes.c_char_p), ("group", ctypes.c_char_p), ("dtype", ctypes.c_int),
                ("ndim", ctypes.c_uint32), ("shape", ctypes.c_uint64 * MAX_DIMS), ("placement", _Placement),
                ("n_chunks", ctypes.c_uint32), ("first_chunk", ctypes.c_uint32), ("raw_bytes", ctypes.c_uint64),
                ("stored_bytes", ctypes.c_uint64)]


class _BlobInfo(ctypes.Structure):
    _c_name_ = "tsr_blob_info"
    _fields_ = [("name", ctypes.c_char_p), ("rank", ctypes.c_int32), ("size", ctypes.c_uint64),
                ("file_id", ctypes.c_uint32), ("n_frames", ctypes.c_uint32), ("first_frame", ctypes.c_uint32)]


_PROBLEM = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_char_p)

# tessera dtype codes (tsr_base.h) and the NumPy dtype of their elements as read;
# bf16 and the float8 types have no NumPy dtype: their bits as uint16 / uint8
_DTYPES = {1: ("f32", np.float32), 2: ("f16", np.float16), 3: ("bf16", np.uint16), 4: ("f64", np.float64),
           5: ("f8e4m3", np.uint8), 6: ("f8e5m2", np.uint8), 7: ("i8", np.int8), 8: ("i16", np.int16),
           9: ("i32", np.int32), 10: ("i64", np.int64), 11: ("u8", np.uint8), 12: ("u16", np.uint16),
           13: ("u32", np.uint32), 14: ("u64", np.uint64), 15: ("bool", np.bool_)}
_CODES = {name: code for code, (name, _) in _DTYPES.items()}
_PP_ROLES = {0: "all", 1: "first", 2: "last", 3: "layer"}

Tensor = namedtuple("Tensor", "name shape dtype group placement raw_bytes stored_bytes")
Tensor.__doc__ = "A tensor of a checkpoint: its global shape, dtype name, group and placement."

_libs = {}  # False: the core; True: the one for s3:// locations

_CORE, _CORE_S3, _FULL = "libtessera-core.so.0", "libtessera-core-s3.so.0", "libtessera.so.0"


def _find_library(s3=False):
    """The paths of the libraries to try, in order: for local paths the core,
    for s3:// locations the core with S3, then in the same place the full
    libtessera.so.0 (a place without either is passed over); last, their bare
    names, for the loader's path."""
    names = (_CORE_S3 if s3 else _CORE, _FULL)
    env = os.environ.get("TESSERA_LIB")
    if env and not os.path.isdir(env):
        return [env]
    here = os.path.dirname(os.path.abspath(__file__))
    places = [env] if env else [os.path.join(here, "..", "..", ".."),  # installed: PREFIX/lib/pythonX.Y/dist-packages/tessera
                                os.path.join(here, "..", "..", "build", "release")]  # the source tree's python/
    for place in places:
        found = [os.path.normpath(os.path.join(place, n)) for n in names if os.path.exists(os.path.join(place, n))]
        if found:
            return found
    if env:
        raise Error(-1, "tessera: %s (TESSERA_LIB): neither %s nor %s is there" % (env, names[0], _FULL))
    return list(names)


def library(s3=False):
    """The loaded library (ctypes.CDLL), loading it on first use: the core
    (libtessera-core) for local paths, or with s3=True the one for s3://
    locations (libtessera-core-s3). Its path: library()._name."""
    s3 = bool(s3)
    if s3 in _libs:
        return _libs[s3]
    tried = []
    for path in _find_library(s3):
        try:
            lib = ctypes.CDLL(path)
            break
        except OSError as e:
            tried.append(str(e))
    else:
        raise Error(-1, "tessera: cannot load libtessera (%s); set TESSERA_LIB to its path" % "; ".join(tried))
    P, E = ctypes.c_void_p, ctypes.POINTER(_Err)
    sig = {
        "tsr_ckpt_open": (P, [ctypes.c_char_p, E]),
        "tsr_ckpt_close": (None, [P]),
        "tsr_ckpt_step": (ctypes.c_uint64, [P]),
        "tsr_ckpt_layout": (_Layout, [P]),
        "tsr_ckpt_dir": (ctypes.c_char_p, [P]),
        "tsr_ckpt_n_tensors": (ctypes.c_size_t, [P]),
        "tsr_ckpt_n_blobs": (ctypes.c_size_t, [P]),
        "tsr_ckpt_tensor": (ctypes.c_int, [P, ctypes.c_size_t, ctypes.POINTER(_TensorInfo)]),
        "tsr_ckpt_blob": (ctypes.c_int, [P, ctypes.c_size_t, ctypes.POINTER(_BlobInfo)]),
        "tsr_ckpt_find": (ctypes.c_long, [P, ctypes.c_char_p]),
        "tsr_ckpt_find_blob": (ctypes.c_long, [P, ctypes.c_char_p, ctypes.c_int32]),
        "tsr_ckpt_read_many": (ctypes.c_int, [P, ctypes.POINTER(_ReadReq), ctypes.c_size_t, ctypes.c_int,
                                              ctypes.c_int, E]),
        "tsr_ckpt_verify": (ctypes.c_long, [P, _PROBLEM, P, ctypes.c_int, E]),
        "tsr_ckpt_tensor_digest": (ctypes.c_int, [P, ctypes.c_size_t, ctypes.POINTER(ctypes.c_uint64)]),
        "tsr_latest_step": (ctypes.c_int, [ctypes.c_char_p, ctypes.POINTER(ctypes.c_uint64), ctypes.c_char_p,
                                           ctypes.c_size_t]),
        "tsr_save_begin": (P, [ctypes.c_char_p, ctypes.c_uint32, P, P, E]),
        "tsr_write_opts_default": (_WriteOpts, []),
        "tsr_save_tensor": (ctypes.c_int, [P, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int, ctypes.c_uint32,
                                           ctypes.POINTER(ctypes.c_uint64), P, E]),
        "tsr_save_box": (ctypes.c_int, [P, ctypes.c_char_p, ctypes.POINTER(_Box), P, E]),
        "tsr_save_blob": (ctypes.c_int, [P, ctypes.c_char_p, ctypes.c_int32, P, ctypes.c_size_t, E]),
        "tsr_save_finish": (ctypes.c_int, [P, P, P, E]),
        "tsr_save_commit": (ctypes.c_int, [P, P, P, ctypes.c_size_t, ctypes.c_uint64, P, E]),
        "tsr_save_abort": (None, [P]),
        "tsr_save_free": (None, [P]),
    }
    for name, (res, args) in sig.items():
        try:
            f = getattr(lib, name)
        except AttributeError:
            raise Error(-1, "tessera: %s does not export %s" % (lib._name, name))
        f.restype, f.argtypes = res, args
    _libs[s3] = lib
    return lib


def _raise(err, what=None):
    msg = err.msg.decode("utf-8", "replace")
    raise Error(err.code, "%s: %s" % (what, msg) if what else msg)


def _bf16_to_f32(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32)


def _to_torch(a, code):
    import torch
    if code == 3:  # bf16: its bits into a bfloat16 tensor
        return torch.from_numpy(np.ascontiguousarray(a).view(np.int16)).view(torch.bfloat16)
    if a.dtype in (np.uint16, np.uint32, np.uint64):  # no unsigned wide types in torch 1.x
        raise Error(-1, "tessera: dtype %s has no torch equivalent; read it as NumPy" % _DTYPES[code][0])
    return torch.from_numpy(a)


class Checkpoint:
    """An open committed checkpoint (tessera.open). Close it, or use it in a with block."""

    def __init__(self, path, check_digests=True):
        self._h = None
        self.check_digests = bool(check_digests)
        p = os.fspath(path)
        lib = library(s3=p.startswith("s3://"))
        err = _Err()
        step_dir = p
        # a root: its newest committed step (on S3 a listing tells: a step
        # directory holds no step directories)
        if p.startswith("s3://") or not os.path.exists(os.path.join(p, "MANIFEST")):
            newest = latest(p)
            if newest is not None:
                step_dir = newest[1]
        h = lib.tsr_ckpt_open(step_dir.encode(), ctypes.byref(err))
        if not h:
            _raise(err)
        self._h, self._lib = h, lib
        self.path = step_dir
        self.step = int(lib.tsr_ckpt_step(h))
        lay = lib.tsr_ckpt_layout(h)
        self.layout = {k: int(getattr(lay, k)) for k in ("pp", "dp_replicate", "dp_shard", "tp", "n_layers")}
        self.tensors = {}
        self._index = {}
        info = _TensorInfo()
        for i in range(lib.tsr_ckpt_n_tensors(h)):
            lib.tsr_ckpt_tensor(h, i, ctypes.byref(info))
            name = info.name.decode()
            pl = info.placement
            placement = {"tp_dim": pl.tp_dim, "fsdp": bool(pl.fsdp), "pp_role": _PP_ROLES.get(pl.pp_role, "?"),
                         "layer": pl.layer}
            self.tensors[name] = Tensor(name, tuple(int(info.shape[d]) for d in range(info.ndim)),
                                        _DTYPES.get(info.dtype, ("?", None))[0], info.group.decode(), placement,
                                        int(info.raw_bytes), int(info.stored_bytes))
            self._index[name] = (i, info.dtype)
        self.blobs = {}
        binfo = _BlobInfo()
        for i in range(lib.tsr_ckpt_n_blobs(h)):
            lib.tsr_ckpt_blob(h, i, ctypes.byref(binfo))
            self.blobs[(binfo.name.decode(), int(binfo.rank))] = int(binfo.size)

    def _handle(self):
        if not self._h:
            raise Error(-1, "tessera: %s: the checkpoint is closed" % self.path)
        return self._h

    def read(self, name, offset=None, extent=None, torch=False, bf16="uint16", check_digest=None, out=None):
        """The box [offset, offset + extent) of tensor `name` (the whole tensor by
        default) as a NumPy array of the box's shape, or a torch.Tensor with
        torch=True. bf16 elements come as their uint16 bits, or as float32 with
        bf16="float32" (a torch tensor is bfloat16 either way). A whole tensor is
        held to its MANIFEST digest (Error naming it and both values) unless
        check_digest=False (default: the checkpoint's check_digests).
        out: a writable C-contiguous NumPy array of the box's elements and the
        stored element size (bf16: uint16) to read into, returned as it is: no
        copy. Any other is refused (Error naming the tensor), left untouched."""
        given = out is not None
        _, code, _, _, out = r = self._request(name, offset, extent, out)
        self._run([r], 1, check_digest)
        if given:
            return out
        if torch:
            return _to_torch(out, code)
        if code == 3 and bf16 == "float32":
            return _bf16_to_f32(out)
        return out

    def read_many(self, reads, threads=16, check_digest=None):
        """Reads many boxes at once: reads = [(name, offset, extent, out)], each as
        read(name, offset, extent, out=out) takes it (offset and extent None: the
        whole tensor). The frames they need are read once each, neighbouring ones
        of a data file at once (one GET from a bucket instead of one a frame), on
        `threads` threads with the GIL released; every whole tensor is held to its
        digest as read() holds it. Error names the first failure. Returns the
        arrays read into (made where out is None), in order."""
        reads = [self._request(*r) for r in reads]
        self._run(reads, threads, check_digest)
        return [r[4] for r in reads]

    def _run(self, reads, threads, check_digest):
        """The reads, each as _request made it, through tsr_ckpt_read_many."""
        lib, h = self._lib, self._handle()
        reqs = (_ReadReq * max(1, len(reads)))()
        for k, (i, _, off, ext, out) in enumerate(reads):
            reqs[k].tensor, reqs[k].box.ndim, reqs[k].dst = i, len(off), out.ctypes.data
            for d in range(len(off)):
                reqs[k].box.offset[d], reqs[k].box.extent[d] = off[d], ext[d]
        err = _Err()
        check = self.check_digests if check_digest is None else check_digest
        if lib.tsr_ckpt_read_many(h, reqs, len(reads), int(bool(check)), threads, ctypes.byref(err)):
            msg = err.msg.decode("utf-8", "replace")
            if "the data read has digest" in msg:
                raise Error(err.code, msg + " (it is not the tensor that was saved; read(..., check_digest=False) "
                                            "skips the check)")
            _raise(err, None if self.path in msg else self.path)

    def _request(self, name, offset, extent, out):
        """(tensor index, dtype code, offset, extent, out) of a read of the box of
        `name` at offset, extent: the box checked against the tensor, out checked
        (or made when None)."""
        if name not in self._index:
            raise Error(-3, "tessera: %s: no tensor named '%s'" % (self.path, name))
        i, code = self._index[name]
        shape = self.tensors[name].shape
        nd = len(shape)
        off = tuple(offset) if offset is not None else (0,) * nd
        ext = tuple(extent) if extent is not None else tuple(s - o for s, o in zip(shape, off))
        if len(off) != nd or len(ext) != nd:
            raise Error(-1, "tessera: %s: tensor '%s' has %d dims; the box has offset %s, extent %s"
                        % (self.path, name, nd, off, ext))
        if any(o < 0 or e < 0 for o, e in zip(off, ext)):
            raise Error(-1, "tessera: %s: tensor '%s': negative offset or extent %s, %s" % (self.path, name, off, ext))
        if out is None:
            return i, code, off, ext, np.empty(ext, dtype=_DTYPES[code][1])
        if (not isinstance(out, np.ndarray) or not out.flags.c_contiguous or not out.flags.writeable or
                out.dtype.itemsize != np.dtype(_DTYPES[code][1]).itemsize or out.size != int(np.prod(ext))):
            raise Error(-1, "tessera: %s: tensor '%s': out must be a writable C-contiguous array of %d elements "
                        "of %d bytes" % (self.path, name, int(np.prod(ext)), np.dtype(_DTYPES[code][1]).itemsize))
        return i, code, off, ext, out

    def digest(self, name):
        """The digest that the MANIFEST records for tensor `name` (FORMAT.md 4.4),
        or None (a checkpoint written before format 1.2)."""
        if name not in self._index:
            raise Error(-5, "tessera: %s: no tensor named '%s'" % (self.path, name))
        d = ctypes.c_uint64()
        return int(d.value) if self._lib.tsr_ckpt_tensor_digest(self._handle(), self._index[name][0],
                                                                ctypes.byref(d)) == 1 else None

    def blob(self, name, rank=-1):
        """Blob (name, rank) as bytes (rank -1: a global blob)."""
        return self.read_blobs([(name, rank)], threads=1)[0]

    def read_blobs(self, keys, threads=16):
        """Blobs [(name, rank)] as bytes, in one call of the library: their frames
        that follow each other in a data file read at once (one GET from a bucket
        for a file's blobs written together)."""
        lib, h = self._lib, self._handle()
        reqs = (_ReadReq * max(1, len(keys)))()
        bufs = []
        for k, (name, rank) in enumerate(keys):
            i = lib.tsr_ckpt_find_blob(h, name.encode(), rank)
            if i < 0:
                raise Error(-3, "tessera: %s: no blob '%s' of rank %d" % (self.path, name, rank))
            bufs.append(ctypes.create_string_buffer(max(self.blobs[(name, rank)], 1)))
            reqs[k].tensor, reqs[k].blob, reqs[k].dst = i, 1, ctypes.addressof(bufs[-1])
        err = _Err()
        if lib.tsr_ckpt_read_many(h, reqs, len(keys), 0, threads, ctypes.byref(err)):
            _raise(err)
        return [b.raw[:self.blobs[key]] for b, key in zip(bufs, keys)]

    def verify(self, threads=0):
        """Checks every checksum and rule of FORMAT.md; raises Error listing the
        problems found (each naming its file, tensor and frame)."""
        lib, h = self._lib, self._handle()
        problems = []
        cb = _PROBLEM(lambda user, msg: problems.append(msg.decode("utf-8", "replace")))
        err = _Err()
        n = lib.tsr_ckpt_verify(h, cb, None, threads, ctypes.byref(err))
        if n < 0:
            _raise(err)
        if n:
            raise Error(-4, "tessera: %s: %d problem(s): %s" % (self.path, n, "; ".join(problems)))

    def close(self):
        if self._h:
            self._lib.tsr_ckpt_close(self._h)
            self._h = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


def latest(root):
    """The step a job resumes from under the checkpoint root `root` (local or
    s3://): the newest committed one that is neither poisoned nor fenced, as
    (step, its directory); None where there is none. A step directory whose
    MANIFEST was never written (a save that died) does not count."""
    p = os.fspath(root)
    lib = library(s3=p.startswith("s3://"))
    step = ctypes.c_uint64()
    buf = ctypes.create_string_buffer(4096 + 64)
    if lib.tsr_latest_step(p.encode(), ctypes.byref(step), buf, len(buf)) != 0:
        return None
    return int(step.value), buf.value.decode()


def open(path, check_digests=True):  # noqa: A001 (the package's verb, as tessera.open)
    """Opens the committed checkpoint at `path`: a step directory or a root (its
    newest committed step), local or s3://bucket/prefix. With check_digests
    (the default) every whole-tensor read is held to the tensor's digest."""
    return Checkpoint(path, check_digests)


def _as_array(value):
    """(array, dtype code) of a NumPy array or a torch.Tensor."""
    mod = type(value).__module__
    if mod.startswith("torch"):
        import torch
        t = value.detach().cpu().contiguous()
        if t.dtype == torch.bfloat16:
            return t.view(torch.int16).numpy().view(np.uint16), 3
        value = t.numpy()
    a = np.asarray(value)  # 0-d stays 0-d (ascontiguousarray would make it 1-d)
    if not a.flags.c_contiguous:
        a = a.copy(order="C")
    for code, (_, npt) in _DTYPES.items():
        if code in (3, 5, 6, 12):  # bf16 and float8 only from torch / by name; u16 below
            continue
        if a.dtype == npt:
            return a, code
    if a.dtype == np.uint16:
        return a, 12
    raise Error(-1, "tessera: arrays of dtype %s cannot be saved" % a.dtype)


def save(path, tensors, step=0, blobs=None):
    """Writes a single-process checkpoint of `tensors` ({name: NumPy array or
    torch.Tensor}; a uint16 array is saved as u16, a torch bfloat16 tensor as
    bf16, or give (array, "bf16") for bf16 bits in a uint16 array) and `blobs`
    ({name: bytes}) as step `step` into the step directory `path` (local or
    s3://), committed by its MANIFEST written last."""
    lib = library(s3=os.fspath(path).startswith("s3://"))
    err = _Err()
    s = lib.tsr_save_begin(os.fspath(path).encode(), 0, None, None, ctypes.byref(err))
    if not s:
        _raise(err)
    ok = False
    try:
        for name, value in tensors.items():
            if isinstance(value, tuple):
                arr, dt = value
                a, code = np.asarray(arr), _CODES.get(dt)
                if not a.flags.c_contiguous:
                    a = a.copy(order="C")
                if code is None or a.dtype.itemsize != np.dtype(_DTYPES[code][1]).itemsize:
                    raise Error(-1, "tessera: tensor '%s': %s is not a dtype for %s elements" % (name, dt, a.dtype))
            else:
                a, code = _as_array(value)
            if a.ndim > MAX_DIMS:
                raise Error(-1, "tessera: tensor '%s': %d dims, more than %d" % (name, a.ndim, MAX_DIMS))
            shape = (ctypes.c_uint64 * max(a.ndim, 1))(*a.shape)
            if lib.tsr_save_tensor(s, name.encode(), b"model", code, a.ndim, shape, None, ctypes.byref(err)):
                _raise(err)
            box = _Box(a.ndim)
            for d in range(a.ndim):
                box.offset[d], box.extent[d] = 0, a.shape[d]
            if lib.tsr_save_box(s, name.encode(), ctypes.byref(box), a.ctypes.data_as(ctypes.c_void_p),
                                ctypes.byref(err)):
                _raise(err)
        for name, data in (blobs or {}).items():
            b = bytes(data)
            if lib.tsr_save_blob(s, name.encode(), -1, b, len(b), ctypes.byref(err)):
                _raise(err)
        if lib.tsr_save_finish(s, None, None, ctypes.byref(err)):
            _raise(err)
        if lib.tsr_save_commit(s, None, None, 0, step, None, ctypes.byref(err)):
            _raise(err)
        ok = True
    finally:
        if not ok:
            lib.tsr_save_abort(s)
        lib.tsr_save_free(s)
