"""bench_dcp.py OUT [WORLD] [--smoke], bench_dcp.py --s3 s3://BUCKET/PREFIX [WORLD] [--smoke]:
tessera beside PyTorch Distributed Checkpoint (DCP) on this machine, in one run,
the same state, processes and disk for both: DCP's FileSystemWriter at its best
settings here (thread_count = the cores, files synced, one file per rank) against
tessera through its DCP plug-in (tessera.dcp.Writer / Reader, the C engine
writing). WORLD gloo processes on loopback (default 2), each tensor's rows sharded
over them (DTensor Shard(0)).

States: the 124m model's parameters with their AdamW moments (f32), and 1 GiB of
bf16 N(0, 0.02) tensors (tessera.dcp.Writer's codec "bytegroup" for these:
every frame encoded; the f32 state with the default "auto"). Each measure alternates the two, twice, and keeps each
one's best: save throughput (the global bytes over the time from the first rank's
start to the last rank's end), bytes on disk, load in the saved layout, load on one
process (another world size: every tensor whole), each save and load after the page
cache is written back and emptied (where root may: a load reads the disk, and no
earlier write is still being flushed during a save), dcp.async_save's blocked time,
and the step cost of a stand-in training loop (a matmul chain per step on one
thread a process) saving every 5 steps with async_save, against the same loop
without saves; and the save through tessera's library alone (the writer protocol
the plug-in uses, without DCP's planning and metadata). Prints each figure with its
ratio and goal. --smoke: the same on
tiny states (a check of the script, no figures to quote).

--s3: the same 124m state to the S3 server at AWS_ENDPOINT_URL, loads from
S3_LOAD_ENDPOINT where it is set (tools/bench_dcp_s3.sh starts Ceph RGW): DCP with s3torchconnector's S3StorageWriter and S3StorageReader
against tessera's plug-in to s3://, save and load in the saved layout on WORLD
processes (alternately, the best of two, every load's values checked) and load on
one process."""
import os
import shutil
import socket
import subprocess
import sys
import time
import warnings

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp
from torch.distributed.tensor import DTensor, Replicate, Shard

import tessera.dcp

warnings.simplefilter("ignore", UserWarning)
CORES = os.cpu_count() or 1
SMOKE = "--smoke" in sys.argv


def shapes_124m():
    dim, layers, ffn, vocab = (64, 2, 128, 512) if SMOKE else (768, 12, 2048, 50304)
    s = {"tok_embeddings.weight": (vocab, dim), "norm.weight": (dim,), "output.weight": (vocab, dim)}
    for i in range(layers):
        p = "layers.%d." % i
        for w in ("wq", "wk", "wv", "wo"):
            s[p + "attention.%s.weight" % w] = (dim, dim)
        s[p + "feed_forward.w1.weight"] = (ffn, dim)
        s[p + "feed_forward.w3.weight"] = (ffn, dim)
        s[p + "feed_forward.w2.weight"] = (dim, ffn)
        s[p + "attention_norm.weight"] = (dim,)
        s[p + "ffn_norm.weight"] = (dim,)
    return s


