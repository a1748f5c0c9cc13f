#!/usr/bin/env python3
"""The official `openai` Python client against `difftx serve` (not CI: needs `pip install openai`).

    difftx init --preset tiny --out /tmp/tiny
    difftx serve --model /tmp/tiny --port 8091 &
    python3 scripts/serve_clients.py --url http://127.0.0.1:8091/v1 --model tiny

Checks: completions (whole and streamed give the same text), n choices (repeated by the
seed), logit_bias, the presence/frequency/repetition penalties, echo log-probabilities with
max_tokens 0 (a first null, one row per prompt token), chat (whole and streamed alike), chat
log-probabilities (one row per generated token, the greedy one the likeliest), the model list,
and that an error comes back as the client's typed exception. Exits non-zero on the first
mismatch.
"""

import argparse
import sys

import openai


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default="http://127.0.0.1:8080/v1")
    ap.add_argument("--model", required=True)
    ap.add_argument("--api-key", default="none")
    a = ap.parse_args()
    c = openai.OpenAI(base_url=a.url, api_key=a.api_key)

    ids = [m.id for m in c.models.list().data]
    assert a.model in ids, ids

    prompt = "The cat sat on the"
    whole = c.completions.create(model=a.model, prompt=prompt, max_tokens=24, temperature=0)
    streamed = "".join(
        ch.choices[0].text
        for ch in c.completions.create(
            model=a.model, prompt=prompt, max_tokens=24, temperature=0, stream=True
        )
        if ch.choices
    )
    assert whole.choices[0].text == streamed, (whole.choices[0].text, streamed)
    print(f"completions: {whole.usage.completion_tokens} tokens, streamed == whole")

    drawn = c.completions.create(
        model=a.model, prompt=prompt, max_tokens=12, temperature=1, seed=7, n=3
    )
    assert [ch.index for ch in drawn.choices] == [0, 1, 2], drawn
    again = c.completions.create(
        model=a.model, prompt=prompt, max_tokens=12, temperature=1, seed=7, n=3
    )
    assert [ch.text for ch in again.choices] == [ch.text for ch in drawn.choices]
    print(f"n=3: {len({ch.text for ch in drawn.choices})} distinct choices, repeated by the seed")

    biased = c.completions.create(
        model=a.model, prompt=prompt, max_tokens=4, temperature=0, logit_bias={"65": 100}
    )
    # byte-level tokenizer (difftx init's): token 65 is "A"
    assert biased.choices[0].text == "AAAA", biased
    print("logit_bias: +100 on token 65 gives AAAA")

    # penalties: the client's own presence/frequency fields, and repetition_penalty (vLLM's
    # extension) through extra_body, each changing the greedy text
    pen = c.completions.create(
        model=a.model, prompt=prompt, max_tokens=24, temperature=0,
        presence_penalty=0.5, frequency_penalty=1.5,
    )
    rep = c.completions.create(
        model=a.model, prompt=prompt, max_tokens=24, temperature=0,
        extra_body={"repetition_penalty": 1.4},
    )
    assert pen.choices[0].text != whole.choices[0].text, pen
    assert rep.choices[0].text != whole.choices[0].text, rep
    try:
        c.completions.create(model=a.model, prompt=prompt, max_tokens=4, presence_penalty=3)
        raise AssertionError("presence_penalty 3 was accepted")
    except openai.BadRequestError as e:
        assert e.body["param"] == "presence_penalty", e.body
    print("penalties: presence/frequency and repetition change the greedy text; 3 is a 400")

    scored = c.completions.create(
        model=a.model, prompt=prompt, max_tokens=0, echo=True, logprobs=1, temperature=0
    )
    lp = scored.choices[0].logprobs
    assert lp.token_logprobs[0] is None and len(lp.tokens) == scored.usage.prompt_tokens
    nll = -sum(lp.token_logprobs[1:]) / (len(lp.token_logprobs) - 1)
    print(f"echo: {len(lp.tokens)} prompt tokens scored, mean loss {nll:.4f} nats")

    msgs = [{"role": "user", "content": "Say hello"}]
    chat = c.chat.completions.create(model=a.model, messages=msgs, max_tokens=16, temperature=0)
    chat_streamed = "".join(
        ch.choices[0].delta.content or ""
        for ch in c.chat.completions.create(
            model=a.model, messages=msgs, max_tokens=16, temperature=0, stream=True
        )
        if ch.choices
    )
    assert chat.choices[0].message.content == chat_streamed
    print(f"chat: {chat.usage.completion_tokens} tokens, streamed == whole")

    scored_chat = c.chat.completions.create(
        model=a.model, messages=msgs, max_tokens=8, temperature=0, logprobs=True, top_logprobs=2
    )
    rows = scored_chat.choices[0].logprobs.content
    assert len(rows) == scored_chat.usage.completion_tokens, rows
    for r in rows:
        # greedy: the chosen token is the likeliest of its alternatives
        assert len(r.top_logprobs) == 2 and r.top_logprobs[0].logprob == r.logprob, r
    print(f"chat logprobs: {len(rows)} tokens, each the likeliest of its top 2")

    try:
        c.completions.create(model=a.model, prompt=prompt, max_tokens=-1)
        sys.exit("a negative max_tokens was accepted")
    except openai.BadRequestError as e:
        print(f"errors: 400 -> {type(e).__name__}: {e.body['message']}")
    try:
        c.completions.create(model="no-such-model", prompt=prompt, max_tokens=1)
        sys.exit("an unknown model was accepted")
    except openai.NotFoundError:
        print("errors: unknown model -> NotFoundError")
    print("all openai-client checks passed")


if __name__ == "__main__":
    main()
