"""tessera.dcp: tessera checkpoints as the storage of PyTorch Distributed Checkpoint (DCP).

    import torch.distributed.checkpoint as dcp
    import tessera.dcp
    dcp.save(state_dict, storage_writer=tessera.dcp.Writer("ckpt/step-00000100"))
    dcp.async_save(state_dict, storage_writer=tessera.dcp.Writer(path)).result()
    dcp.load(state_dict, storage_reader=tessera.dcp.Reader("ckpt"))   # a step directory, or a root: its newest
    r = tessera.dcp.load(state_dict, "ckpt", strict=False)           # what it skipped: r.missing_keys, r.unexpected_keys

Every rank's chunks (the local shards of DTensors, as FSDP2's fully_shard and tensor
parallelism make them, and whole tensors) are written by libtessera through its
writer protocol: each rank writes its own data file, data-RANK.tsd, compressed and
checksummed by the library, and the coordinator commits the MANIFEST from every
rank's table, written last. A chunk is a box of its tensor: a tensor saved on 8
ranks loads on 3 or 1, or into other placements, each rank reading only the frames
that overlap what it asks for. What is not a tensor (steps, RNG state, a data
loader's state: DCP hands them over as bytes) becomes a global blob of the same name.

The Reader presents each tensor as one chunk covering it, so DCP asks for exactly
the boxes each rank needs; whole tensors read are held to their MANIFEST digest.
The MANIFEST is no pickle; DCP itself pickles what is not a tensor (torch.save) and
unpickles it on load, as it does from its own files; a blob that is no such pickle
(the trainer's train.step, ...) is handed to DCP as bytes. Names are the flattened
state dict's keys (DCP's "optimizer.state.layers.0.attention.wq.weight.exp_avg");
tessera's rules apply to them (1..255 bytes of [A-Za-z0-9_.:+-]); a key outside
them fails the save, naming it. A checkpoint of tessera train offers its state
under TorchTitan's names too, so that TorchTitan's trainer (tessera.titan's
CheckpointManager) goes on from it: AdamW's moments (optim.exp_avg.NAME as
optimizer.state.NAME.exp_avg), its count, its param groups (the next step's
rate, betas, eps, weight decay), the schedule's count (lr_scheduler.last_epoch)
and train_state.step, from the trainer's blobs. How PyTorch runs the optimizer
(foreach, fused, ...) is no state of tessera's: LoadPlanner (tessera.dcp.load's
and tessera.titan's) leaves the loader's own.

Conversion both ways, in one process (python -m tessera.dcp, or tessera import
--from dcp and tessera export --format dcp, which run it):

    tessera.dcp.import_dcp("titan/step-100", "ckpt/step-00000100")   # DCP's FileSystemWriter folder in
    tessera.dcp.export_dcp("ckpt", "titan/step-100")                 # and out, loadable by dcp.load

Both keep names and values; what is not a tensor passes as the bytes stored, never
unpickled on the way. Reading DCP's folder reads its .metadata, a pickle: convert
only checkpoints you would torch.load.

Local paths and s3://bucket/prefix both work (credentials as for the command).
"""
import ctypes
import dataclasses
import io
import os
import re
import secrets
import tomllib

import numpy as np
import torch
from torch.distributed.checkpoint.metadata import (BytesStorageMetadata, ChunkStorageMetadata, Metadata,
                                                   MetadataIndex, StorageMeta, TensorProperties,
                                                   TensorStorageMetadata)
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner, DefaultSavePlanner
from torch.distributed.checkpoint.planner import LoadItemType, WriteItemType
from torch.distributed.checkpoint.storage import StorageReader, StorageWriter, WriteResult
from torch.futures import Future

from . import _DTYPES, MAX_DIMS, Error, _Box, _Err, _codec, _raise, _to_torch, _write_opts, library
from . import open as _open

_PICKLE = b"PK\x03\x04"  # torch.save's files are zip archives

__all__ = ["Writer", "Reader", "load", "import_dcp", "export_dcp"]

# tessera dtype codes (tsr_base.h) of torch's dtypes, and back
_CODE = {torch.float32: 1, torch.float16: 2, torch.bfloat16: 3, torch.float64: 4, torch.int8: 7, torch.int16: 8,
         torch.int32: 9, torch.int64: 10, torch.uint8: 11, torch.bool: 15}