def local(shape, dtype, rank, world, seed, zero):
    """This rank's rows of a tensor (all of a 1-D one), N(0, 0.02)."""
    rows = shape if len(shape) < 2 else (shape[0] // world,) + tuple(shape[1:])
    if zero:
        return torch.zeros(rows, dtype=dtype)
    g = torch.Generator().manual_seed(seed * 1000 + (rank if len(shape) >= 2 else 0))  # replicated: the same
    return (torch.randn(rows, generator=g) * 0.02).to(dtype)


def state(kind, mesh, rank, world, zero=False):
    """{name: DTensor} (or plain tensors without a mesh) of `kind`, and its global bytes."""
    if kind == "124m":
        items = []
        for n, sh in shapes_124m().items():
            items += [(n, sh), ("optimizer.state.%s.exp_avg" % n, sh), ("optimizer.state.%s.exp_avg_sq" % n, sh)]
        dtype = torch.float32
    else:  # 1 GiB of bf16: 32 tensors of 4096 x 4096
        n = 256 if SMOKE else 4096
        items, dtype = [("synthetic.%02d" % i, (n, n)) for i in range(32)], torch.bfloat16
    sd, nbytes = {}, 0
    for i, (n, sh) in enumerate(items):
        nbytes += torch.Size(sh).numel() * torch.finfo(dtype).bits // 8
        if mesh is None:
            sd[n] = torch.zeros(sh, dtype=dtype) if zero else None
            continue
        t = local(sh, dtype, rank, world, i, zero)
        sd[n] = DTensor.from_local(t, mesh, [Shard(0)] if len(sh) > 1 else [Replicate()], run_check=False)
    return sd, nbytes


def writer(backend, path, kind="124m"):
    """The backend's writer; tessera's encodes every frame of the bf16 state
    (codec bytegroup: the choice of a user who wants it small), the rest adaptively."""
    if backend == "dcp":
        return dcp.FileSystemWriter(path, thread_count=CORES, sync_files=True, single_file_per_rank=True)
    return tessera.dcp.Writer(path, codec="bytegroup" if kind == "bf16" else "auto")


def engine_save(sd, path, rank, world, kind):
    """tessera's library alone, without DCP: each rank writes the rows it holds
    (a box per tensor; a replicated one by rank 0) into its own data file through
    the writer protocol the plug-in uses, and rank 0 commits every rank's table
    (gathered over the process group). What DCP's planning costs the plug-in."""
    import ctypes
    from tessera import _Box, _Err, _write_opts, library
    lib = library()
    err = _Err()
    sid = [os.urandom(16)]
    dist.broadcast_object_list(sid, src=0)
    opts = _write_opts(lib, "bytegroup" if kind == "bf16" else "auto")
    s = lib.tsr_save_begin(path.encode(), rank, ctypes.create_string_buffer(sid[0], 16), ctypes.byref(opts),
                           ctypes.byref(err))
    assert s, err.msg
    code = {torch.float32: 1, torch.bfloat16: 3}
    for name, t in sd.items():
        loc = t.to_local().contiguous()
        if t.dim() < 2 and rank != 0:
            continue
        dims = (ctypes.c_uint64 * t.dim())(*t.shape)
        group = b"optim" if name.startswith("optim") else b"model"
        assert not lib.tsr_save_tensor(s, name.encode(), group, code[t.dtype], t.dim(), dims, None, ctypes.byref(err))
        box = _Box(t.dim())
        for d in range(t.dim()):
            box.offset[d], box.extent[d] = 0, loc.shape[d]
        if t.dim() >= 2:
            box.offset[0] = rank * loc.shape[0]
        assert not lib.tsr_save_box(s, name.encode(), ctypes.byref(box), ctypes.c_void_p(loc.data_ptr()),
                                    ctypes.byref(err)), err.msg
    table, n = ctypes.c_void_p(), ctypes.c_size_t()
    assert not lib.tsr_save_finish(s, ctypes.byref(table), ctypes.byref(n), ctypes.byref(err)), err.msg
    tables = [None] * world if rank == 0 else None
    dist.gather_object(ctypes.string_at(table, n.value), tables, dst=0)
    if rank == 0:
        bufs = [ctypes.create_string_buffer(t, len(t)) for t in tables]
        ptrs = (ctypes.c_void_p * world)(*[ctypes.cast(b, ctypes.c_void_p) for b in bufs])
        lens = (ctypes.c_size_t * world)(*[len(t) for t in tables])
        assert not lib.tsr_save_commit(s, ptrs, lens, world, 1, None, ctypes.byref(err)), err.msg
    lib.tsr_save_free(s)


def reader(backend, path):
    return dcp.FileSystemReader(path) if backend == "dcp" else tessera.dcp.Reader(path)


def du(path):
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


def timed(fn):
    dist.barrier()
    t = time.perf_counter()
    fn()
    dist.barrier()
    return time.perf_counter() - t


def drop_cache():
    """Empties the page cache before a timed load (root only): a resume reads what
    it finds on disk, not what the save just left in memory (DCP's buffered writes
    stay cached, tessera's O_DIRECT ones do not). False where it cannot."""
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("1")
        return True
    except OSError:
        return False


def cold(rank):
    ok = drop_cache() if rank == 0 else True
    dist.barrier()
    return ok


def clean(path, rank):
    if rank == 0 and os.path.exists(path):
        shutil.rmtree(path)
    dist.barrier()


def step_loop(sd, backend, path, rank, save_pg, steps=20, every=5):
    """Seconds a step of the stand-in loop, saving `sd` every `every` steps with
    async_save (backend None: no saves) over save_pg: the loop's own collectives
    use the default group, and one group used from two threads at once would
    interleave their collectives (DCP's advice: a group of its own)."""
    g = torch.Generator().manual_seed(rank)
    a, b = torch.randn(768, 768, generator=g), torch.randn(768, 768, generator=g)
    fut = None
    dist.barrier()
    t = time.perf_counter()
    for s in range(1, steps + 1):
        x = a
        for _ in range(24):  # the step's compute
            x = torch.tanh(x @ b)
        dist.all_reduce(x[:1, :8])  # its collective
        if backend and s % every == 0:
            if fut is not None:
                fut.result()  # one save in flight at a time, as a trainer keeps it
            fut = dcp.async_save(sd, storage_writer=writer(backend, "%s/step-%08d" % (path, s)),
                                 process_group=save_pg)
    if fut is not None:
        fut.result()
    dist.barrier()
    return (time.perf_counter() - t) / steps


def worker(rank, world, out, port, q):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port, rank=rank, world_size=world)
    from torch.distributed.device_mesh import init_device_mesh
    mesh = init_device_mesh("cpu", (world,))
    save_pg = dist.new_group(backend="gloo")
    res = {}
    for kind in ("124m", "bf16"):
        sd, nbytes = state(kind, mesh, rank, world)
        zero, _ = state(kind, mesh, rank, world, zero=True)
        res[kind, "bytes"] = nbytes
        for rnd in range(2):
            for backend in ("dcp", "tessera"):
                path = "%s/%s/%s" % (out, kind, backend)
                clean(path, rank)
                cold(rank)  # each save from the same state of memory: no other write still in flight
                ts = timed(lambda: dcp.save(sd, storage_writer=writer(backend, path, kind)))
                res["cold"] = cold(rank) and res.get("cold", True)
                tl = timed(lambda: dcp.load(zero, storage_reader=reader(backend, path)))
                res[kind, backend, "save"] = min(ts, res.get((kind, backend, "save"), ts))
                res[kind, backend, "load"] = min(tl, res.get((kind, backend, "load"), tl))
                if rank == 0:
                    res[kind, backend, "disk"] = du(path)
            # the library alone, after the two (its save only)
            path = "%s/%s/engine/step-00000001" % (out, kind)
            clean(path, rank)
            cold(rank)
            te = timed(lambda: engine_save(sd, path, rank, world, kind))
            res[kind, "engine", "save"] = min(te, res.get((kind, "engine", "save"), te))
            if SMOKE and rank == 0:  # the script's check: what it wrote is a checkpoint
                with tessera.open(path) as ck:
                    ck.verify()
                    assert len(ck.tensors) == len(sd), (len(ck.tensors), len(sd))
        if kind == "124m":
            for rnd in range(2):
                for backend in ("dcp", "tessera"):
                    path = "%s/async/%s" % (out, backend)
                    clean(path, rank)
                    dist.barrier()
                    t = time.perf_counter()
                    fut = dcp.async_save(sd, storage_writer=writer(backend, path))
                    blocked = time.perf_counter() - t
                    fut.result()
                    dist.barrier()
                    res["async", backend] = min(blocked, res.get(("async", backend), blocked))
            for rnd in range(2):
                for backend in (None, "dcp", "tessera"):
                    path = "%s/loop/%s" % (out, backend)
                    clean(path, rank)
                    t = step_loop(sd, backend, path, rank, save_pg)
                    res["loop", backend] = min(t, res.get(("loop", backend), t))
                    clean(path, rank)
        del sd, zero
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0:
        q.put(res)


