#!/usr/bin/env python3
"""Writes tests/fixtures/npy_2x3.npy with numpy.save, the reference the Rust .npy writer
(util::npy_f32) is compared with byte for byte, and checks that numpy reads it back:
    python3 scripts/npy_fixture.py
"""
import pathlib

import numpy as np

out = pathlib.Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "npy_2x3.npy"
a = np.array([[0.0, 1.0, 2.0], [3.0, 4.0, 5.5]], dtype="<f4")
np.save(out, a)
b = np.load(out)
assert b.dtype == np.float32 and b.shape == (2, 3) and (a == b).all()
print(f"wrote {out}")
