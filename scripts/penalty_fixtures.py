#!/usr/bin/env python3
"""Greedy continuations under sampling penalties, by transformers, for difftx's `generate
--presence-penalty/--frequency-penalty/--repetition-penalty` (and `serve`'s fields of the same
names): tests/cli.rs checks difftx's text against these.

    pip install torch transformers
    python3 scripts/penalty_fixtures.py [--model tests/fixtures/hf/llama_gqa]

Loads the committed Hugging Face fixture model (AutoModelForCausalLM, f32, eager attention, CPU,
one thread) and greedy-generates from its fixture prompt, once per case:

  - repetition_penalty: transformers' own `RepetitionPenaltyLogitsProcessor` (model.generate's
    `repetition_penalty=`): over the prompt and the generated tokens, a positive logit divided
    by the penalty, a negative one multiplied.
  - presence_penalty / frequency_penalty: OpenAI's documented rule (its API reference,
    "Parameter details"): mu[j] -= c[j] * frequency_penalty + (c[j] > 0) * presence_penalty,
    c[j] the times token j was generated so far (the prompt does not count), as a
    `LogitsProcessor` appended after transformers' own (so after the repetition penalty, as
    vLLM orders them).

Writes <model>/penalties.json: the prompt, and per case the penalties, the new ids, their text
(`tokenizer.decode`, as expected.json's `new_text`) and the smallest top-1 minus top-2 margin of
the processed scores (a near tie would make the comparison fragile).
"""

import argparse
import json
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LogitsProcessor, LogitsProcessorList

MAX_NEW_TOKENS = 24

CASES = [
    {"repetition_penalty": 1.3},
    {"presence_penalty": 0.7, "frequency_penalty": 0.9},
    {"repetition_penalty": 1.1, "presence_penalty": 0.3, "frequency_penalty": -0.5},
]


class OpenAIPenalties(LogitsProcessor):
    """OpenAI's presence and frequency penalties over the tokens generated after the prompt."""

    def __init__(self, prompt_len, presence, frequency):
        self.prompt_len, self.presence, self.frequency = prompt_len, presence, frequency

    def __call__(self, input_ids, scores):
        counts = torch.zeros_like(scores)
        new = input_ids[:, self.prompt_len:]
        counts.scatter_add_(1, new, torch.ones_like(new, dtype=scores.dtype))
        return scores - counts * self.frequency - (counts > 0).to(scores.dtype) * self.presence


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="tests/fixtures/hf/llama_gqa")
    args = ap.parse_args()
    torch.set_num_threads(1)
    d = Path(args.model)
    exp = json.loads((d / "expected.json").read_text())
    tok = AutoTokenizer.from_pretrained(d)
    model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32,
                                                 attn_implementation="eager").eval()
    ids = exp["prompt_ids"]
    eos = exp["eos_token_id"]
    inp = torch.tensor([ids])
    cases = []
    for case in CASES:
        extra = LogitsProcessorList()
        if "presence_penalty" in case or "frequency_penalty" in case:
            extra.append(OpenAIPenalties(len(ids), case.get("presence_penalty", 0.0),
                                         case.get("frequency_penalty", 0.0)))
        with torch.no_grad():
            out = model.generate(inp, attention_mask=torch.ones_like(inp),
                                 max_new_tokens=MAX_NEW_TOKENS, do_sample=False, use_cache=True,
                                 eos_token_id=eos, pad_token_id=eos,
                                 repetition_penalty=case.get("repetition_penalty", 1.0),
                                 logits_processor=extra, return_dict_in_generate=True,
                                 output_scores=True)
        new = out.sequences[0, len(ids):].tolist()
        margin = min(float(s[0].topk(2).values[0] - s[0].topk(2).values[1]) for s in out.scores)
        cases.append({**case, "new_ids": new, "new_text": tok.decode(new),
                      "min_top1_top2_margin": margin})
        print(case, new, f"margin {margin:.4f}")
    plain = exp["generate"]["new_ids"]
    for c in cases:
        assert c["new_ids"] != plain[:len(c["new_ids"])], f"{c}: the penalties changed nothing"
    out = {"prompt": exp["prompt"], "prompt_ids": ids, "max_new_tokens": MAX_NEW_TOKENS,
           "cases": cases,
           "generated_by": {"script": "scripts/penalty_fixtures.py",
                            "torch": torch.__version__,
                            "transformers": __import__("transformers").__version__}}
    (d / "penalties.json").write_text(json.dumps(out, indent=1) + "\n")
    print("wrote", d / "penalties.json")


if __name__ == "__main__":
    main()
