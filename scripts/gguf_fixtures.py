#!/usr/bin/env python3
"""Writes tests/fixtures/quant_blocks.json: inputs with awkward values and the Q8_0 and Q4_0
blocks gguf-py's reference quantiser makes of them (and the values those blocks stand for),
which crates/kernels/src/quant/block.rs checks bit for bit.

    pip install gguf numpy && python3 scripts/gguf_fixtures.py
"""
import json
import pathlib

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize, quantize


def cases():
    rng = np.random.default_rng(23)
    r = lambda n, s=1.0: (rng.standard_normal(n) * s).astype(np.float32)
    yield "zeros", np.zeros(32, np.float32)
    # max 127: d = 1, so k + 0.5 are exact ties for Q8_0's rounding
    yield "q8_ties", np.array([127.0] + [k + 0.5 for k in range(-15, 16)], np.float32)
    # max −8: d = 1, so every x + 8.5 is exact: Q4_0's truncation at its ties
    yield "q4_ties", np.array([-8.0] + [k / 2 for k in range(-15, 16)], np.float32)
    yield "negative_max", np.concatenate([[-3.0], r(31, 0.5)]).astype(np.float32)
    yield "positive_max", np.concatenate([r(31, 0.5), [3.0]]).astype(np.float32)
    # a max that appears twice with both signs: the first decides Q4_0's sign
    yield "max_both_signs", np.concatenate([[2.0, -2.0], r(30, 0.3)]).astype(np.float32)
    yield "outlier", np.concatenate([r(20, 0.01), [1e4], r(11, 0.01)]).astype(np.float32)
    yield "huge", np.concatenate([[6e6], r(31)]).astype(np.float32)  # d overflows f16 in Q8_0
    yield "tiny", r(32, 1e-6)  # subnormal f16 scales
    yield "single_nonzero", np.array([0.0] * 31 + [-0.7], np.float32)
    yield "ragged_rows", r(64, 0.05)  # two blocks of one row
    yield "random", r(32)


out = {"generator": "scripts/gguf_fixtures.py (gguf-py's gguf.quants)", "cases": []}
for name, x in cases():
    case = {"name": name, "x": x.astype("<f4").tobytes().hex()}
    for key, t in [("q8_0", T.Q8_0), ("q4_0", T.Q4_0)]:
        q = quantize(x.reshape(1, -1), t)
        case[key] = q.tobytes().hex()
        case[key + "_deq"] = dequantize(q, t).astype("<f4").reshape(-1).tobytes().hex()
    out["cases"].append(case)
path = pathlib.Path(__file__).resolve().parent.parent / "tests/fixtures/quant_blocks.json"
path.write_text(json.dumps(out, indent=1) + "\n")
print(f"wrote {path} ({path.stat().st_size} bytes)")