for _name, _code in (("float8_e4m3fn", 5), ("float8_e5m2", 6), ("uint16", 12), ("uint32", 13), ("uint64", 14)):
    if hasattr(torch, _name):
        _CODE[getattr(torch, _name)] = _code
_DTYPE = {code: dt for dt, code in _CODE.items()}

_STEP_DIR = re.compile(r"step-(\d+)$")
# the library's threads of a load: each reads neighbouring frames (up to 8 MiB)
# at once, then decodes them, so this is the depth of I/O a load keeps (a disk's
# queue, an object store's requests in flight); the decoding shares the cores
_READS_IN_FLIGHT = 16
_COPY_BYTES = 256 << 20  # buffers of the boxes that cannot be read in place, at a time


def _step_of(path, step):
    if step is not None:
        return int(step)
    m = _STEP_DIR.search(os.fspath(path).rstrip("/"))
    return int(m.group(1)) if m else 0


def _done(value):
    f = Future()
    f.set_result(value)
    return f


class Writer(StorageWriter):
    """DCP's storage writer into the tessera step directory `path` (local or
    s3://), committed as step `step` (default: the number in a path ending in
    step-N, else 0). codec: "auto" (the library's adaptive choice: frames
    encoded while the encoder keeps ahead of the disk, else stored raw),
    "bytegroup" (every float frame encoded: smaller, bf16 most), "zstd" or "raw"."""

    def __init__(self, path=None, step=None, codec="auto"):
        super().__init__()
        self.path = os.fspath(path) if path is not None else None
        self._step = step
        self._codec = codec
        _codec(codec, "tessera.dcp.Writer")  # a name that is none: now, not at the save
        self._s = None  # the coordinator's writer, from write_data to finish

    def reset(self, checkpoint_id=None):
        if checkpoint_id is not None:
            self.path = os.fspath(checkpoint_id)
        self._s = None

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id):
        return isinstance(checkpoint_id, (str, os.PathLike))

    def storage_meta(self):
        return StorageMeta(checkpoint_id=self.path)

    def set_up_storage_writer(self, is_coordinator, *args, **kwargs):
        if self.path is None:
            raise Error(-1, "tessera.dcp.Writer: no path (give one, or a checkpoint_id to dcp.save)")
        self.is_coordinator = is_coordinator

    def prepare_local_plan(self, plan):
        return plan

    def prepare_global_plan(self, plans):
        # one save: every rank's data file carries the same id; file i is rank i's
        save_id = secrets.token_bytes(16)
        return [dataclasses.replace(p, storage_data=(i, save_id)) for i, p in enumerate(plans)]

    def write_data(self, plan, planner):
        file_id, save_id = plan.storage_data
        lib = library(s3=self.path.startswith("s3://"))
        results = []
        if not plan.items and not self.is_coordinator:
            return _done(results)  # nothing of this rank's: no data file
        err = _Err()
        sid = ctypes.create_string_buffer(save_id, 16)
        opts = _write_opts(lib, self._codec)
        s = lib.tsr_save_begin(self.path.encode(), file_id, sid, ctypes.byref(opts), ctypes.byref(err))
        if not s:
            _raise(err)
        ok = False
        try:
            declared = set()
            # what is not a tensor first: the blobs lie together at the start of
            # the data file (a tensor's frames are encoded on the library's
            # threads, placed as they finish), so a load reads them in one request
            for item in plan.items:
                if item.type != WriteItemType.BYTE_IO:
                    continue
                name = item.index.fqn
                data = planner.resolve_data(item)
                b = data.getvalue() if isinstance(data, io.BytesIO) else bytes(data)
                if lib.tsr_save_blob(s, name.encode(), -1, b, len(b), ctypes.byref(err)):
                    _raise(err, "tessera.dcp: %s: blob %s" % (self.path, name))
                results.append(WriteResult(index=item.index, size_in_bytes=len(b), storage_data=None))
            for item in plan.items:
                if item.type == WriteItemType.BYTE_IO:
                    continue
                name = item.index.fqn
                td = item.tensor_data
                t = planner.resolve_data(item).detach()
                if t.device.type != "cpu":
                    t = t.cpu()
                t = t.contiguous()
                code = _CODE.get(t.dtype)
                if code is None:
                    raise Error(-1, "tessera.dcp: %s: tensor %s: dtype %s cannot be saved" % (self.path, name, t.dtype))
                shape, off, ext = tuple(td.size), tuple(td.chunk.offsets), tuple(td.chunk.sizes)
                if len(shape) > MAX_DIMS:
                    raise Error(-1, "tessera.dcp: %s: tensor %s: %d dims, more than %d" % (self.path, name,
                                                                                      len(shape), MAX_DIMS))
                if tuple(t.shape) != ext:
                    raise Error(-1, "tessera.dcp: %s: tensor %s: the chunk at %s is %s, its data %s"
                                % (self.path, name, off, ext, tuple(t.shape)))
                if name not in declared:
                    dims = (ctypes.c_uint64 * max(len(shape), 1))(*shape)
                    group = b"optim" if name.startswith("optim") else b"model"
                    if lib.tsr_save_tensor(s, name.encode(), group, code, len(shape), dims, None, ctypes.byref(err)):
                        _raise(err, "tessera.dcp: %s" % self.path)
                    declared.add(name)
                box = _Box(len(shape))
                for d in range(len(shape)):
                    box.offset[d], box.extent[d] = off[d], ext[d]
                if lib.tsr_save_box(s, name.encode(), ctypes.byref(box), ctypes.c_void_p(t.data_ptr()),
                                    ctypes.byref(err)):
                    _raise(err, "tessera.dcp: %s" % self.path)
                results.append(WriteResult(index=item.index, size_in_bytes=t.numel() * t.element_size(),
                                           storage_data=None))
            table, n = ctypes.c_void_p(), ctypes.c_size_t()
            if lib.tsr_save_finish(s, ctypes.byref(table), ctypes.byref(n), ctypes.byref(err)):
                _raise(err, "tessera.dcp: %s" % self.path)
            # this rank's table goes to the coordinator with its results
            mine = WriteResult(index=MetadataIndex("tessera.table.%d" % file_id), size_in_bytes=0,
                               storage_data=("tessera.table", file_id, ctypes.string_at(table, n.value)))
            results.append(mine)
            ok = True
        finally:
            if not ok:
                lib.tsr_save_abort(s)
                lib.tsr_save_free(s)
            elif self.is_coordinator:
                self._s = s  # finish() commits through it
            else:
                lib.tsr_save_free(s)
        return _done(results)

    def __del__(self):  # a save that failed elsewhere: the coordinator's data file goes too
        if getattr(self, "_s", None):
            try:
                lib = library(s3=self.path.startswith("s3://"))
                lib.tsr_save_abort(self._s)
                lib.tsr_save_free(self._s)
            except Exception:
                pass
            self._s = None

    def finish(self, metadata, results):
        # the coordinator commits through its own writer of the save, kept open by write_data
        s, self._s = self._s, None
        if s is None:
            raise Error(-1, "tessera.dcp: %s: the coordinator has no writer to commit with" % self.path)
        lib = library(s3=self.path.startswith("s3://"))
        ok = False
        try:
            tables = sorted((r.storage_data[1], r.storage_data[2]) for rs in results for r in rs
                            if isinstance(r.storage_data, tuple) and r.storage_data[:1] == ("tessera.table",))
            bufs = [ctypes.create_string_buffer(t, len(t)) for _, t in tables]
            ptrs = (ctypes.c_void_p * len(bufs))(*[ctypes.cast(b, ctypes.c_void_p) for b in bufs])
            lens = (ctypes.c_size_t * len(bufs))(*[len(t) for _, t in tables])
            err = _Err()
            if lib.tsr_save_commit(s, ptrs, lens, len(bufs), _step_of(self.path, self._step), None,
                                   ctypes.byref(err)):
                _raise(err, "tessera.dcp: %s: commit" % self.path)
            ok = True
        finally:
            if not ok:
                lib.tsr_save_abort(s)
            lib.tsr_save_free(s)


