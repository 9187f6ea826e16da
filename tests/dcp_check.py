"""dcp_check.py MODE WORLD LAYOUT PATH PORT (0: a free one): PyTorch Distributed Checkpoint (DCP)
through tessera.dcp on WORLD processes of the gloo backend on loopback. MODE:
save, async, load (tessera.dcp's Writer and Reader), dcpsave, dcpload (DCP's own
FileSystemWriter and FileSystemReader: the other end of the conversions), trained
(the model of a `tessera train` checkpoint at PATH loaded into LAYOUT),
fromtrainer (TorchTitan's trainer going on from the root PATH of one), errors
(bad input, and partial loads, in one process, under PATH).

The state is a small Llama-like model's parameters, its AdamW moments and step
counts as TorchTitan lays them out (flattened: "optimizer.state.NAME.exp_avg"),
a real FSDP2 module (fully_shard) and non-tensor state (a train state and RNG
bytes), every value a function of its name, so that any process can say what a
tensor must hold. LAYOUT places the tensors: "fsdp" (DTensors sharded on dim 0
over all ranks, 1-D ones replicated), "tp" (sharded on dim 1), "2d" (a 2 x N/2
mesh: dim 0 over the first, dim 1 over the second). save and async write PATH
with dcp.save / dcp.async_save; load fills a zeroed state of the same shapes in
LAYOUT with dcp.load and checks every value, then each tensor read whole by the
C reader (tessera.open). WORLD 1 loads without a process group. Prints "FAIL:
..." for each failed check; exits 1 if any."""
import datetime
import os
import sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

import tessera
import tessera.dcp

# name: (shape, dtype); uneven dims on purpose (30 rows over 4 ranks: 8, 8, 8, 6)
PARAMS = {
    "tok_embeddings.weight": ((96, 32), torch.bfloat16),
    "layers.0.attention.wq.weight": ((32, 32), torch.float32),
    "layers.0.attention_norm.weight": ((32,), torch.float32),
    "layers.1.feed_forward.w1.weight": ((48, 32), torch.float32),
    "norm.weight": ((32,), torch.float32),
    "output.weight": ((30, 32), torch.float32),
}
TRAIN_STATE = {"step": 7, "data_pos": 123456, "note": "tessera.dcp"}


def value(name, shape, dtype):
    """The global tensor `name` holds: a function of its name alone."""
    g = torch.Generator().manual_seed(sum(ord(c) * (i + 1) for i, c in enumerate(name)))
    return torch.randn(shape, generator=g).to(dtype)


def placements(layout, mesh, ndim):
    if ndim < 2:
        return [Replicate()] * mesh.ndim
    if layout == "2d":
        return [Shard(0), Shard(1)]
    return [Shard(0) if layout == "fsdp" else Shard(1)]


def fsdp_module():
    torch.manual_seed(11)
    return torch.nn.Sequential(torch.nn.Linear(32, 40), torch.nn.ReLU(), torch.nn.Linear(40, 24))


def state(layout, world, zero):
    """The state dict (zeroed with zero) on this rank."""
    mesh = None
    if world > 1:
        from torch.distributed.device_mesh import init_device_mesh
        mesh = (init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("dp", "tp")) if layout == "2d"
                else init_device_mesh("cpu", (world,)))

    def place(name, shape, dtype):
        t = torch.zeros(shape, dtype=dtype) if zero else value(name, shape, dtype)
        return distribute_tensor(t, mesh, placements(layout, mesh, len(shape))) if mesh is not None else t
    sd = {}
    for name, (shape, dtype) in PARAMS.items():
        sd[name] = place(name, shape, dtype)
    sd["optimizer"] = {"state": {name: {"exp_avg": place(name + ".exp_avg", shape, torch.float32),
                                        "exp_avg_sq": place(name + ".exp_avg_sq", shape, torch.float32),
                                        "step": torch.tensor(0.0 if zero else 7.0)}
                                 for name, (shape, _) in PARAMS.items()},
                       "param_groups": [{"lr": 0.0 if zero else 3e-4, "betas": (0.9, 0.95), "weight_decay": 0.1,
                                         "params": sorted(PARAMS)}]}
    # DCP loads the keys the target has: placeholders of the same types
    sd["train_state"] = {k: type(v)() for k, v in TRAIN_STATE.items()} if zero else dict(TRAIN_STATE)
    sd["rng"] = torch.zeros(16, dtype=torch.uint8) if zero else torch.arange(16, dtype=torch.uint8)
    m = fsdp_module()
    if zero:
        for p in m.parameters():
            torch.nn.init.zeros_(p)
    if mesh is not None:
        from torch.distributed.fsdp import fully_shard
        fully_shard(m, mesh=mesh if mesh.ndim == 1 else mesh["dp"])
    sd["fsdp"] = m.state_dict()
    return sd


