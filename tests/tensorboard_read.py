"""Reads the TensorBoard event files under each folder given with TensorBoard's own loader
(which checks every record's CRCs) and prints {run: {tag: [[step, value], ...]}} as JSON."""
import json
import sys

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

out = {}
for d in sys.argv[1:]:
    ea = EventAccumulator(d, size_guidance={"scalars": 0})
    ea.Reload()
    out[d] = {t: [[e.step, e.value] for e in ea.Scalars(t)] for t in ea.Tags()["scalars"]}
print(json.dumps(out))