class Reader(StorageReader):
    """DCP's storage reader of the tessera checkpoint at `path`: a step
    directory, or a root (its newest committed step), local or s3://. With
    check_digests (the default) every whole tensor read is held to its digest."""

    def __init__(self, path=None, check_digests=True):
        super().__init__()
        self.path = os.fspath(path) if path is not None else None
        self.check_digests = check_digests
        self._ck = None
        self._alias = {}  # tessera train's moments under TorchTitan's names (_trainer_state)
        self._synth = {}  # and what TorchTitan keeps besides, from the trainer's blobs

    def reset(self, checkpoint_id=None):
        if checkpoint_id is not None:
            self.path = os.fspath(checkpoint_id)
        self._close()

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id):
        return isinstance(checkpoint_id, (str, os.PathLike))

    def _open(self):
        if self._ck is None:
            if self.path is None:
                raise Error(-1, "tessera.dcp.Reader: no path (give one, or a checkpoint_id to dcp.load)")
            self._ck = _open(self.path, check_digests=self.check_digests)
            self._alias, self._synth = _trainer_state(self._ck)
        return self._ck

    def _close(self):
        if self._ck is not None:
            self._ck.close()
            self._ck = None

    def read_metadata(self, *args, **kwargs):
        ck = self._open()
        md = self.keys = {}
        for name in list(ck.tensors) + list(self._alias):
            t = ck.tensors[self._alias.get(name, name)]
            code = ck._index[t.name][1]
            if code not in _DTYPE:
                raise Error(-1, "tessera.dcp: %s: tensor %s: dtype %s has no torch dtype" % (ck.path, name, t.dtype))
            md[name] = _whole(_DTYPE[code], t.shape)
        for (name, rank) in ck.blobs:
            if rank == -1:
                md[name] = BytesStorageMetadata()
        for name, v in self._synth.items():  # AdamW's step a 0-d f32 tensor, the rest values
            md[name] = _whole(v.dtype, v.shape) if isinstance(v, torch.Tensor) else BytesStorageMetadata()
        return Metadata(state_dict_metadata=md, storage_meta=StorageMeta(checkpoint_id=ck.path))

    def set_up_storage_reader(self, metadata, is_coordinator, *args, **kwargs):
        self._open()

    def prepare_local_plan(self, plan):
        return plan

    def prepare_global_plan(self, plans):
        return plans

    def read_data(self, plan, planner):
        ck = self._open()
        boxes = []
        # the blobs first, all in one call of the library (a file's blobs, written
        # together, come in one read)
        blobs = [r.storage_index.fqn for r in plan.items
                 if r.type == LoadItemType.BYTE_IO and r.storage_index.fqn not in self._synth]
        blob = dict(zip(blobs, ck.read_blobs([(name, -1) for name in blobs], threads=_READS_IN_FLIGHT)))
        for req in plan.items:
            name = self._alias.get(req.storage_index.fqn, req.storage_index.fqn)
            if name in self._synth:
                _load_value(planner, req, self._synth[name])
                continue
            if req.type == LoadItemType.BYTE_IO:
                b = blob[name]
                if not isinstance(planner, _RawLoadPlanner) and not b.startswith(_PICKLE):
                    _load_value(planner, req, b)  # raw bytes (the trainer's): DCP's planner gets a bytes object
                else:
                    planner.load_bytes(req, io.BytesIO(b))
                continue
            off, ext = tuple(req.storage_offsets), tuple(req.lengths)
            target = planner.resolve_tensor(req).detach()
            if tuple(target.shape) != ext:
                raise Error(-1, "tessera.dcp: %s: tensor %s: the box at %s is %s, its destination %s"
                            % (ck.path, name, off, ext, tuple(target.shape)))
            boxes.append((req, name, off, ext, target))

        # one call of the library reads them all (neighbouring frames at once,
        # threads side by side, the GIL released), straight into each
        # destination's memory where it can; the rest through buffers of at most
        # _COPY_BYTES at a time, copied after
        reads, copies, held = [], [], 0
        for k, (req, name, off, ext, target) in enumerate(boxes):
            code = ck._index[name][1]
            dst = _in_place(target, code)
            if dst is None:
                dst = np.empty(ext, dtype=_DTYPES[code][1])
                copies.append((target, dst, code))
                held += dst.nbytes
            reads.append((name, off, ext, dst))
            if held > _COPY_BYTES or k == len(boxes) - 1:
                ck.read_many(reads, threads=_READS_IN_FLIGHT)
                for target, dst, code in copies:
                    target.copy_(_to_torch(dst, code).reshape(target.shape))
                reads, copies, held = [], [], 0
        for req, _, _, _, target in boxes:
            planner.commit_tensor(req, target)
        return _done(None)