def full(t):
    return t.full_tensor() if isinstance(t, DTensor) else t


def check_loaded(sd, path, fails):
    def same(what, got, want):
        if got.dtype != want.dtype or got.shape != want.shape or not torch.equal(got, want):
            fails.append("%s: loaded %s %s, expected %s %s" % (what, got.dtype, tuple(got.shape), want.dtype,
                                                             tuple(want.shape)))
    for name, (shape, dtype) in PARAMS.items():
        same(name, full(sd[name]), value(name, shape, dtype))
        for k in ("exp_avg", "exp_avg_sq"):
            same(name + "." + k, full(sd["optimizer"]["state"][name][k]),
                 value(name + "." + k, shape, torch.float32))
        same(name + ".step", sd["optimizer"]["state"][name]["step"], torch.tensor(7.0))
    if sd["optimizer"]["param_groups"][0]["lr"] != 3e-4:
        fails.append("param_groups: lr %r" % sd["optimizer"]["param_groups"][0]["lr"])
    if sd["train_state"] != TRAIN_STATE:
        fails.append("train_state: %r" % sd["train_state"])
    same("rng", sd["rng"], torch.arange(16, dtype=torch.uint8))
    ref = fsdp_module().state_dict()
    for k, v in ref.items():
        same("fsdp." + k, full(sd["fsdp"][k]), v)
    if path is None:
        return
    # the C reader agrees: every tensor in one call (read_many), straight into
    # torch tensors' memory
    want = {name: value(name, shape, dtype) for name, (shape, dtype) in PARAMS.items()}
    want.update({"fsdp." + k: v for k, v in ref.items()})
    got = {name: torch.empty_like(v) for name, v in want.items()}
    with tessera.open(path) as ck:
        ck.read_many([(name, None, None, (t.view(torch.int16) if t.dtype == torch.bfloat16 else t).numpy().reshape(-1))
                      for name, t in got.items()])
    for name, v in want.items():
        same("tessera.open: " + name, got[name], v)


