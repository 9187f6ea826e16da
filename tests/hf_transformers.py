"""tessera's checkpoints in Hugging Face transformers itself, on the CPU, run by
tests/test_hf_transformers.sh under the tests' Python (tests/py_setup.sh);
tests/hf_generate.py reads the same files by their format.

usage: hf_transformers.py DIR
DIR holds (tests/test_hf_transformers.sh makes them):
  hf/        `tessera export CKPT --format safetensors hf --dtype f32`
  ckpt/      CKPT, a step directory of `tessera train`
  ids.txt    the prompt's token ids (tessera's byte-level tokenizer), comma-separated
  text.txt   the prompt
  ref.bin    `tessera logits CKPT --tokens IDS --out ref.bin`: float32, tokens x vocabulary
Checks, each printed as it passes:
  1. README's check: AutoTokenizer turns the text into tessera's ids and back, its
     end of text is 256, and AutoModelForCausalLM's logits equal tessera's;
  2. the Python package (tessera.torch.load_state_dict) fills a transformers
     LlamaForCausalLM made from the export's config with the checkpoint itself
     (TorchTitan's names and Meta's rotary order mapped to Hugging Face's): the
     same logits;
  3. tessera.torch.save of that module's state dict (Hugging Face's names, as they
     are) reads back with tessera.open and loads into another module bit for bit,
     and verifies.
Exit 0 when every check passes."""
import os
import sys
import tempfile

import numpy as np
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

import tessera
import tessera.torch as tt

TOL = 1e-4  # relative to the largest logit: float32 sums in another order


def close(name, got, ref):
    err = float(np.abs(got - ref).max() / max(np.abs(ref).max(), 1e-30))
    print("%s: max |difference| %.3g of the largest logit (tolerance %g)" % (name, err, TOL))
    if not err <= TOL:
        sys.exit("FAIL: %s: the logits differ from tessera's" % name)


def main():
    d = sys.argv[1]
    hf = os.path.join(d, "hf")
    text = open(os.path.join(d, "text.txt"), "rb").read().decode("utf-8")
    want = [int(x) for x in open(os.path.join(d, "ids.txt")).read().split(",")]
    ref = np.fromfile(os.path.join(d, "ref.bin"), dtype="<f4")

    tok = AutoTokenizer.from_pretrained(hf)
    ids = tok(text)["input_ids"]
    if ids != want:
        sys.exit("FAIL: the tokenizer gives %s..., tessera %s..." % (ids[:8], want[:8]))
    if tok.decode(ids) != text or tok.eos_token_id != 256:
        sys.exit("FAIL: decode gives %r, end of text %s" % (tok.decode(ids)[:40], tok.eos_token_id))
    print("tokenizer: %d ids equal tessera's, decoded back to the text; end of text 256" % len(ids))
    model = AutoModelForCausalLM.from_pretrained(hf, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].float().numpy()
    ref = ref.reshape(logits.shape)
    close("export in AutoModelForCausalLM", logits, ref)

    fresh = LlamaForCausalLM(model.config).eval()
    filled = tt.load_state_dict(fresh, os.path.join(d, "ckpt"), strict=False)
    need = [k for k in fresh.state_dict() if "rotary" not in k]
    if sorted(filled) != sorted(need):
        sys.exit("FAIL: load_state_dict filled %d of %d tensors: %s" % (len(filled), len(need), sorted(set(need) - set(filled))[:4]))
    with torch.no_grad():
        close("checkpoint through tessera.torch.load_state_dict", fresh(torch.tensor([ids])).logits[0].numpy(), ref)

    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "step-00000001")
        sd = {k: v for k, v in fresh.state_dict().items() if k in filled}
        tt.save(sd, out, step=1)
        with tessera.open(out) as ck:
            for k, v in sd.items():
                if not np.array_equal(np.asarray(ck.read(k)), v.numpy()):
                    sys.exit("FAIL: %s read back differs" % k)
            ck.verify()
        again = LlamaForCausalLM(model.config).eval()
        tt.load_state_dict(again, out, strict=False)
        for k, v in again.state_dict().items():
            if k in sd and not torch.equal(v, sd[k]):
                sys.exit("FAIL: %s differs after save and load" % k)
    print("tessera.torch.save of the module and back: %d tensors bit for bit, verified" % len(sd))
    print("hf_transformers: ok (transformers %s, torch %s, numpy %s)"
          % (__import__("transformers").__version__, torch.__version__, np.__version__))


if __name__ == "__main__":
    main()
