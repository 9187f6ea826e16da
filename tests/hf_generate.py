"""The safetensors export as Hugging Face would use it, read from its files alone:
tokenizer.json (tokenizers' format: byte-level pre-tokenizer and decoder, BPE
model), tokenizer_config.json, config.json and the weights (tests/hf_llama.py,
float64). Checks that the tokenizer adds nothing around a prompt (no BOS, no
EOS, no normalizer or post-processor), that it turns TEXT into exactly tessera's
IDS and those back into TEXT, and that greedy decoding from TEXT gives tessera's
GENERATED ids (`tessera logits --generate`).

usage: hf_generate.py HFDIR TEXT IDS GENERATED"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import hf_llama  # noqa: E402


def bytes_to_unicode():
    """GPT-2's table: printable Latin-1 bytes stand for themselves, the others
    for U+0100 onwards, in byte order."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1)) + \
        list(range(ord("\xae"), ord("\xff") + 1))
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def main():
    hfdir, text_path, ids_path, gen_path = sys.argv[1:5]
    tj = json.load(open(os.path.join(hfdir, "tokenizer.json")))
    tc = json.load(open(os.path.join(hfdir, "tokenizer_config.json")))
    cfg = json.load(open(os.path.join(hfdir, "config.json")))
    model = tj["model"]
    assert model["type"] == "BPE" and model["merges"] == [] and not model["byte_fallback"], "model"
    for part in ("pre_tokenizer", "decoder"):
        assert tj[part]["type"] == "ByteLevel" and tj[part]["add_prefix_space"] is False, part
    assert tj["pre_tokenizer"]["use_regex"] is False, "the pre-tokenizer splits words"
    assert tj["normalizer"] is None and tj["post_processor"] is None, "something is added around a prompt"
    assert tc["add_bos_token"] is False and tc["add_eos_token"] is False and tc["bos_token"] is None
    assert tc["eos_token"] == "<|endoftext|>" and tc["split_special_tokens"] is True
    assert cfg["bos_token_id"] is None and cfg["eos_token_id"] == 256
    assert [t["id"] for t in tj["added_tokens"] if t["content"] == tc["eos_token"] and t["special"]] == [256]
    assert tc["model_max_length"] == cfg["max_position_embeddings"], "two context lengths"
    vocab, b2u = model["vocab"], bytes_to_unicode()
    assert len(set(vocab.values())) == len(vocab) == 257, "vocabulary"
    text = open(text_path, "rb").read()
    # ByteLevel without regex: the whole text is one word of byte characters; BPE
    # without merges: one token per character
    ids = [vocab[b2u[b]] for b in text]
    want = [int(x) for x in open(ids_path).read().split(",")]
    assert ids == want, "the tokenizer gives %d ids %s..., tessera %d %s..." % (len(ids), ids[:8], len(want), want[:8])
    u2b = {c: b for b, c in b2u.items()}
    inv = {i: t for t, i in vocab.items()}
    assert bytes(u2b[c] for i in ids for c in inv[i]) == text, "decoding does not give the text back"
    tgen = [int(x) for x in open(gen_path).read().split(",")]
    cfg_w = hf_llama.load(hfdir)
    seq, gen = list(ids), []
    for _ in tgen:
        nxt = int(hf_llama.forward(cfg_w[0], cfg_w[1], seq)[-1].argmax())
        gen.append(nxt)
        seq.append(nxt)
    assert gen == tgen, "greedy decoding differs from tessera's at token %d: %s, tessera %s" % (
        next(k for k in range(len(gen)) if gen[k] != tgen[k]), gen, tgen)
    print("%s: %d bytes -> tessera's %d ids and back; %d greedy tokens as tessera's" % (hfdir, len(text), len(ids),
                                                                                       len(gen)))


if __name__ == "__main__":
    main()
