#!/usr/bin/env python3
"""Writes tests/fixtures/gguf/gguf_py.gguf with gguf-py's GGUFWriter (llama.cpp's own Python
package), so that tests/gguf.rs checks difftx's GGUF reader against a file it did not write:
metadata of several types, an f32, a bf16 and a Q8_0 tensor, and a non-default alignment.

    pip install gguf numpy
    python3 scripts/gguf_fixture.py
"""
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter
from gguf.quants import quantize

out = Path(__file__).resolve().parent.parent / "tests/fixtures/gguf/gguf_py.gguf"
w = GGUFWriter(str(out), arch="llama")
w.add_custom_alignment(64)
w.add_uint32("test.u32", 123456)
w.add_int32("test.i32", -7)
w.add_float32("test.f32", 0.25)
w.add_bool("test.bool", True)
w.add_string("test.str", "héllo")
w.add_array("test.strs", ["a", "bc", ""])
w.add_array("test.i32s", [1, -2, 3])
w.add_uint64("test.u64", 1 << 40)
w.add_float64("test.f64", -1.5)
# values chosen to be exact in every type
a = (np.arange(12, dtype=np.float32).reshape(3, 4) - 5) / 4
w.add_tensor("a", a)
b = np.array([[0.5, -1.0, 2.0], [3.0, 0.0, -0.25]], dtype=np.float32)
w.add_tensor("b", quantize(b, GGMLQuantizationType.BF16), raw_dtype=GGMLQuantizationType.BF16)
q = np.linspace(-1, 1, 64, dtype=np.float32).reshape(2, 32)
w.add_tensor("q", quantize(q, GGMLQuantizationType.Q8_0), raw_dtype=GGMLQuantizationType.Q8_0)
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()
print(f"wrote {out} ({out.stat().st_size} bytes)")
