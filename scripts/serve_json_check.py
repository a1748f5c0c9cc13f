#!/usr/bin/env python3
"""Structured output through the official `openai` client against `difftx serve` (not CI:
needs `pip install openai jsonschema`).

    difftx init --preset tiny --out /tmp/tiny
    difftx serve --model /tmp/tiny --port 8092 &
    python3 scripts/serve_json_check.py --url http://127.0.0.1:8092/v1 --model tiny

Draws --samples chat answers at temperature 1 with `response_format` json_schema (a schema
of strings, an integer, an enum, an array of numbers and a nested object) and as many with
json_object, parses each and validates the first kind with the `jsonschema` package; then
times unconstrained and json_schema requests of the same length, alternating, and prints
the time per token of each and their ratio. Exits non-zero on any answer that does not parse
or validate.
"""

import argparse
import json
import statistics
import sys
import time

import jsonschema
import openai

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "mood": {"type": "string", "enum": ["calm", "cross", "glad"]},
        "scores": {"type": "array", "items": {"type": "number"}},
        "pet": {
            "type": "object",
            "properties": {"kind": {"type": "string"}, "has": {"type": "boolean"}},
            "required": ["kind", "has"],
            "additionalProperties": False,
        },
    },
    "required": ["name", "age", "mood", "scores", "pet"],
    "additionalProperties": False,
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default="http://127.0.0.1:8080/v1")
    ap.add_argument("--model", required=True)
    ap.add_argument("--samples", type=int, default=200)
    ap.add_argument("--max-tokens", type=int, default=90)
    ap.add_argument("--timing-rounds", type=int, default=5)
    a = ap.parse_args()
    c = openai.OpenAI(base_url=a.url, api_key="none")
    messages = [{"role": "user", "content": "A person, as JSON"}]
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "strict": True, "schema": SCHEMA}}

    # 1. Every sampled answer parses and validates
    bad = 0
    for i in range(a.samples):
        r = c.chat.completions.create(
            model=a.model, messages=messages, max_tokens=a.max_tokens, temperature=1.0,
            seed=i, response_format=fmt,
        )
        text = r.choices[0].message.content
        try:
            jsonschema.validate(json.loads(text), SCHEMA)
        except Exception as e:  # noqa: BLE001 (any failure counts)
            bad += 1
            print(f"sample {i} fails: {e}: {text!r}", file=sys.stderr)
    print(f"json_schema: {a.samples - bad}/{a.samples} answers parse and validate")
    objects = 0
    for i in range(a.samples):
        r = c.chat.completions.create(
            model=a.model, messages=messages, max_tokens=a.max_tokens, temperature=1.0,
            seed=i, response_format={"type": "json_object"},
        )
        objects += isinstance(json.loads(r.choices[0].message.content), dict)
    print(f"json_object: {objects}/{a.samples} answers parse as objects")

    # 2. Time per token: unconstrained against json_schema, alternating
    def per_token(response_format):
        t0 = time.perf_counter()
        kw = {"response_format": response_format} if response_format else {}
        r = c.chat.completions.create(
            model=a.model, messages=messages, max_tokens=a.max_tokens, temperature=1.0, seed=1,
            **kw,
        )
        return (time.perf_counter() - t0) / max(1, r.usage.completion_tokens)

    plain, schema = [], []
    for _ in range(a.timing_rounds):
        plain.append(per_token(None))
        schema.append(per_token(fmt))
    p, s = statistics.median(plain), statistics.median(schema)
    print(f"time per token: unconstrained {p * 1e3:.2f} ms, json_schema {s * 1e3:.2f} ms, ratio {s / p:.2f}")
    if bad or objects != a.samples:
        sys.exit("some answers do not parse or validate")


if __name__ == "__main__":
    main()
