# samples_check.py METRICS EVENTS STEPS [GLOBAL_BATCH]: the data a supervised
# run trained on, counted sample by sample from its metrics (each step's line
# holds "first_sample", the global index its batch starts at over the epochs,
# and "samples", the global batch; a step done again after a restart appends a
# line, the last one is the run's). Asserts: steps 1..STEPS each present; the
# batches follow each other with no sample lost or trained twice, but for the
# windows the NaN rollbacks of EVENTS (tessera launch's launch.jsonl) skipped:
# the one after step s is exactly the "skip_steps" of the last rollback with
# "skip_after" s; a step done more than once trained on the same samples each
# time unless a rollback's window came between. Prints the counts.
import json, sys

metrics, events, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
runs = {}
for line in open(metrics):
    o = json.loads(line)
    runs.setdefault(o["step"], []).append((o["first_sample"], o["samples"]))
final = {s: v[-1] for s, v in runs.items()}
assert sorted(final) == list(range(1, steps + 1)), "steps missing: %s" % sorted(set(range(1, steps + 1)) - set(final))
windows = {}
for line in open(events):
    e = json.loads(line)
    if e["event"] == "rollback":
        windows[e["skip_after"]] = e["skip_steps"]
assert final[1][0] == windows.get(0, 0) * final[1][1], "step 1 starts at sample %d" % final[1][0]
skipped = 0
for s in range(1, steps):
    (a, n), (b, _) = final[s], final[s + 1]
    gap = b - (a + n)
    assert gap == windows.get(s, 0) * n, "after step %d (samples %d..%d) step %d starts at %d: %d sample(s) %s, " \
        "the rollbacks skipped %d step(s) there" % (s, a, a + n - 1, s + 1, b, abs(gap),
                                                   "lost" if gap > 0 else "trained twice", windows.get(s, 0))
    skipped += gap // n
redone = sum(len(v) - 1 for v in runs.values())
for s, v in runs.items():
    if len(set(v)) > 1:
        assert any(w < s for w in windows), "step %d trained on different samples: %s" % (s, v)
print("steps %d, samples %d trained once each, %d step(s) of data skipped by %d rollback window(s), %d step(s) redone"
      % (steps, steps * final[1][1], skipped, len([w for w in windows if windows[w]]), redone))
