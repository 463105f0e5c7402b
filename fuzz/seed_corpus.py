#!/usr/bin/env python3
"""Writes fuzz seed inputs from the golden vectors (compliance/vectors/*.vec).

corpus/parse_packet/<name>: the `bytes` of every vector (valid and malformed);
corpus/parse_frame/<name>: mode byte 0 + `frame`, and mode byte 1 + `frame`
(mode 1 makes the target recompute checksums), for every vector with a frame.
"""

import os

here = os.path.dirname(os.path.abspath(__file__))
vectors = os.path.join(here, "..", "compliance", "vectors")
out = {t: os.path.join(here, "corpus", t) for t in ("parse_packet", "parse_frame")}
for d in out.values():
    os.makedirs(d, exist_ok=True)

count = {t: 0 for t in out}
for name in sorted(os.listdir(vectors)):
    if not name.endswith(".vec"):
        continue
    fields = {}
    with open(os.path.join(vectors, name), encoding="ascii") as fh:
        for line in fh:
            line = line.strip()
            if line and not line.startswith("#") and "=" in line:
                k, v = line.split("=", 1)
                fields[k.strip()] = v.strip()
    stem = name[:-4]
    if "bytes" in fields:
        with open(os.path.join(out["parse_packet"], stem), "wb") as fh:
            fh.write(bytes.fromhex(fields["bytes"]))
        count["parse_packet"] += 1
    if "frame" in fields:
        for mode in (0, 1):
            with open(os.path.join(out["parse_frame"], "%s.%d" % (stem, mode)), "wb") as fh:
                fh.write(bytes([mode]) + bytes.fromhex(fields["frame"]))
            count["parse_frame"] += 1
print(", ".join("%s: %d seeds" % kv for kv in count.items()))
