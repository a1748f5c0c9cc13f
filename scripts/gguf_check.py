#!/usr/bin/env python3
"""Cross-checks a GGUF file written by `difftx export --format gguf` with gguf-py's reader
(llama.cpp's own Python package), against the difftx model directory it came from:

- the `llama` hyperparameters against config.json;
- every tensor: llama.cpp name, dims, and bytes equal to what gguf-py's own `quantize` makes of
  the model.safetensors values in the file's type (f32: the values themselves; bf16: rounded
  to nearest even; any block type gguf-py knows works the same way);
- the tokenizer: the token list and merges against tokenizer.json (or the 256 GPT-2 byte
  characters for the byte-level tokenizer), padded with unused tokens to vocab_size.

    pip install gguf numpy
    python3 scripts/gguf_check.py MODEL.gguf MODEL_DIR

MODEL_DIR is the native model directory (a run's checkpoint, checkpoints/step-N). Exits 1 with
one line per mismatch.
"""
import json
import struct
import sys
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader
from gguf.quants import quantize

NAMES = {
    "input_layernorm.weight": "attn_norm",
    "self_attn.q_proj.weight": "attn_q",
    "self_attn.k_proj.weight": "attn_k",
    "self_attn.v_proj.weight": "attn_v",
    "self_attn.o_proj.weight": "attn_output",
    "post_attention_layernorm.weight": "ffn_norm",
    "mlp.gate_proj.weight": "ffn_gate",
    "mlp.up_proj.weight": "ffn_up",
    "mlp.down_proj.weight": "ffn_down",
}


def gguf_name(name):
    top = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
           "lm_head.weight": "output.weight"}
    if name in top:
        return top[name]
    _, _, layer, rest = name.split(".", 3)
    return f"blk.{layer}.{NAMES[rest]}.weight"


def read_safetensors(path):
    """{name: float32 array} of an F32 safetensors file (difftx writes F32)."""
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        assert t["dtype"] == "F32", f"{name}: {t['dtype']}"
        a, b = t["data_offsets"]
        out[name] = np.frombuffer(raw[8 + n + a:8 + n + b], dtype="<f4").reshape(t["shape"])
    return out


def byte_chars():
    printable = [b for b in range(256) if 33 <= b <= 126 or 161 <= b <= 172 or 174 <= b <= 255]
    chars, nxt = [], 256
    for b in range(256):
        if b in printable:
            chars.append(chr(b))
        else:
            chars.append(chr(nxt))
            nxt += 1
    return chars


def field(reader, key):
    f = reader.fields[key]
    return f.contents()


def main():
    gguf_path, model_dir = Path(sys.argv[1]), Path(sys.argv[2])
    reader = GGUFReader(gguf_path)
    cfg = json.loads((model_dir / "config.json").read_text())
    bad = []

    def expect(what, got, want):
        if got != want:
            bad.append(f"{what}: file has {got!r}, expected {want!r}")

    # 1. Hyperparameters.
    expect("general.architecture", field(reader, "general.architecture"), "llama")
    for key, ckey in [("vocab_size", "vocab_size"), ("context_length", "max_position_embeddings"),
                      ("embedding_length", "hidden_size"), ("block_count", "num_hidden_layers"),
                      ("feed_forward_length", "intermediate_size"),
                      ("attention.head_count", "num_attention_heads"),
                      ("attention.head_count_kv", "num_key_value_heads"),
                      ("attention.key_length", "head_dim"), ("rope.dimension_count", "head_dim")]:
        expect(f"llama.{key}", field(reader, f"llama.{key}"), cfg[ckey])
    expect("llama.rope.freq_base", field(reader, "llama.rope.freq_base"),
           float(np.float32(cfg.get("rope_theta", 10000.0))))
    expect("llama.attention.layer_norm_rms_epsilon", field(reader, "llama.attention.layer_norm_rms_epsilon"),
           float(np.float32(cfg.get("rms_norm_eps", 1e-5))))

    # 2. Tensors: gguf-py's own encoding of the checkpoint's values, byte for byte.
    weights = read_safetensors(model_dir / "model.safetensors")
    tensors = {t.name: t for t in reader.tensors}
    expect("tensor count", len(tensors), len(weights))
    types = {}
    for name, w in weights.items():
        t = tensors.get(gguf_name(name))
        if t is None:
            bad.append(f"{gguf_name(name)} ({name}) is missing")
            continue
        ty = GGMLQuantizationType(t.tensor_type)
        types[ty.name] = types.get(ty.name, 0) + 1
        expect(f"{t.name} dims", [int(d) for d in t.shape], list(reversed(w.shape)))
        want = w.tobytes() if ty == GGMLQuantizationType.F32 else quantize(w, ty).tobytes()
        if bytes(t.data.tobytes()) != want:
            bad.append(f"{t.name}: bytes differ from gguf-py's {ty.name} encoding of {name}")

    # 3. Tokenizer.
    expect("tokenizer.ggml.model", field(reader, "tokenizer.ggml.model"), "gpt2")
    expect("tokenizer.ggml.pre", field(reader, "tokenizer.ggml.pre"), "gpt-2")
    tokens = field(reader, "tokenizer.ggml.tokens")
    merges = field(reader, "tokenizer.ggml.merges") if "tokenizer.ggml.merges" in reader.fields else []
    tj = model_dir / "tokenizer.json"
    if tj.exists():
        tok = json.loads(tj.read_text())
        vocab = {i: s for s, i in tok["model"]["vocab"].items()}
        vocab.update({t["id"]: t["content"] for t in tok.get("added_tokens", [])})
        want_tokens = [vocab[i] for i in range(len(vocab))]
        want_merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    else:
        want_tokens, want_merges = byte_chars(), []
    want_tokens += [f"[PAD{i}]" for i in range(len(want_tokens), cfg["vocab_size"])]
    expect("token list", tokens, want_tokens)
    expect("merges", list(merges), want_merges)
    expect("add_bos_token", field(reader, "tokenizer.ggml.add_bos_token"), False)

    if bad:
        print("\n".join(bad))
        sys.exit(1)
    print(f"OK {gguf_path}: {len(tensors)} tensors ({', '.join(f'{n} {k}' for k, n in types.items())}) "
          f"equal gguf-py's encoding of {model_dir}; {len(tokens)} tokens, {len(merges)} merges")


if __name__ == "__main__":
    main()