def s3_client_config():
    from s3torchconnector import S3ClientConfig
    return S3ClientConfig(force_path_style=True)  # a server on loopback: no bucket host names


def s3_fs():
    """s3torchconnector's file system on AWS_ENDPOINT_URL (its DCP classes take no
    endpoint; their client does)."""
    from s3torchconnector._s3client import S3Client
    from s3torchconnector.dcp import S3FileSystem
    region = os.environ["AWS_REGION"]
    return S3FileSystem(region, s3_client=S3Client(region, endpoint=os.environ["AWS_ENDPOINT_URL"],
                                                   s3client_config=s3_client_config()))


def s3_storage(backend, path, write):
    """DCP with s3torchconnector (S3StorageWriter at thread_count = the cores, the
    Reader's default dcp_optimized reads) or tessera's plug-in, at s3:// path:
    a save through AWS_ENDPOINT_URL, a load straight from S3_LOAD_ENDPOINT where
    it is set (the server behind tools/bench_dcp_s3.sh's proxy, which only
    uploads need), both clients alike."""
    os.environ["AWS_ENDPOINT_URL"] = os.environ["S3_SAVE_ENDPOINT" if write else "S3_LOAD_ENDPOINT"]
    if backend == "tessera":
        return tessera.dcp.Writer(path) if write else tessera.dcp.Reader(path)
    from s3torchconnector.dcp import S3StorageReader, S3StorageWriter
    region = os.environ["AWS_REGION"]
    st = S3StorageWriter(region, path, s3client_config=s3_client_config(), thread_count=CORES) if write else \
        S3StorageReader(region, path, s3client_config=s3_client_config())
    st.fs = s3_fs()
    return st


