#!/usr/bin/env python3
"""Closed-loop load on an OpenAI-compatible completions server (difftx serve, llama-server).

Each of C clients sends a streaming completion of exactly --tokens tokens (greedy, ignore EOS
where the server knows that field), waits for the whole answer, and sends the next, for
--seconds per level. Reports per level: aggregate generated tokens/s (the tokens that arrive
inside the level's window, over its length: after the ramp, before the level's end, so that
neither the ramp nor the requests that finish after the window, with fewer clients left, dilute
it), p50/p99 time to first token, p50/p99 per-token latency (a request's time after its first
token over its remaining tokens), errors, and the server's peak RSS when --pid is given.

Arrivals: closed-loop clients that all ask for the same number of tokens finish together and
come back together, so every request after the first arrives in a wave of C (the time to first
token of a wave's last member is C prefills). --stagger S starts client i at i·S/C seconds
instead; the clients then stay spread out, and the level's TTFT and per-token figures count
only the requests sent after the last client started and its tokens/s the tokens after it (the
steady state, not the ramp).

Soak: --disconnect P makes each request, with probability P, hang up after a random number of
streamed tokens (counted as cancelled, not as errors), and --pid samples the server's resident
memory every --rss-every seconds while a level runs, printed as the series' first, middle and
last readings so a leak shows as a climb:

    python3 bench/serve_load.py --clients 64 --seconds 600 --disconnect 0.2 --pid $!

Python standard library only. Example (docs/SERVING.md):

    difftx init --preset medium --attention standard --out /tmp/medium
    difftx --threads 2 serve --model /tmp/medium --port 8090 &
    python3 bench/serve_load.py --url http://127.0.0.1:8090 --clients 1,4,16,64 --pid $!
"""

import argparse
import http.client
import json
import random
import threading
import time
import urllib.parse


def one_request(host, port, prompt, tokens, model, hang_up_after=None):
    """(ttft seconds, total seconds, tokens received, arrival times) of one streamed
    completion: the arrival time (perf_counter) of each chunk that carried tokens, and the
    tokens it carried. With hang_up_after=N the client closes the connection after N tokens
    (a cancellation)."""
    body = {
        "prompt": prompt,
        "max_tokens": tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
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
    first, n, usage, arrivals = None, 0, None, []
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
        if chunk.get("usage"):
            usage = chunk["usage"].get("completion_tokens")
        if chunk.get("choices"):
            # a chunk per token, unless the server holds back partial characters
            n += 1
            now = time.perf_counter()
            arrivals.append(now)
            if first is None:
                first = now - t0
            if hang_up_after is not None and n >= hang_up_after:
                conn.sock.shutdown(2)
                conn.close()
                return None, time.perf_counter() - t0, n, [(t, 1) for t in arrivals]
    conn.close()
    # a server may hold back bytes that do not yet make a whole UTF-8 character and send
    # several tokens in one chunk (llama-server does): its own count, where it gives one,
    # spread evenly over the chunks
    total = usage if usage is not None else n
    per = total / n if n else 0
    return first, time.perf_counter() - t0, total, [(t, per) for t in arrivals]


def rss_kib(pid, field="VmHWM"):
    """The process's peak (VmHWM) or current (VmRSS) resident memory in KiB."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def pct(xs, q):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def level(host, port, clients, tokens, seconds, model, disconnect=0.0, pid=None, rss_every=10.0,
          stagger=0.0):
    ttfts, per_tok, errors = [], [], []
    generated, in_window, cancelled, rss = [0], [0.0], [0], []
    lock = threading.Lock()
    start = time.perf_counter()
    stop_at, ramp_end = start + seconds, start + stagger

    def client(i):
        rng = random.Random(i)
        k = 0
        time.sleep(i * stagger / clients)
        while time.perf_counter() < stop_at:
            sent = time.perf_counter()
            prompt = f"Client {i} request {k}: once upon a time"
            k += 1
            hang_up = rng.randint(1, max(1, tokens - 1)) if rng.random() < disconnect else None
            try:
                first, total, n, arrivals = one_request(host, port, prompt, tokens, model, hang_up)
            except Exception as e:  # noqa: BLE001 - every failure is counted
                with lock:
                    errors.append(str(e))
                continue
            with lock:
                generated[0] += n
                in_window[0] += sum(c for t, c in arrivals if ramp_end <= t < stop_at)
                if hang_up is not None:
                    cancelled[0] += 1
                    continue
                if first is not None and sent >= ramp_end:
                    ttfts.append(first)
                    if n > 1:
                        per_tok.append((total - first) / (n - 1))

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    while pid and any(t.is_alive() for t in threads):
        rss.append(rss_kib(pid, "VmRSS"))
        threads[0].join(timeout=rss_every)
        while threads and not threads[0].is_alive():
            threads.pop(0)
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    return {
        "clients": clients,
        "requests": len(ttfts),
        # tokens that arrived between the ramp's end and the level's end, over that window:
        # neither the ramp nor the drain (the last requests finishing after the window,
        # with fewer clients left) dilutes it
        "tokens_per_s": in_window[0] / (stop_at - ramp_end),
        "generated": generated[0],
        "wall_s": wall,
        "ttft_p50_ms": 1000 * pct(ttfts, 0.5),
        "ttft_p99_ms": 1000 * pct(ttfts, 0.99),
        "token_p50_ms": 1000 * pct(per_tok, 0.5),
        "token_p99_ms": 1000 * pct(per_tok, 0.99),
        "errors": len(errors),
        "cancelled": cancelled[0],
        "first_errors": errors[:3],
        "rss_mib_series": [r / 1024 for r in rss if r],
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--clients", default="1,4,16,64")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--model", default=None, help="the model field to send (llama-server ignores it)")
    ap.add_argument("--pid", type=int, default=None, help="server process id, for its peak RSS")
    ap.add_argument("--disconnect", type=float, default=0.0,
                    help="probability that a request hangs up after a random number of tokens")
    ap.add_argument("--stagger", type=float, default=0.0,
                    help="start client i at i*S/C seconds, and count latencies after the ramp")
    ap.add_argument("--rss-every", type=float, default=10.0,
                    help="seconds between readings of the server's resident memory (with --pid)")
    a = ap.parse_args()
    u = urllib.parse.urlparse(a.url)
    print("clients  requests  tok/s    TTFT p50/p99 ms    per-token p50/p99 ms  errors  peak RSS MiB")
    for c in [int(x) for x in a.clients.split(",")]:
        r = level(u.hostname, u.port or 80, c, a.tokens, a.seconds, a.model,
                  a.disconnect, a.pid, a.rss_every, a.stagger)
        rss = rss_kib(a.pid) if a.pid else None
        r["peak_rss_mib"] = rss / 1024 if rss else None
        print(
            f"{c:7d}  {r['requests']:8d}  {r['tokens_per_s']:6.1f}  "
            f"{r['ttft_p50_ms']:8.1f} / {r['ttft_p99_ms']:8.1f}  "
            f"{r['token_p50_ms']:8.2f} / {r['token_p99_ms']:8.2f}  {r['errors']:6d}  "
            f"{'' if rss is None else f'{rss / 1024:.0f}'}",
            flush=True,
        )
        series = r["rss_mib_series"]
        if series:
            mid = series[len(series) // 2]
            print(f"         RSS MiB first / middle / last: {series[0]:.0f} / {mid:.0f} / "
                  f"{series[-1]:.0f} ({len(series)} readings); cancelled {r['cancelled']}",
                  flush=True)
        print("json " + json.dumps(r), flush=True)


if __name__ == "__main__":
    main()
