"""tessera.titan: TorchTitan's checkpoint manager, saving and loading tessera checkpoints.

    from tessera.titan import CheckpointManager
    # a TorchTitan job's config: checkpoint=CheckpointManager.Config(enable=True, folder="checkpoint", ...)
    mgr = CheckpointManager.Config(enable=True, folder="ckpt", interval=500).build(
        dataloader=dl, model_parts=[model], optimizers=opt, lr_schedulers=lrs,
        states={"train_state": trainer}, sd_adapter=None)
    mgr.load()           # the newest committed tessera step under ckpt/, or a fresh start
    mgr.save(curr_step)  # every `interval` steps, through tessera.dcp.Writer

TorchTitan's own CheckpointManager (torchtitan.components.checkpoint, which this
module needs installed), with DCP's FileSystemWriter and Reader swapped for
tessera.dcp's: the same state in the same names (the model flattened,
"optimizer.state.NAME.exp_avg", "lr_scheduler.last_epoch", "train_state", the
data loader's), the same options (interval, async_mode "async" and
"async_with_pinned_mem" (a GPU's: TorchTitan's staging), keep_latest_k (counting
committed steps only), exclude_from_loading, initial_load_path,
last_save_model_only with export_dtype). What changes is the storage: each step is
a tessera step directory, step-00000100, written by libtessera (one data file a
rank, compressed and checksummed) and committed by its MANIFEST, and the step
loaded is tessera's newest committed one (a step whose save died half-way, or that
a fence or a poisoning ruled out, is passed over). Config.codec is the Writer's
("auto", "bytegroup", "zstd", "raw"). Hugging Face saves and loads
(last_save_in_hf, initial_load_in_hf) stay DCP's. The folder is a local one (a
bucket: tessera.dcp's Writer and Reader directly).

A checkpoint it writes loads in any other world size and sharding, through this
manager or tessera.dcp.Reader, and converts to a DCP folder that TorchTitan's
stock manager loads (tessera export --format dcp); a DCP folder of TorchTitan's
comes in through tessera import --from dcp. A checkpoint of `tessera train`
loads too (its state under TorchTitan's names: tessera.dcp's Reader), with
exclude_from_loading=["dataloader"]: the job goes on from the trainer's step,
AdamW and schedule.
"""
import os
import re
from dataclasses import dataclass

import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType
from torchtitan.components.checkpoint import MODEL, AsyncMode
from torchtitan.components.checkpoint import CheckpointManager as _TitanManager
from torchtitan.tools.utils import GarbageCollection

from . import latest
from .dcp import LoadPlanner, Reader, Writer

__all__ = ["CheckpointManager"]

_STEP_DIR = re.compile(r"step-(\d{8,})")


class CheckpointManager(_TitanManager):
    """TorchTitan's CheckpointManager over tessera checkpoints (see the module's text)."""

    @dataclass(kw_only=True, slots=True)
    class Config(_TitanManager.Config):
        codec: str = "auto"
        """tessera's codec for the data files: auto, bytegroup, zstd or raw."""

    def __init__(self, config, **kwargs):
        super().__init__(config, **kwargs)
        self.codec = config.codec

    def _purge_stale_checkpoints(self):
        # keep_latest_k counts committed steps: a save still in flight (an async
        # one, committed later) is not one of them, so the step a crash would
        # resume from is never removed for it. A step goes uncommitted at once
        # (its MANIFEST first, as tessera removes steps), the rest of it in
        # TorchTitan's purge thread; a step directory older than the newest
        # committed one and never committed (a save that died) goes as well.
        if not self._should_purge():
            return
        steps = sorted((int(m.group(1)), e.path) for e in os.scandir(self.folder)
                       if e.is_dir() and (m := _STEP_DIR.fullmatch(e.name)))
        committed = [(step, path) for step, path in steps if os.path.exists(os.path.join(path, "MANIFEST"))]
        if not committed:
            return
        for _, path in committed[:-self.keep_latest_k]:
            os.remove(os.path.join(path, "MANIFEST"))
            self.purge_queue.put(path)
        for step, path in steps:
            if step < committed[-1][0] and (step, path) not in committed:
                self.purge_queue.put(path)

    def _create_checkpoint_id(self, step, folder=""):
        return os.path.join(folder or self.folder, "step-%08d" % step)

    def _find_load_step(self, folder=""):
        newest = latest(folder or self.folder)
        return -1 if newest is None else newest[0]

    def dcp_save(self, state_dict, checkpoint_id, async_mode, enable_garbage_collection=False, to_hf=False):
        if to_hf:
            return super().dcp_save(state_dict, checkpoint_id, async_mode, enable_garbage_collection, to_hf)
        writer = Writer(checkpoint_id, codec=self.codec)
        if async_mode == AsyncMode.ASYNC:
            ret = dcp.async_save(state_dict, storage_writer=writer, process_group=self.pg)
        elif async_mode == AsyncMode.ASYNC_WITH_PINNED_MEM:
            ret = dcp.async_save(state_dict, storage_writer=writer, process_group=self.pg,
                                 async_checkpointer_type=AsyncCheckpointerType.PROCESS, async_stager=self.stager)
        else:
            ret = dcp.save(state_dict, storage_writer=writer)
        if enable_garbage_collection:
            GarbageCollection.collect("GC collection invoked by checkpointer.")
        return ret

    def dcp_load(self, state_dict, checkpoint_id, from_hf, from_quantized):
        if from_hf:
            return super().dcp_load(state_dict, checkpoint_id, from_hf, from_quantized)
        dcp.load(state_dict, storage_reader=Reader(checkpoint_id), planner=LoadPlanner())
        # the model's tensors are flattened into the state dict: hand them to the module
        if MODEL in self.states:
            self.states[MODEL].load_state_dict(state_dict)