def same_values(got, want, what):
    for k, v in want.items():
        a, b = got[k], v
        if isinstance(b, DTensor):
            a, b = a.to_local(), b.to_local()
        if not torch.equal(a, b):
            raise SystemExit("bench dcp: %s: %s loaded differs from what was saved" % (what, k))


def s3_worker(rank, world, url, port, q):
    """Save (the best of two, alternately) and load in the saved layout of the
    124m state to the bucket, each load's values checked against the saved ones."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port, rank=rank, world_size=world)
    from torch.distributed.device_mesh import init_device_mesh
    mesh = init_device_mesh("cpu", (world,))
    sd, nbytes = state("124m", mesh, rank, world)
    res = {"bytes": nbytes}
    for rnd in range(2):
        for backend in ("dcp", "tessera"):
            zero, _ = state("124m", mesh, rank, world, zero=True)
            path = "%s/%s/r%d/step-00000001" % (url, backend, rnd)
            ts = timed(lambda: dcp.save(sd, storage_writer=s3_storage(backend, path, True)))
            tl = timed(lambda: dcp.load(zero, storage_reader=s3_storage(backend, path, False)))
            same_values(zero, sd, "s3 %s, %s" % (backend, path))
            res["save", backend] = min(ts, res.get(("save", backend), ts))
            res["load", backend] = min(tl, res.get(("load", backend), tl))
            del zero
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0:
        q.put(res)


def s3_main(url, world):
    """The S3 comparison (--s3 URL): DCP with s3torchconnector against tessera's
    plug-in, both to the server at AWS_ENDPOINT_URL."""
    res = run_ranks(s3_worker, world, url)
    whole_loads(res, lambda backend: s3_storage(backend, "%s/%s/r1/step-00000001" % (url, backend), False))
    b = res["bytes"]
    for what, key, goal, want in (("save", "save", ">= 3x DCP's throughput", 3),
                                  ("load in the saved layout", "load", "none: for the record", 0),
                                  ("load on 1 process (every tensor whole)", "reshard", ">= 2x DCP's speed", 2)):
        d, t = res[key, "dcp"], res[key, "tessera"]
        print("s3 %s, 124m parameters and AdamW moments, f32, %.2f GB, %s: DCP with s3torchconnector "
              "%.2f s (%.0f MB/s), tessera %.2f s (%.0f MB/s): %.2fx (goal %s)  %s" %
              (what, b / 1e9, "1 process" if key == "reshard" else "%d processes" % world, d, b / d / 1e6, t,
               b / t / 1e6, d / t, goal, "ok" if d / t >= want else "MISSED"))


def results(ps, q):
    """Rank 0's results; a rank that died ends the run at once, saying so (the
    others are left in a collective: they are stopped)."""
    import queue
    while True:
        try:
            res = q.get(timeout=2)
            break
        except queue.Empty:
            dead = [p for p in ps if p.exitcode not in (None, 0)]
            if dead:
                for p in ps:
                    p.kill()
                raise SystemExit("bench dcp: a process failed (exit %s); its error is above" % dead[0].exitcode)
    for p in ps:
        p.join()
    return res


def run_ranks(target, world, *args):
    """target(rank, world, *args, port, q) on `world` forked processes of one
    gloo group on loopback; rank 0's results."""
    with socket.socket() as so:
        so.bind(("127.0.0.1", 0))
        port = so.getsockname()[1]
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    ps = [ctx.Process(target=target, args=(r, world) + args + (port, q)) for r in range(world)]
    for p in ps:
        p.start()
    return results(ps, q)


