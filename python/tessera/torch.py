"""tessera.torch: tessera checkpoints into PyTorch state dicts and modules, and back.

    import tessera.torch
    tessera.torch.load_state_dict(model, "runs/small/checkpoint")          # a module or a state dict
    tessera.torch.load_state_dict(sd, path, boxes={"output.weight": ((0, 0), (160, 128))})
    tessera.torch.save(model.state_dict(), "out/step-00000001", step=1)

Names are the checkpoint's (TorchTitan's: "layers.0.attention.wq.weight") or Hugging
Face's ("model.layers.0.self_attn.q_proj.weight"); Hugging Face names get the
rotary permutation of q and k (tessera stores Meta's interleaved order, Hugging Face
the rotate-half order), as `tessera export` writes them.
"""
import re

import numpy as np
import torch

from . import Error
from . import open as _open
from . import save as _save

__all__ = ["load_state_dict", "save", "hf_name", "tessera_name"]

# Hugging Face's name of each TorchTitan parameter name, and back
_LAYER = {
    "attention.wq.weight": "self_attn.q_proj.weight", "attention.wk.weight": "self_attn.k_proj.weight",
    "attention.wv.weight": "self_attn.v_proj.weight", "attention.wo.weight": "self_attn.o_proj.weight",
    "feed_forward.w1.weight": "mlp.gate_proj.weight", "feed_forward.w2.weight": "mlp.down_proj.weight",
    "feed_forward.w3.weight": "mlp.up_proj.weight", "attention_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
}
_TOP = {"tok_embeddings.weight": "model.embed_tokens.weight", "norm.weight": "model.norm.weight",
        "output.weight": "lm_head.weight"}
_LAYER_BACK = {v: k for k, v in _LAYER.items()}
_TOP_BACK = {v: k for k, v in _TOP.items()}


def hf_name(name):
    """The Hugging Face name of a tessera (TorchTitan) parameter name, or None."""
    if name in _TOP:
        return _TOP[name]
    m = re.fullmatch(r"layers\.(\d+)\.(.+)", name)
    return "model.layers.%s.%s" % (m.group(1), _LAYER[m.group(2)]) if m and m.group(2) in _LAYER else None


def tessera_name(name):
    """The tessera (TorchTitan) name of a Hugging Face parameter name, or None."""
    if name in _TOP_BACK:
        return _TOP_BACK[name]
    m = re.fullmatch(r"model\.layers\.(\d+)\.(.+)", name)
    return "layers.%s.%s" % (m.group(1), _LAYER_BACK[m.group(2)]) if m and m.group(2) in _LAYER_BACK else None


def _model_args(ck):
    """n_heads and n_kv_heads from the trainer's train.model blob."""
    try:
        words = dict(w.split("=", 1) for w in ck.blob("train.model").decode("ascii").split())
        return int(words["n_heads"]), int(words["n_kv_heads"])
    except (Error, KeyError, ValueError, UnicodeDecodeError) as e:
        raise Error(-1, "tessera: %s: Hugging Face names need the model's heads (the blob train.model): %s"
                    % (ck.path, e))


def _to_hf_rows(w, heads):
    """Rows of q or k from Meta's interleaved rotary order to the rotate-half order."""
    hd = w.shape[0] // heads
    return np.swapaxes(w.reshape(heads, hd // 2, 2, *w.shape[1:]), 1, 2).reshape(w.shape)


def _read(ck, tname, permute_heads, off, ext):
    """Box (off, ext) of tessera tensor tname, in Hugging Face row order when
    permute_heads: whole heads are read, permuted, then cut."""
    if not permute_heads:
        return torch.from_numpy(np.ascontiguousarray(ck.read(tname, off, ext, bf16="float32")))
    rows = ck.tensors[tname].shape[0]
    hd = rows // permute_heads
    lo, hi = off[0] // hd * hd, -(-(off[0] + ext[0]) // hd) * hd
    whole = ck.read(tname, (lo,) + tuple(off[1:]), (hi - lo,) + tuple(ext[1:]), bf16="float32")
    if hi == lo:
        return torch.from_numpy(np.ascontiguousarray(whole))
    part = _to_hf_rows(whole, (hi - lo) // hd)
    return torch.from_numpy(np.ascontiguousarray(part[off[0] - lo:off[0] - lo + ext[0]]))


def load_state_dict(target, path, boxes=None, strict=True):
    """Fills `target` (a state dict, or a module: its state dict, in place) from
    the checkpoint at `path` (any layout; a step directory or a root: its newest
    step; local or s3://). Each tensor whole, or the box boxes[name] = (offset,
    extent) of it, where the caller holds a shard. Names as the checkpoint has them
    or Hugging Face's (q and k permuted to its rotary order). Shapes must match;
    floating-point values are converted to the target's dtype, other kinds must
    match. strict: every target name must be in the checkpoint; else those that are
    not are skipped. @return the names filled (a list), with .missing_keys (target
    names the checkpoint lacks) and .unexpected_keys (checkpoint tensors no target
    name took), as torch's Module.load_state_dict says them."""
    sd = target.state_dict() if isinstance(target, torch.nn.Module) else target
    boxes = boxes or {}
    done, missing, taken = Loaded(), [], set()
    with _open(path) as ck:
        heads = None
        for name, dst in sd.items():
            tname, permute = name, 0
            if name not in ck.tensors:
                tname = tessera_name(name)
                if tname is None or tname not in ck.tensors:
                    missing.append(name)
                    continue
                if tname.endswith(("attention.wq.weight", "attention.wk.weight")):
                    heads = heads or _model_args(ck)
                    permute = heads[0] if tname.endswith("wq.weight") else heads[1]
            t = ck.tensors[tname]
            off, ext = boxes.get(name, ((0,) * len(t.shape), t.shape))
            off, ext = tuple(int(x) for x in off), tuple(int(x) for x in ext)
            if tuple(dst.shape) != ext:
                raise Error(-1, "tessera: %s: tensor '%s'%s: the checkpoint gives shape %s (%s), the target holds %s"
                            % (ck.path, name, "" if tname == name else " ('%s' there)" % tname, ext,
                               "its box" if name in boxes else "the whole tensor", tuple(dst.shape)))
            src = _read(ck, tname, permute, off, ext)
            if src.is_floating_point() != dst.is_floating_point() or \
                    (not src.is_floating_point() and src.dtype != dst.dtype):
                raise Error(-1, "tessera: %s: tensor '%s' is %s in the checkpoint; the target is %s"
                            % (ck.path, name, t.dtype, dst.dtype))
            with torch.no_grad():
                dst.copy_(src)
            done.append(name)
            taken.add(tname)
        done.unexpected_keys = sorted(set(ck.tensors) - taken)
    if strict and missing:
        raise Error(-3, "tessera: %s: no tensor for %d target name(s): %s" % (path, len(missing), ", ".join(missing[:8])
                                                                              + (" ..." if len(missing) > 8 else "")))
    done.missing_keys = missing
    return done


class Loaded(list):
    """The names load_state_dict filled, with .missing_keys and .unexpected_keys."""
    missing_keys = ()
    unexpected_keys = ()


def save(state_dict, path, step=0, blobs=None):
    """Writes the tensors of `state_dict` (names as they are) as a single-process
    checkpoint of step `step` into the step directory `path`."""
    return _save(path, dict(state_dict.items()), step=step, blobs=blobs)
