#!/bin/sh
# test_data.sh: tessera data prep: exit statuses (0 ok, 1 failure, 2 bad usage),
# shards that decode back to the input text, the val/train split and shard
# sizes, --json, a deterministic generated corpus, and refusing to mix with the
# shards of an earlier run.
. "$TSR_ROOT/tests/common.sh"
command -v python3 >/dev/null || { echo "SKIP: python3 is needed to decode shards" >&2; exit 77; }

# decode.py DIR: prints "split tokens" per shard, checking every header, and
# writes DIR.tokens: all tokens, val shards first, one per line
cat >decode.py <<'PY'
import os, struct, sys
d = sys.argv[1]
names = sorted(n for n in os.listdir(d) if n.endswith(".bin"))
names = [n for n in names if n.startswith("val_")] + [n for n in names if n.startswith("train_")]
out = []
for n in names:
    b = open(os.path.join(d, n), "rb").read()
    magic, version, count = struct.unpack("<3i", b[:12])
    assert (magic, version) in ((20240520, 1), (20240801, 7)), (n, magic, version)
    assert b[12:1024] == bytes(1012), n
    w = 2 if magic == 20240520 else 4
    assert len(b) == 1024 + count * w, (n, len(b), count)
    toks = struct.unpack("<%d%s" % (count, "H" if w == 2 else "I"), b[1024:])
    print(n.split("_")[0], count, w)
    out.extend(toks)
open(d + ".tokens", "w").write("\n".join(map(str, out)) + "\n")
PY

# usage
expect 0 "--help" $T data prep --help
grep -q "usage: tessera data prep" out.txt || fail "--help prints the usage"
expect 2 "unknown option" $T data prep --out x --frobnicate
expect 2 "missing --out" $T data prep --synthetic 1k
expect 2 "bad --token-bytes" $T data prep --out x --token-bytes 3
expect 2 "bad --val-fraction" $T data prep --out x --val-fraction 1.5
expect 2 "bad --synthetic size" $T data prep --out x --synthetic 12Q
expect 2 "zero --shard-tokens" $T data prep --out x --shard-tokens 0
expect 2 "--input with --synthetic" $T data prep --out x --input a --synthetic 1k
expect 2 "a stray argument" $T data prep --out x file.txt
[ -e x ] && fail "bad usage created the output directory"

# a missing input: exit 1 naming it, nothing written
printf 'hello' >a.txt
expect 1 "missing input" $T data prep --out miss --input a.txt --input no-such-file.txt
grep -q "no-such-file.txt" err.txt || fail "the missing input is named: $(cat err.txt)"
[ -n "$(ls miss 2>/dev/null)" ] && fail "shards written despite a missing input"

# text files: each a document, the tokens are the bytes then EOT (256)
printf 'The cat sat.\nOn the mat.\n' >one.txt
: >empty.txt
printf '\001\377 bytes\036' >two.txt
expect 0 "prep of files" $T data prep --out files --input one.txt --input empty.txt --input two.txt \
    --val-fraction 0.25 --shard-tokens 7
python3 decode.py files >shards.txt || fail "the shards of files decode"
python3 - one.txt empty.txt two.txt <<'PY' || fail "the tokens of files are their bytes and EOTs"
import sys
want = []
for f in sys.argv[1:]:
    want.extend(open(f, "rb").read())
    want.append(256)
got = [int(x) for x in open("files.tokens").read().split()]
assert got == want, (got, want)
PY
# 26 + 1 + 10 = 37 tokens: val the first round(0.25 * 37) = 9, shards of at most 7
[ "$(grep -c '^val 7 2$' shards.txt)" = 1 ] && grep -q '^val 2 2$' shards.txt || fail "val shards: $(cat shards.txt)"
[ "$(grep -c '^train 7 2$' shards.txt)" = 4 ] && [ "$(wc -l <shards.txt)" = 6 ] || fail "train shards: $(cat shards.txt)"
[ -f files/val_000001.bin ] && [ -f files/train_000003.bin ] && [ ! -e files/train_000004.bin ] || fail "shard names"

# an earlier run's shards: refused, then replaced with --force (stale ones go)
expect 1 "prep into a directory with shards" $T data prep --out files --input one.txt
grep -q "force" err.txt || fail "the refusal says --force: $(cat err.txt)"
expect 0 "prep --force" $T data prep --out files --input one.txt --val-fraction 0 --token-bytes 4 --force
[ -f files/train_000000.bin ] && [ ! -e files/train_000001.bin ] && [ ! -e files/val_000000.bin ] ||
    fail "--force leaves only the new shards: $(ls files)"
python3 decode.py files >shards.txt || fail "uint32 shards decode"
grep -q '^train 26 4$' shards.txt || fail "uint32 shard of one.txt: $(cat shards.txt)"

# the generated corpus: deterministic, the JSON tells the truth
expect 0 "synthetic --json" $T data prep --out syn --synthetic 64k --seed 3 --shard-tokens 20000 --json
cp out.txt syn.json
python3 decode.py syn >shards.txt || fail "synthetic shards decode"
python3 - <<'PY' || fail "synthetic --json content"
import json, os
d = json.load(open("syn.json"))
assert d["source"] == "synthetic" and d["seed"] == 3 and d["bytes"] == 65536, d
assert d["vocab"] == 257 and d["eot"] == 256 and d["token_bytes"] == 2, d
assert d["val_tokens"] == round(0.05 * 65536) and d["train_tokens"] == 65536 - d["val_tokens"], d
assert sum(s["tokens"] for s in d["shards"]) == 65536
assert all(s["tokens"] <= 20000 and os.path.getsize(s["path"]) == 1024 + 2 * s["tokens"] for s in d["shards"])
assert [s["split"] for s in d["shards"]] == ["val", "train", "train", "train", "train"], d["shards"]
toks = [int(x) for x in open("syn.tokens").read().split()]
assert toks.count(256) == d["documents"] or toks.count(256) == d["documents"] - 1, (toks.count(256), d["documents"])
assert toks.count(256) > 100 and max(toks) == 256
text = bytes(t for t in toks if t != 256).decode("ascii")
assert " = " in text and "Q: " in text and " the " in text, text[:300]
PY
expect 0 "synthetic again" $T data prep --out syn2 --synthetic 64k --seed 3 --shard-tokens 20000
for f in val_000000 train_000000 train_000003; do
    cmp -s syn/$f.bin syn2/$f.bin || fail "the same seed gives the same $f.bin"
done
grep -q "^wrote syn2/train_000003.bin: " out.txt || fail "prep says what it wrote: $(cat out.txt)"
expect 0 "another seed" $T data prep --out syn3 --synthetic 64k --seed 4 --shard-tokens 20000
cmp -s syn/train_000000.bin syn3/train_000000.bin && fail "another seed gives other text"

# the default: 8 MiB of the generated corpus
expect 0 "default corpus" $T data prep --out default --json
python3 -c 'import json; d = json.load(open("out.txt")); assert d["bytes"] == 8 << 20 and d["train_tokens"] + d["val_tokens"] == 8 << 20, d' ||
    fail "the default corpus is 8 MiB: $(cat out.txt)"

finish "ok"