def trained(layout, world, path, fails):
    """The model of a checkpoint of `tessera train` loaded by dcp.load into
    DTensors of LAYOUT (names as TorchTitan's Llama module has them), AdamW's
    moments under TorchTitan's names (optimizer.state.NAME.exp_avg: the trainer
    keeps optim.exp_avg.NAME), and the trainer's blob train.step as bytes: equal
    to what the C reader reads."""
    from torch.distributed.device_mesh import init_device_mesh
    mesh = (init_device_mesh("cpu", (2, world // 2)) if layout == "2d" else init_device_mesh("cpu", (world,))) \
        if world > 1 else None
    with tessera.open(path) as ck:
        names = [n for n, t in ck.tensors.items() if t.group == "model"]
        sd = {}

        def zeros(n, dtype):
            z = torch.zeros(ck.tensors[n].shape, dtype=dtype)
            return distribute_tensor(z, mesh, placements(layout, mesh, z.dim())) if mesh is not None else z
        for n in names:
            sd[n] = zeros(n, torch.float32 if ck.tensors[n].dtype == "f32" else torch.bfloat16)
            for k in ("exp_avg", "exp_avg_sq"):  # the trainer's moments, under TorchTitan's names
                sd["optimizer.state.%s.%s" % (n, k)] = zeros("optim.%s.%s" % (k, n), torch.float32)
        sd["train.step"] = b""
        dcp.load(sd, storage_reader=tessera.dcp.Reader(path))
        for n in names:
            if not torch.equal(full(sd[n]), ck.read(n, torch=True)):
                fails.append("trained: %s differs" % n)
            for k in ("exp_avg", "exp_avg_sq"):
                alias, real = "optimizer.state.%s.%s" % (n, k), "optim.%s.%s" % (k, n)
                if not torch.equal(full(sd[alias]), ck.read(real, torch=True)):
                    fails.append("trained: optimizer.state.%s.%s is not the trainer's optim.%s.%s" % (n, k, k, n))
        # a partial load through an alias: the tensor is not also unexpected
        # under its own name, and an alias left unread is not named
        first = "optimizer.state.%s.exp_avg" % names[0]
        r = tessera.dcp.load({first: zeros("optim.exp_avg." + names[0], torch.float32)}, path, strict=False)
        if r.missing_keys or "optim.exp_avg." + names[0] not in ck.tensors or \
                "optim.exp_avg." + names[0] in r.unexpected_keys or \
                "optim.exp_avg_sq." + names[0] not in r.unexpected_keys or \
                any(k.startswith("optimizer.state.") for k in r.unexpected_keys):
            fails.append("trained: a partial load of %s: %r" % (first, r))
        if sd["train.step"] != ck.blob("train.step"):
            fails.append("trained: train.step %r, the blob %r" % (sd["train.step"], ck.blob("train.step")))
        if len(names) < 10:
            fails.append("trained: only %d model tensors" % len(names))


def titan(layout, world, paths, fails):
    """A checkpoint of `tessera train` (SRC) as PyTorch holds a TorchTitan run's
    state: the model's DTensors, AdamW's moments and step under TorchTitan's
    flattened names (optimizer.state.NAME.exp_avg), its param groups and
    train_state.step (a 0-d int32 tensor, as TorchTitan's TrainState has it),
    saved by dcp.save through tessera.dcp.Writer into DST (PATH is SRC,DST);
    without the moments with layout "model"."""
    from torch.distributed.device_mesh import init_device_mesh
    src, dst = paths.split(",")
    mesh = init_device_mesh("cpu", (world,)) if world > 1 else None

    def place(t):
        return distribute_tensor(t, mesh, [Shard(0)]) if mesh is not None and t.dim() else t
    with tessera.open(src) as ck:
        step = int.from_bytes(ck.blob("train.step"), "little")
        names = [n for n, t in ck.tensors.items() if t.group == "model"]
        sd = {n: place(ck.read(n, torch=True)) for n in names}
        if layout != "model":
            sd["optimizer"] = {
                "state": {n: {"exp_avg": place(ck.read("optim.exp_avg." + n, torch=True)),
                              "exp_avg_sq": place(ck.read("optim.exp_avg_sq." + n, torch=True)),
                              "step": torch.tensor(float(step))} for n in names},
                "param_groups": [{"lr": 3e-4, "betas": (0.9, 0.95), "weight_decay": 0.1, "params": names}]}
        sd["train_state"] = {"step": torch.tensor(step, dtype=torch.int32)}
    dcp.save(sd, storage_writer=tessera.dcp.Writer(dst))


def brief(v):
    if isinstance(v, torch.Tensor) and v.numel() > 1:
        return "%s %s (sum %.6g)" % (v.dtype, tuple(v.shape), float(v.double().sum()))
    return repr(v)


def titan_state(parts):
    """The whole state of TorchTitan's components (model, optimizer, lr
    schedulers, train state), as plain tensors and values: what a manager's
    save holds and its load must give back."""
    model, opt, lrs, ts = parts
    out = {"model." + k: full(v).clone() for k, v in model.state_dict().items()}
    for k, v in opt.state_dict().items():
        out["optimizer." + k] = full(v).clone() if isinstance(v, torch.Tensor) else v
    out["lr_scheduler"] = lrs.state_dict()
    out["train_state.step"] = ts.step
    return out


def manager(mode, layout, world, paths, fails):
    """TorchTitan's own CheckpointManager (the torchtitan package) with its
    OptimizersContainer (AdamW) and LRSchedulersContainer over an FSDP2 module
    (30 rows: uneven over 4 ranks) on WORLD processes; PATHS is FOLDER,REF[,OUT]:
      ttsave: 3 training steps; TorchTitan's stock manager saves step 3 into
        FOLDER (DCP's FileSystemWriter); rank 0 keeps the whole state in REF;
      ttload: the stock manager, over a module of other values, loads FOLDER's
        newest step: every value equal to REF's;
      ttplug: tessera.titan's manager (async_mode LAYOUT, keep_latest_k 2) loads
        FOLDER's newest tessera step the same way, takes one more step and saves
        it through the plug-in, its state kept in OUT."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torchtitan.components.checkpoint import CheckpointManager
    from torchtitan.components.optimizer.lr_scheduler import LRSchedulersContainer
    from torchtitan.components.optimizer.optimizer import OptimizersContainer, ParamGroupConfig
    folder, ref, out = (paths.split(",") + [None])[:3]
    rank = dist.get_rank()
    torch.manual_seed(3 if mode == "ttsave" else 99)  # a load starts from other values
    model = torch.nn.Sequential(torch.nn.Linear(32, 30), torch.nn.ReLU(), torch.nn.Linear(30, 24))
    fully_shard(model, mesh=init_device_mesh("cpu", (world,)))
    opt = OptimizersContainer.Config(
        param_groups=[ParamGroupConfig(pattern=".*", optimizer_name="AdamW",
                                       optimizer_kwargs={"lr": 1e-2, "betas": (0.9, 0.95), "weight_decay": 0.1})],
        implementation="for-loop").build(model_parts=[model])
    lrs = LRSchedulersContainer.Config(warmup_steps=2).build(optimizers=opt, training_steps=10)

    class TrainState:  # as TorchTitan's trainer keeps its step
        step = 0

        def state_dict(self):
            return {"step": torch.tensor(self.step, dtype=torch.int32)}

        def load_state_dict(self, sd):
            self.step = int(sd["step"])
    ts = TrainState()

    def train_step():
        x = torch.randn((8, 32), generator=torch.Generator().manual_seed(100 * ts.step + rank))
        model(x).square().mean().backward()
        opt.step()
        lrs.step()
        opt.zero_grad()
        ts.step += 1
    kind = CheckpointManager
    opts = dict(enable=True, folder=folder, interval=1, keep_latest_k=0, last_save_model_only=False)
    if mode == "ttplug":
        import tessera.titan
        kind = tessera.titan.CheckpointManager
        opts.update(async_mode=layout, keep_latest_k=2)
    mgr = kind.Config(**opts).build(dataloader=None, model_parts=[model], optimizers=opt, lr_schedulers=lrs,
                                    states={"train_state": ts}, sd_adapter=None)
    parts = (model, opt, lrs, ts)
    if mode == "ttsave":
        for _ in range(3):
            train_step()
        mgr.save(curr_step=ts.step)
        out = ref
    else:
        if not mgr.load():
            fails.append("%s: nothing loaded from %s" % (mode, folder))
            return
        want = torch.load(ref, weights_only=False)
        got = titan_state(parts)
        for k in sorted(set(want) | set(got)):
            a, b = got.get(k), want.get(k)
            same = (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype and
                    torch.equal(a, b)) if isinstance(b, torch.Tensor) else a == b
            if not same:
                fails.append("%s on %d: %s: loaded %s, saved %s" % (mode, world, k, brief(a), brief(b)))
        if mode == "ttplug":
            train_step()
            mgr.save(curr_step=ts.step)
            mgr.maybe_wait_for_saving()
    if out is not None:
        st = titan_state(parts)
        if rank == 0:
            torch.save(st, out)
    mgr.close()


def from_trainer(world, root, fails):
    """TorchTitan's trainer going on from a checkpoint of `tessera train`:
    tessera.titan's CheckpointManager (strict, as TorchTitan loads) over ROOT,
    a module of the checkpoint's parameters (FSDP2 over WORLD processes),
    TorchTitan's AdamW (OptimizersContainer, for-loop) and schedule, and its
    trainer's state (step, ntokens_seen). Step 2 of 4 loads whole: the
    parameters and moments are the trainer's, AdamW's count and param groups
    and the schedule's count are its blobs' (the rate the next step's); how
    PyTorch runs AdamW (foreach, fused) stays the loader's; then a step runs
    on it. A loader wanting a key the checkpoint lacks fails naming it."""
    import tomllib
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torchtitan.components.optimizer.lr_scheduler import LRSchedulersContainer
    from torchtitan.components.optimizer.optimizer import OptimizersContainer, ParamGroupConfig
    from torch.distributed.checkpoint.api import CheckpointException
    import tessera.titan
    with tessera.open(os.path.join(root, "step-00000002")) as ck:
        names = [n for n, t in ck.tensors.items() if t.group == "model"]
        want = {n: ck.read(n, torch=True) for n in names}
        moments = {(n, k): ck.read("optim.%s.%s" % (k, n), torch=True) for n in names for k in ("exp_avg", "exp_avg_sq")}
        step = int.from_bytes(ck.blob("train.step"), "little")
        sched = dict(w.partition("=")[::2] for w in ck.blob("train.lr_scheduler").decode().split())
        cfg = tomllib.loads(ck.blob("train.config").decode())
    model = torch.nn.Module()
    for n in names:  # the checkpoint's names: nested modules, a parameter at each leaf
        *path, leaf = n.split(".")
        m = model
        for p in path:
            if not hasattr(m, p):
                m.add_module(p, torch.nn.Module())
            m = getattr(m, p)
        m.register_parameter(leaf, torch.nn.Parameter(torch.zeros(want[n].shape)))
    fully_shard(model, mesh=init_device_mesh("cpu", (world,)))
    o = cfg["optimizer"]
    opt = OptimizersContainer.Config(
        param_groups=[ParamGroupConfig(pattern=".*", optimizer_name="AdamW", optimizer_kwargs={
            "lr": o["lr"], "betas": (o["beta1"], o["beta2"]), "eps": o["eps"], "weight_decay": o["weight_decay"]})],
        implementation="for-loop").build(model_parts=[model])
    lrs = LRSchedulersContainer.Config(warmup_steps=cfg["lr_scheduler"]["warmup_steps"]).build(
        optimizers=opt, training_steps=cfg["training"]["steps"] + 10)  # the run goes on past its end

    class TrainState:  # TorchTitan's trainer's (torchtitan.trainer.Trainer.state_dict)
        step, ntokens_seen = 0, 0

        def state_dict(self):
            return {"step": self.step, "ntokens_seen": self.ntokens_seen}

        def load_state_dict(self, sd):
            self.step, self.ntokens_seen = sd["step"], sd["ntokens_seen"]
    ts = TrainState()
    # tessera's data position is no state of TorchTitan's data loader: left out, as a TorchTitan job would
    mgr = tessera.titan.CheckpointManager.Config(enable=True, folder=root, interval=1000,
                                                 exclude_from_loading=["dataloader"]).build(
        dataloader=None, model_parts=[model], optimizers=opt, lr_schedulers=lrs, states={"train_state": ts},
        sd_adapter=None)
    if not mgr.load(step=2):  # mid-schedule: the next step's rate is not the last one's
        fails.append("from_trainer: nothing loaded from %s" % root)
        return
    got = {k: full(v) for k, v in model.state_dict().items()}
    for n in names:
        if not torch.equal(got[n], want[n]):
            fails.append("from_trainer: %s is not the trainer's" % n)
    byname = dict(model.named_parameters())
    for g in opt.optimizers[0].param_groups:
        seen = {k: g[k] for k in ("lr", "initial_lr", "betas", "eps", "weight_decay", "foreach", "fused")}
        expect = {"lr": float(sched["next_lr"]), "initial_lr": o["lr"], "betas": (o["beta1"], o["beta2"]),
                  "eps": o["eps"], "weight_decay": o["weight_decay"], "foreach": False, "fused": False}
        if seen != expect:
            fails.append("from_trainer: AdamW's param group %s, the trainer's %s" % (seen, expect))
    for n in names:
        st = opt.optimizers[0].state[byname[n]]
        for k in ("exp_avg", "exp_avg_sq"):
            if not torch.equal(full(st[k]), moments[(n, k)]):
                fails.append("from_trainer: AdamW's %s of %s is not the trainer's optim.%s.%s" % (k, n, k, n))
        if float(st["step"]) != step:
            fails.append("from_trainer: AdamW's count of %s is %s, the trainer's %d" % (n, float(st["step"]), step))
    tr = cfg["training"]
    ntok = step * tr["global_batch_size"] // (cfg["parallelism"]["data_parallel_replicate_degree"] *
                                              cfg["parallelism"]["data_parallel_shard_degree"]) * tr["seq_len"]
    if (lrs.schedulers[0].last_epoch, ts.step, ts.ntokens_seen) != (step, step, ntok):
        fails.append("from_trainer: the schedule's count %d, the train state's step %d and tokens %d; the trainer's "
                     "%d, %d and %d" % (lrs.schedulers[0].last_epoch, ts.step, ts.ntokens_seen, step, step, ntok))
    # a step on it: every parameter moves, AdamW counts one more
    before = {k: v.clone() for k, v in got.items()}
    sum(p.to_local().square().sum() for p in model.parameters()).backward()
    opt.step()
    lrs.step()
    after = {k: full(v) for k, v in model.state_dict().items()}
    if any(torch.equal(before[n], after[n]) for n in names) or \
            float(opt.optimizers[0].state[byname[names[0]]]["step"]) != step + 1:
        fails.append("from_trainer: the step after the load did not update every parameter")
    # strict as TorchTitan is: a state the checkpoint lacks is named
    try:
        tessera.dcp.load({"dataloader.dp_rank_0": b""}, root)
        fails.append("from_trainer: a load of a data loader's state the checkpoint lacks went through")
    except (RuntimeError, CheckpointException) as e:  # DCP's, on every rank, for a failure on any
        if "dataloader.dp_rank_0" not in str(e):
            fails.append("from_trainer: a missing key, unclear error: %s" % e)
    mgr.close()


def run(rank, mode, world, layout, path, port, q):
    fails = []
    try:
        if world > 1:
            # a rank that fails leaves the others in a collective: they give up
            # after 2 minutes (gloo's default is 30), and the test says why
            dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port, rank=rank, world_size=world,
                                    timeout=datetime.timedelta(seconds=120))
        if mode == "trained":
            trained(layout, world, path, fails)
        elif mode == "titan":
            titan(layout, world, path, fails)
        elif mode == "fromtrainer":
            from_trainer(world, path, fails)
        elif mode in ("ttsave", "ttload", "ttplug"):
            manager(mode, layout, world, path, fails)
        elif mode in ("save", "async", "dcpsave"):
            sd = state(layout, world, zero=False)
            w = dcp.FileSystemWriter(path) if mode == "dcpsave" else tessera.dcp.Writer(path)
            if mode == "async":
                dcp.async_save(sd, storage_writer=w).result()
            else:
                dcp.save(sd, storage_writer=w)
        else:
            sd = state(layout, world, zero=True)
            ours = mode == "load"
            dcp.load(sd, storage_reader=tessera.dcp.Reader(path) if ours else dcp.FileSystemReader(path))
            check_loaded(sd, path if ours else None, fails)
        if world > 1:
            dist.barrier()
            dist.destroy_process_group()
    except Exception as e:  # noqa: BLE001 (reported as a failed check, with its type)
        import traceback
        traceback.print_exc()
        fails.append("rank %d: %s: %s" % (rank, type(e).__name__, e))
    q.put((rank, fails))


def errors(path):
    """Bad input, in one process: a key tessera cannot name, a damaged data
    file; each fails naming what and why, and commits nothing. And the options
    of one process: a partial load, the writer's codec."""
    fails = []

    def expect_error(what, fn, *words):
        try:
            fn()
        except BaseException as e:  # noqa: BLE001 (DCP's CheckpointException, which wraps the plug-in's, is one)
            import traceback
            msg = "".join(traceback.format_exception(e))
            if not all(w in msg for w in words):
                fails.append("%s: the error %r lacks %s" % (what, msg[-400:], words))
            return
        fails.append("%s: no error" % what)
    bad = os.path.join(path, "bad", "step-00000001")
    expect_error("a key with a space", lambda: dcp.save({"bad key": torch.zeros(3)},
                                                        storage_writer=tessera.dcp.Writer(bad)), "bad key")
    if os.path.exists(os.path.join(bad, "MANIFEST")):
        fails.append("a failed save committed")
    good = os.path.join(path, "good", "step-00000001")
    w = torch.randn((64, 64), generator=torch.Generator().manual_seed(1))  # 16 KiB that do not compress
    dcp.save({"w": w}, storage_writer=tessera.dcp.Writer(good))
    data = os.path.join(good, "data-00000.tsd")
    with open(data, "r+b") as f:  # a byte in the middle of w's frame inverted
        at = os.path.getsize(data) // 2
        f.seek(at)
        b = f.read(1)
        f.seek(at)
        f.write(bytes([b[0] ^ 0xFF]))
    expect_error("a damaged data file", lambda: dcp.load({"w": torch.zeros(64, 64)},
                                                         storage_reader=tessera.dcp.Reader(good)), "data-00000.tsd",
                 "checksum")
    # a partial load: strict=False loads what is there and says what it skipped
    part = os.path.join(path, "part", "step-00000001")
    full_sd = {"a": torch.arange(12.0).reshape(3, 4), "b": torch.ones(64, 64), "c": {"d": torch.full((5,), 7)}}
    dcp.save(full_sd, storage_writer=tessera.dcp.Writer(part))
    sd = {"a": torch.zeros(3, 4), "c": {"d": torch.zeros(5, dtype=torch.int64)}, "zz_absent": torch.zeros(2)}
    r = tessera.dcp.load(sd, part, strict=False)
    if not (torch.equal(sd["a"], full_sd["a"]) and torch.equal(sd["c"]["d"], full_sd["c"]["d"]) and
            torch.equal(sd["zz_absent"], torch.zeros(2)) and r.missing_keys == ["zz_absent"] and r.unexpected_keys == ["b"]):
        fails.append("a partial load: %r, a %s" % (r, sd["a"].tolist()))
    expect_error("a strict load of a key the checkpoint lacks",
                 lambda: tessera.dcp.load({"zz_absent": torch.zeros(2)}, part), "zz_absent")
    # a checkpoint that says it is tessera train's (its blobs) but whose
    # train.config is no TOML of the trainer's: the Reader refuses it, naming
    # the checkpoint, the blobs and the reason
    odd = os.path.join(path, "odd", "step-00000001")
    dcp.save({"w": torch.zeros(2), "train.model": "x", "train.step": 1, "train.lr_scheduler": "last_step=1",
              "train.config": "[optimizer"}, storage_writer=tessera.dcp.Writer(odd))
    expect_error("a trainer's blobs that do not parse", lambda: tessera.dcp.Reader(odd).read_metadata(), odd,
                 "train.config", "not read as tessera train writes them")
    # the codec: bytegroup stores bf16 N(0, 0.02) in well under its raw bytes, the
    # values the same, read straight into a contiguous destination and copied into
    # a strided one; a codec that is none refused, naming it
    small = os.path.join(path, "bytegroup", "step-00000001")
    g = torch.Generator().manual_seed(2)
    bsd = {"h": (torch.randn((256, 512), generator=g) * 0.02).to(torch.bfloat16),
           "f": torch.randn((96, 40), generator=g)}
    dcp.save(bsd, storage_writer=tessera.dcp.Writer(small, codec="bytegroup"))
    with tessera.open(small) as ck:
        h = ck.tensors["h"]
        if not h.stored_bytes < 0.8 * h.raw_bytes:
            fails.append("codec bytegroup: bf16 stored in %d of %d bytes" % (h.stored_bytes, h.raw_bytes))
    got = {"h": torch.zeros((256, 512), dtype=torch.bfloat16), "f": torch.zeros((40, 96)).t()}
    dcp.load(got, storage_reader=tessera.dcp.Reader(small))
    if not (torch.equal(got["h"], bsd["h"]) and torch.equal(got["f"], bsd["f"])):
        fails.append("codec bytegroup: the values read back differ")
    expect_error("a codec that is none", lambda: tessera.dcp.Writer(small, codec="lz4"), "lz4", "bytegroup")
    for f in fails:
        print("FAIL: " + f)
    print("errors: %s" % ("FAILED" if fails else "ok"))
    sys.exit(1 if fails else 0)


def main():
    if sys.argv[1] == "errors":
        import warnings
        warnings.simplefilter("ignore", UserWarning)
        return errors(sys.argv[4])
    mode, world, layout, path, port = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5])
    if port == 0:  # a free port of loopback
        import socket
        with socket.socket() as so:
            so.bind(("127.0.0.1", 0))
            port = so.getsockname()[1]
    ctx = mp.get_context("fork")  # torch imported once (the parent has started no thread yet)
    q = ctx.Queue()
    ps = [ctx.Process(target=run, args=(r, mode, world, layout, path, port, q)) for r in range(world)]
    for p in ps:
        p.start()
    out = [q.get(timeout=300) for _ in ps]
    for p in ps:
        p.join()
    fails = [f for _, fs in sorted(out) for f in fs]
    for f in fails:
        print("FAIL: " + f)
    print("%s on %d process(es), %s: %s" % (mode, world, layout, "FAILED" if fails else "ok"))
    sys.exit(1 if fails else 0)


if __name__ == "__main__":
    main()
