#!/usr/bin/env python3
"""Prefix caching under lm-evaluation-harness: requests/s of `difftx serve` with and without
`--prefix-cache`, on a multiple-choice task of 4 continuations over one long context per
document (not CI: needs `pip install "lm-eval[api]"`).

    difftx init --preset medium --attention diff_v1 --out /tmp/medium
    python3 scripts/serve_prefix_bench.py --difftx target/release/difftx --model-dir /tmp/medium \
        --text corpus/long/valid.txt

Each document's context is a passage of --context-bytes bytes of --text (real prose; the
models here are byte-level, so bytes are tokens) and its choices four short endings. lm-eval
asks one loglikelihood request per (document, choice) through /v1/completions with `echo`
and `logprobs`, tokenizing with the server's tokenizer. The servers run one at a time on
the same model and threads, cold (`--prefix-cache 0`) and warm, alternating for --rounds
rounds; each round is a fresh server. Prints requests/s per run, the medians and their
ratio, end to end (lm-eval's own start-up and per-request work included) and inside the
server (the requests' summed durations from /metrics), and checks that every log-likelihood is the same with the cache and without (exits
non-zero otherwise).
"""

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve_lm_eval import evaluate_local  # noqa: E402 (the sibling script)

TASK = """task: difftx_prefix
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{context}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: 0
target_delimiter: " "
metric_list:
  - metric: acc
"""

ENDINGS = ["and so it ended.", "but nobody knew why.", "which was the point.", "or so they said."]


def documents(text: bytes, n: int, size: int):
    """`n` passages of `size` bytes spread through `text`, cut at spaces, as UTF-8 strings."""
    step = max(1, (len(text) - size) // n)
    docs = []
    for i in range(n):
        chunk = text[i * step : i * step + size].decode("utf-8", "ignore")
        chunk = " ".join(chunk.split())  # one line, single spaces
        docs.append({"context": chunk, "choices": ENDINGS})
    return docs


def start(difftx, model_dir, port, threads, extra):
    p = subprocess.Popen(
        [difftx, "--threads", str(threads), "serve", "--model", model_dir, "--port", str(port), "--name", "m"]
        + extra,
        stderr=subprocess.DEVNULL,
    )
    t0 = time.time()
    while time.time() - t0 < 120:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
                if r.status == 200:
                    return p
        except Exception:
            time.sleep(0.1)
    p.kill()
    sys.exit("the server never became ready")


def metric(port, name):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics") as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    return float("nan")


def run(a, work, extra, port):
    p = start(a.difftx, a.model_dir, port, a.threads, extra)
    try:
        t0 = time.time()
        samples = evaluate_local(f"http://127.0.0.1:{port}", "m", work, "difftx_prefix")
        seconds = time.time() - t0
        saved = metric(port, "difftx_prefix_cache_tokens_saved_total")
        prompt = metric(port, "difftx_prompt_tokens_total")
        served = metric(port, "difftx_request_duration_seconds_sum")
    finally:
        p.terminate()
        p.wait()
    lls = [[float(r[0][0]) for r in s["resps"]] for s in samples]
    return seconds, lls, saved, prompt, served


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--difftx", default="difftx")
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--text", required=True, help="a text file to cut the contexts from")
    ap.add_argument("--docs", type=int, default=10)
    ap.add_argument("--context-bytes", type=int, default=900)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--port", type=int, default=18231)
    ap.add_argument("--serve-args", default="", help="more flags for both servers")
    a = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="difftx-prefix-"))
    docs = documents(Path(a.text).read_bytes(), a.docs, a.context_bytes)
    data = work / "docs.jsonl"
    data.write_text("".join(json.dumps(d) + "\n" for d in docs))
    (work / "difftx_prefix.yaml").write_text(TASK.format(data=data))
    requests = len(docs) * len(ENDINGS)
    extra = a.serve_args.split()
    rate = {"cold": [], "warm": []}
    server = {"cold": [], "warm": []}
    answers = {}
    for r in range(a.rounds):
        for name, flags in [("cold", ["--prefix-cache", "0"]), ("warm", [])]:
            s, lls, saved, prompt, served = run(a, work, extra + flags, a.port)
            rate[name].append(requests / s)
            server[name].append(requests / served)
            answers.setdefault(name, lls)
            print(
                f"round {r} {name}: {requests} requests in {s:.1f} s of lm-eval = {requests / s:.2f} req/s, "
                f"{served:.1f} s in the server = {requests / served:.2f} req/s; "
                f"prompt tokens {prompt:.0f}, taken from the cache {saved:.0f}",
                flush=True,
            )
    same = answers["cold"] == answers["warm"]
    for what, d in [("lm-eval end to end (its start-up included)", rate), ("in the server", server)]:
        cold, warm = statistics.median(d["cold"]), statistics.median(d["warm"])
        print(f"median req/s, {what}: cold {cold:.2f}, warm {warm:.2f}, ratio {warm / cold:.2f}x")
    print(f"log-likelihoods identical with the cache and without: {same}")
    if not same:
        sys.exit("the log-likelihoods differ")


if __name__ == "__main__":
    main()