_TRAINER_MOMENT = re.compile(r"optim\.(exp_avg|exp_avg_sq)\.(.+)")
# how a PyTorch optimizer runs, not its state: a checkpoint of tessera train has
# none of them, and LoadPlanner leaves the loader's own
_HOW_IT_RUNS = re.compile(r"optimizer\.param_groups\..+\.(foreach|fused|capturable|differentiable)")


def _trainer_state(ck):
    """A checkpoint of tessera train (its train.model blob) under TorchTitan's
    names too, as TorchTitan's trainer, AdamW (OptimizersContainer's flattened
    state) and schedule (LRSchedulersContainer) keep their state: {alias: name}
    for AdamW's moments (the trainer's optim.exp_avg.NAME as
    optimizer.state.NAME.exp_avg, and exp_avg_sq), and {key: value} for what
    the trainer keeps in its blobs (train.step, train.lr_scheduler,
    train.config): optimizer.state.NAME.step (AdamW's count, a 0-d f32 tensor),
    optimizer.param_groups.NAME.KEY (lr: the schedule's rate for the next step;
    initial_lr, betas, eps, weight_decay from the run's configuration; amsgrad,
    maximize, decoupled_weight_decay as tessera's AdamW is), lr_scheduler.last_epoch
    (the schedule's count), train_state.step and train_state.ntokens_seen (the
    tokens one data-parallel rank of the saving run took, counted from the
    steps). A checkpoint older than next_lr in train.lr_scheduler offers no lr."""
    if not any(name == "train.model" and rank == -1 for name, rank in ck.blobs):
        return {}, {}
    alias, synth = {}, {}
    for name in ck.tensors:
        m = _TRAINER_MOMENT.fullmatch(name)
        a = m and "optimizer.state.%s.%s" % (m.group(2), m.group(1))
        if a and a not in ck.tensors:
            alias[a] = name
    want = ("train.step", "train.lr_scheduler", "train.config")
    if not all((b, -1) in ck.blobs for b in want):
        return alias, synth
    step_le, sched_text, config_text = ck.read_blobs([(b, -1) for b in want])
    try:
        step = int.from_bytes(step_le, "little")
        sched = dict(w.partition("=")[::2] for w in sched_text.decode("ascii").split())
        cfg = tomllib.loads(config_text.decode("utf-8"))
        opt, training, par = cfg["optimizer"], cfg["training"], cfg["parallelism"]
        count = step - int(sched.get("opt_origin", 0))
        group = {"initial_lr": float(opt["lr"]), "betas": (float(opt["beta1"]), float(opt["beta2"])),
                 "eps": float(opt["eps"]), "weight_decay": float(opt["weight_decay"]), "amsgrad": False,
                 "maximize": False, "decoupled_weight_decay": True}
        if "next_lr" in sched:
            group["lr"] = float(sched["next_lr"])
        synth["lr_scheduler.last_epoch"] = step - int(sched.get("lr_origin", 0))
        dp = int(par["data_parallel_replicate_degree"]) * int(par["data_parallel_shard_degree"])
        batch = int(training["global_batch_size"]) // dp if int(training["global_batch_size"]) > 0 \
            else int(training["local_batch_size"])
        synth["train_state.step"] = step
        synth["train_state.ntokens_seen"] = step * batch * int(training["seq_len"])
    except (KeyError, ValueError, TypeError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise Error(-1, "tessera.dcp: %s: the trainer's train.step, train.lr_scheduler and train.config do "
                        "not read as tessera train writes them: %s: %s" % (ck.path, type(e).__name__, e))
    for a, name in alias.items():
        if a.endswith(".exp_avg"):
            param = a[len("optimizer.state."):-len(".exp_avg")]
            synth["optimizer.state.%s.step" % param] = torch.tensor(float(count))
            for k, v in group.items():
                synth["optimizer.param_groups.%s.%s" % (param, k)] = v
    return alias, synth


def _whole(dtype, shape):
    """DCP's metadata of a tensor stored as one chunk covering it."""
    size = torch.Size(shape)
    return TensorStorageMetadata(properties=TensorProperties(dtype=dtype), size=size,
                                 chunks=[ChunkStorageMetadata(offsets=torch.Size([0] * len(size)), sizes=size)])


def _load_value(planner, req, value):
    """A value the Reader makes (_trainer_state, or a raw blob as bytes) to the
    planner: a tensor into its destination, anything else as DCP's own bytes
    (torch.save)."""
    if req.type == LoadItemType.BYTE_IO:
        buf = io.BytesIO()
        torch.save(value, buf)
        buf.seek(0)
        planner.load_bytes(req, buf)
        return
    target = planner.resolve_tensor(req).detach()
    target.copy_(value)
    planner.commit_tensor(req, target)


class LoadPlanner(DefaultLoadPlanner):
    """DCP's DefaultLoadPlanner, strict or not, but for the keys that say how a
    PyTorch optimizer runs (optimizer.param_groups.NAME.foreach, fused,
    capturable, differentiable): where the checkpoint has none (one of tessera
    train), the loader's own stay. tessera.dcp.load and tessera.titan use it;
    with dcp.load: planner=tessera.dcp.LoadPlanner()."""

    def __init__(self, strict=True, **kwargs):
        super().__init__(allow_partial_load=True, **kwargs)
        self.strict = strict

    def create_local_plan(self):
        plan = super().create_local_plan()  # which may fall back to keys of PyTorch 2.3 and before
        if self.strict:
            have = self.metadata.state_dict_metadata
            for k in self.state_dict:
                if k not in have and not _HOW_IT_RUNS.fullmatch(k):
                    raise RuntimeError("Missing key in checkpoint state_dict: %s." % k)
        return plan


def _in_place(t, code):
    """A NumPy view of tensor t's memory to read the stored dtype `code` into, when
    t is a contiguous CPU tensor of that dtype; else None (read, then copied)."""
    if t.device.type != "cpu" or not t.is_contiguous() or _CODE.get(t.dtype) != code:
        return None
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(np.uint16).reshape(-1)
    return t.numpy().reshape(-1)


class Skipped:
    """What a load with strict=False left out: .missing_keys (the state dict's
    keys, flattened, that the checkpoint lacks: left as they were) and
    .unexpected_keys (the checkpoint's that the state dict has no place for:
    not read)."""

    def __init__(self, missing, unexpected):
        self.missing_keys, self.unexpected_keys = missing, unexpected

    def __repr__(self):
        return "Skipped(missing_keys=%r, unexpected_keys=%r)" % (self.missing_keys, self.unexpected_keys)


def load(state_dict, path, strict=True, process_group=None):
    """dcp.load of state_dict (in place, every rank of process_group) from the
    tessera checkpoint at path. strict: every key must be in the checkpoint
    (else DCP fails naming the first missing); strict=False loads those that
    are and says what it skipped. Only the frames of the tensors loaded are
    read. @return Skipped."""
    import torch.distributed.checkpoint as dcp
    reader = Reader(path)
    planner = LoadPlanner(strict=strict)
    dcp.load(state_dict, storage_reader=reader, planner=planner, process_group=process_group)
    want = set(planner.state_dict)  # the target's keys, flattened as DCP flattens them
    have = set(reader.keys)
    # a tensor offered under two names (_trainer_state) is one: left unread, it
    # is named once, by its own name; read under either, it is not unexpected
    alias = reader._alias
    read_by_alias = {alias[a] for a in want if a in alias}
    made = set(reader._synth)  # TorchTitan's names for the trainer's blobs: named only if asked for
    return Skipped(sorted(want - have), sorted(have - want - set(alias) - read_by_alias - made))


class _Raw(bytes):
    """The stored bytes of a non-tensor value, passed on as they are."""


class _RawLoadPlanner(DefaultLoadPlanner):
    """Keeps what is not a tensor as its stored bytes (_Raw, in .raw by name), unpickled."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.raw = {}

    def load_bytes(self, read_item, value):
        self.raw[read_item.dest_index.fqn] = _Raw(value.getvalue())


class _RawSavePlanner(DefaultSavePlanner):
    """Writes a _Raw value's bytes as they are (others as DCP does)."""

    def transform_object(self, write_item, obj):
        if write_item.type == WriteItemType.BYTE_IO and isinstance(obj, _Raw):
            return io.BytesIO(bytes(obj))
        return super().transform_object(write_item, obj)


def _convert(reader, writer, metadata, raw_blob):
    """Every tensor and value of metadata through reader into writer, in one process."""
    import warnings
    import torch.distributed.checkpoint as dcp
    sd = {}
    for fqn, m in metadata.state_dict_metadata.items():
        sd[fqn] = torch.empty(m.size, dtype=m.properties.dtype) if isinstance(m, TensorStorageMetadata) else None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "assuming the intent is to load in a single process"
        planner = _RawLoadPlanner(flatten_state_dict=False)
        dcp.load(sd, storage_reader=reader, planner=planner)
        for k, v in planner.raw.items():
            sd[k] = raw_blob(v) if raw_blob is not None else v
        dcp.save(sd, storage_writer=writer, planner=_RawSavePlanner(flatten_state_dict=False))
    n_t = sum(isinstance(m, TensorStorageMetadata) for m in metadata.state_dict_metadata.values())
    return n_t, len(sd) - n_t


def import_dcp(src, dst, step=None):
    """The DCP checkpoint folder src (FileSystemWriter's) as the tessera step
    directory dst (local or s3://), committed as step `step` (default: the
    number of a dst or src ending in step-N, else 0). @return (tensors, values)."""
    from torch.distributed.checkpoint import FileSystemReader
    if step is None:
        step = _step_of(dst, None) if _STEP_DIR.search(os.fspath(dst).rstrip("/")) else _step_of(src, None)
    reader = FileSystemReader(os.fspath(src))
    try:
        metadata = reader.read_metadata()
    except FileNotFoundError as e:
        raise Error(-1, "tessera.dcp: %s: not a DCP checkpoint folder (%s)" % (src, e))
    return _convert(reader, Writer(dst, step=step), metadata, None)


def export_dcp(src, dst, thread_count=1):
    """The tessera checkpoint src (a step directory, or a root: its newest) as
    a DCP checkpoint folder dst that dcp.load reads with FileSystemReader.
    Blobs that DCP wrote come back as they were; the trainer's raw blobs as
    bytes objects. @return (tensors, values)."""
    from torch.distributed.checkpoint import FileSystemWriter
    reader = Reader(src)
    metadata = reader.read_metadata()

    def raw_blob(b):  # DCP's own pickle as it is; raw bytes pickled as bytes
        return b if b.startswith(_PICKLE) else bytes(b)
    return _convert(reader, FileSystemWriter(os.fspath(dst), thread_count=thread_count), metadata, raw_blob)


def main(argv=None):
    import argparse
    ap = argparse.ArgumentParser(prog="python -m tessera.dcp",
                                 description="tessera checkpoints to and from PyTorch DCP folders")
    sub = ap.add_subparsers(dest="verb", required=True)
    a = sub.add_parser("import", help="a DCP folder (FileSystemWriter's) into a tessera step directory")
    a.add_argument("src")
    a.add_argument("dst")
    a.add_argument("--step", type=int)
    b = sub.add_parser("export", help="a tessera checkpoint into a DCP folder")
    b.add_argument("src")
    b.add_argument("dst")
    b.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    try:
        if args.verb == "import":
            n_t, n_v = import_dcp(args.src, args.dst, args.step)
        else:
            n_t, n_v = export_dcp(args.src, args.dst, args.threads)
    except (Error, OSError, RuntimeError, ValueError) as e:
        print("tessera %s: %s: %s" % (args.verb, args.src, e), file=__import__("sys").stderr)
        return 1
    print("%sed %s: %d tensors, %d other values, into %s" % (args.verb, args.src, n_t, n_v, args.dst))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