def whole_loads(res, storage_of, cold=False):
    """Another world size: this process alone loads every tensor of the 124m
    state whole from storage_of(backend), twice, alternately (cold: the page
    cache emptied before each); the best of each into res["reshard", backend]."""
    torch.set_num_threads(CORES)
    for rnd in range(2):
        for backend in ("dcp", "tessera"):
            sd, _ = state("124m", None, 0, 1, zero=True)
            if cold:
                res["cold"] = drop_cache() and res["cold"]
            t = time.perf_counter()
            dcp.load(sd, storage_reader=storage_of(backend))
            t = time.perf_counter() - t
            res["reshard", backend] = min(t, res.get(("reshard", backend), t))
            del sd


def main():
    args = [a for a in sys.argv[1:] if a != "--smoke"]
    if "--s3" in args:
        i = args.index("--s3")
        os.environ.setdefault("S3_SAVE_ENDPOINT", os.environ["AWS_ENDPOINT_URL"])
        os.environ.setdefault("S3_LOAD_ENDPOINT", os.environ["AWS_ENDPOINT_URL"])
        url = args[i + 1]
        del args[i:i + 2]
        return s3_main(url.rstrip("/"), int(args[0]) if args else 2)
    out, world = os.path.abspath(args[0]), int(args[1]) if len(args) > 1 else 2
    if os.path.exists(out):
        shutil.rmtree(out)
    os.makedirs(out)
    res = run_ranks(worker, world, out)
    whole_loads(res, lambda backend: reader(backend, "%s/124m/%s" % (out, backend)), cold=True)
    gb = 1e9
    print("loads: %s" % ("from disk (the page cache emptied before each)" if res["cold"] else
                         "the page cache could not be emptied (not root?): DCP's files may load from memory"))
    b124, bbf = res["124m", "bytes"], res["bf16", "bytes"]

    def line(what, d, t, _, ratio, goal, ok):
        print("%s: DCP %s, tessera %s: %.2fx (goal %s)  %s" % (what, d, t, ratio, goal, "ok" if ok else "MISSED"))
    for kind, b in (("124m", b124), ("bf16", bbf)):
        d, t = res[kind, "dcp", "save"], res[kind, "tessera", "save"]
        name = "124m parameters and AdamW moments, f32, %.2f GB" % (b / gb) if kind == "124m" else \
            "1 GiB of bf16 N(0, 0.02) (tessera: codec bytegroup)"
        line("save, %s, %d processes" % (name, world), "%.2f s (%.0f MB/s)" % (d, b / d / 1e6),
             "%.2f s (%.0f MB/s)" % (t, b / t / 1e6), "", d / t, ">= 3x DCP's throughput", d / t >= 3)
        t = res[kind, "engine", "save"]
        line("save, %s, tessera's library alone (no DCP planning)" % name, "%.2f s" % d,
             "%.2f s (%.0f MB/s)" % (t, b / t / 1e6), "", d / t, "none: for the record", True)
        dd, td = res[kind, "dcp", "disk"], res[kind, "tessera", "disk"]
        line("on disk, %s" % name, "%.1f MB" % (dd / 1e6), "%.1f MB" % (td / 1e6), "", td / dd,
             "<= 0.75x DCP's bytes" if kind == "bf16" else "none for f32", kind != "bf16" or td / dd <= 0.75)
        d, t = res[kind, "dcp", "load"], res[kind, "tessera", "load"]
        line("load in the saved layout, %s" % name, "%.2f s" % d, "%.2f s" % t, "", d / t, "none: for the record",
             True)
    d, t = res["reshard", "dcp"], res["reshard", "tessera"]
    line("load on 1 process of the 124m state saved on %d (every tensor whole)" % world, "%.2f s" % d, "%.2f s" % t,
         "", d / t, ">= 2x DCP's speed", d / t >= 2)
    d, t = res["async", "dcp"], res["async", "tessera"]
    line("dcp.async_save blocked time, 124m state", "%.3f s" % d, "%.3f s" % t, "", t / d,
         "<= 1x DCP's (the staging is DCP's for both)", t <= d * 1.05)
    base = res["loop", None]
    d, t = res["loop", "dcp"] - base, res["loop", "tessera"] - base
    line("step cost of async saves every 5 steps (stand-in loop, %.3f s a step without)" % base,
         "+%.3f s a step" % d, "+%.3f s a step" % t, "", t / d if d > 0 else float("inf"), "<= 1x DCP's",
         t <= d * 1.05)
    shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
