#!/usr/bin/env python3
"""Hugging Face transformers (PyTorch eager) side of `difftx bench decode`: prefill and batch-1
greedy decode tokens/s of a model directory (export one with `difftx export --format hf`).

Usage: python bench/hf_decode.py DIR [--threads 2] [--prompt-len 128] [--new-tokens 128] [--reps 3] [--bf16]
Prints one JSON line. The measurement itself lives in scripts/hf_fixtures.py (decode_bench).
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))
import hf_fixtures  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model_dir")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--bf16", action="store_true",
                    help="load the model in bfloat16 (the counterpart of difftx --bf16)")
    a = ap.parse_args()
    ns = argparse.Namespace(decode_bench=a.model_dir, threads=a.threads, prompt_len=a.prompt_len,
                            new_tokens=a.new_tokens, reps=a.reps, device="cpu",
                            dtype="bfloat16" if a.bf16 else "float32",
                            attn="eager")
    hf_fixtures.decode_bench(ns)


if __name__ == "__main__":
    main()
