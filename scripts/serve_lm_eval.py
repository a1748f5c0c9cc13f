#!/usr/bin/env python3
"""lm-evaluation-harness's `local-completions` model against `difftx serve` (not CI: needs
`pip install "lm-eval[api]"`: its API models need the extra), on a small task defined here
(YAML over a JSONL file; no downloads).

    difftx init --preset tiny --seed 3 --out /tmp/tiny
    difftx serve --model /tmp/tiny --port 18190 &
    python3 scripts/serve_lm_eval.py --url http://127.0.0.1:18190 --model tiny \
        --model-dir /tmp/tiny --difftx target/release/difftx

Each document is one loglikelihood request: context = its first character, continuation =
the rest. lm-eval tokenizes with the server's own tokenizer (`tokenizer_backend=remote`: it
reads /tokenizer_info and /tokenize) and scores through /v1/completions with `echo` and
`logprobs`. Its loglikelihood of a document must equal minus the summed per-token losses
`difftx eval` reports for the same text (loss × tokens: eval scores every token after the
first given the ones before it). Exits non-zero on a mismatch beyond --tol.
"""

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

DOCS = [
    "The cat sat on the mat.",
    "A differential transformer cancels attention noise.",
    "Two softmax maps, one subtracted from the other, scaled by lambda.",
    "Hello, world!",
    "Tokens attend to keys before them, never after.",
]

TASK = """task: difftx_local
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: loglikelihood
doc_to_text: "{{{{text[:1]}}}}"
doc_to_target: "{{{{text[1:]}}}}"
target_delimiter: ""
metric_list:
  - metric: perplexity
    aggregation: perplexity
    higher_is_better: false
"""


def eval_nll(difftx, model_dir, text, work):
    """minus the log-likelihood of tokens 1.. of `text` under `difftx eval`: loss × tokens."""
    f = work / "doc.txt"
    f.write_text(text)
    out = subprocess.run(
        [difftx, "eval", "--json", "--model", model_dir, "--data", str(f)],
        check=True, capture_output=True, text=True,
    )
    v = json.loads(out.stdout)
    return v["loss"] * v["tokens"], v["tokens"]


def evaluate_local(url, model, task_dir, task):
    """lm-eval's `local-completions` model at `url` (the server's tokenizer, one request at a
    time) on the task `task` defined in `task_dir`: its logged samples in document order."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    res = lm_eval.simple_evaluate(
        model="local-completions",
        model_args=(
            f"model={model},base_url={url}/v1/completions,tokenizer_backend=remote,"
            "tokenized_requests=True,num_concurrent=1,max_retries=1"
        ),
        tasks=[task],
        task_manager=TaskManager(include_path=str(task_dir)),
        log_samples=True,
        # no standard errors: the per-document likelihoods they are taken over overflow a float
        # on an untrained model (OverflowError in lm-eval's sample_stddev), and only the
        # loglikelihoods are compared here
        bootstrap_iters=0,
    )
    return sorted(res["samples"][task], key=lambda s: s["doc_id"])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--model", required=True)
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--difftx", default="difftx")
    ap.add_argument("--tol", type=float, default=1e-4)
    a = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="difftx-lm-eval-"))
    data = work / "docs.jsonl"
    data.write_text("".join(json.dumps({"text": d}) + "\n" for d in DOCS))
    (work / "difftx_local.yaml").write_text(TASK.format(data=data))
    samples = evaluate_local(a.url, a.model, work, "difftx_local")
    worst = 0.0
    print(f"{'doc':>3} {'tokens':>6} {'lm-eval loglik':>15} {'-eval loss*tokens':>18} {'diff':>9}")
    for s in samples:
        ll = float(s["resps"][0][0][0])
        nll, n = eval_nll(a.difftx, a.model_dir, DOCS[s["doc_id"]], work)
        d = abs(ll + nll)
        worst = max(worst, d / max(1.0, nll))
        print(f"{s['doc_id']:>3} {n:>6} {ll:>15.6f} {-nll:>18.6f} {ll + nll:>9.2e}")
    if len(samples) != len(DOCS) or worst > a.tol:
        sys.exit(f"mismatch: worst relative difference {worst:.3e} > {a.tol}")
    print(f"lm-eval loglikelihoods equal difftx eval's losses (worst relative difference {worst:.1e})")


if __name__ == "__main__":
    main()
