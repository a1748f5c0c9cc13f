#!/usr/bin/env python3
"""Closed-loop load on an OpenAI-compatible completions server (difftx serve, llama-server).

Each of C clients sends a streaming completion of exactly --tokens tokens (greedy, ignore EOS
where the server knows that field), waits for the whole answer, and sends the next, for
--seconds per level. Reports per level: aggregate generated tokens/s, p50/p99 time to first
token, p50/p99 per-token latency (a request's time after its first token over its remaining
tokens), errors, and the server's peak RSS when --pid is given.

Python standard library only. Example (docs/SERVING.md):

    difftx init --preset medium --attention standard --out /tmp/medium
    difftx --threads 2 serve --model /tmp/medium --port 8090 &
    python3 bench/serve_load.py --url http://127.0.0.1:8090 --clients 1,4,16,64 --pid $!
"""

import argparse
import http.client
import json
import statistics
import threading
import time
import urllib.parse


def one_request(host, port, prompt, tokens, model):
    """(ttft seconds, total seconds, tokens received) of one streamed completion."""
    body = {
        "prompt": prompt,
        "max_tokens": tokens,
        "temperature": 0,
        "stream": True,
        "ignore_eos": True,
    }
    if model:
        body["model"] = model
    t0 = time.perf_counter()
    conn = http.client.HTTPConnection(host, port, timeout=600)
    conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        resp.read()
        conn.close()
        raise RuntimeError(f"status {resp.status}")
    first, n = None, 0
    while True:
        line = resp.readline()
        if not line:
            break
        line = line.strip()
        if not line.startswith(b"data: "):
            continue
        data = line[6:]
        if data == b"[DONE]":
            break
        chunk = json.loads(data)
        if chunk.get("choices"):
            # llama-server and difftx send one chunk per token
            n += 1
            if first is None:
                first = time.perf_counter() - t0
    conn.close()
    return first, time.perf_counter() - t0, n


def peak_rss_kib(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def pct(xs, q):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def level(host, port, clients, tokens, seconds, model):
    ttfts, per_tok, errors = [], [], []
    generated = [0]
    lock = threading.Lock()
    stop_at = time.perf_counter() + seconds

    def client(i):
        k = 0
        while time.perf_counter() < stop_at:
            prompt = f"Client {i} request {k}: once upon a time"
            k += 1
            try:
                first, total, n = one_request(host, port, prompt, tokens, model)
            except Exception as e:  # noqa: BLE001 - every failure is counted
                with lock:
                    errors.append(str(e))
                continue
            with lock:
                generated[0] += n
                if first is not None:
                    ttfts.append(first)
                    if n > 1:
                        per_tok.append((total - first) / (n - 1))

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    return {
        "clients": clients,
        "requests": len(ttfts),
        "tokens_per_s": generated[0] / wall,
        "ttft_p50_ms": 1000 * pct(ttfts, 0.5),
        "ttft_p99_ms": 1000 * pct(ttfts, 0.99),
        "token_p50_ms": 1000 * pct(per_tok, 0.5),
        "token_p99_ms": 1000 * pct(per_tok, 0.99),
        "errors": len(errors),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--clients", default="1,4,16,64")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--model", default=None, help="the model field to send (llama-server ignores it)")
    ap.add_argument("--pid", type=int, default=None, help="server process id, for its peak RSS")
    a = ap.parse_args()
    u = urllib.parse.urlparse(a.url)
    print("clients  requests  tok/s    TTFT p50/p99 ms    per-token p50/p99 ms  errors  peak RSS MiB")
    for c in [int(x) for x in a.clients.split(",")]:
        r = level(u.hostname, u.port or 80, c, a.tokens, a.seconds, a.model)
        rss = peak_rss_kib(a.pid) if a.pid else None
        r["peak_rss_mib"] = rss / 1024 if rss else None
        print(
            f"{c:7d}  {r['requests']:8d}  {r['tokens_per_s']:6.1f}  "
            f"{r['ttft_p50_ms']:8.1f} / {r['ttft_p99_ms']:8.1f}  "
            f"{r['token_p50_ms']:8.2f} / {r['token_p99_ms']:8.2f}  {r['errors']:6d}  "
            f"{'' if rss is None else f'{rss / 1024:.0f}'}",
            flush=True,
        )
        print("json " + json.dumps(r), flush=True)


if __name__ == "__main__":
    main()
