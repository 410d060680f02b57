"""Speculative decoding vs plain cached decoding, with the theory's predictions next to the measurements.

    python bench/speculative.py          (or: course bench speculative)

Bundled pair (tiny target, tiny-draft) on held-out code: for each draft length g, the acceptance rate a,
tokens per pass (measured / predicted from a), the cost ratio c, the verify cost (target over g+1 tokens
/ one token), the predicted speed-ups (idealized verify cost 1, and with the measured verify cost) and the
measured speed-up over plain cached decoding, all in one run (interleaved, medians). Then prompt-lookup
drafting on an input-grounded task. On a CUDA machine with the network, the same for SmolLM2-360M with
SmolLM2-135M as the draft. Writes bench/results/speculative-<cpu|cuda>.json with the device named.
"""
import time

import numpy as np
import torch
from _common import print_table, save

from course_lib.env import offline
from course_lib.models import load
from course_lib.models.corpus import load_split
from course_lib.speculative import editing_prompts, measure, measure_prompt_lookup, optimal_draft_length

NEW_TOKENS, PROMPT_TOKENS, NUM_PROMPTS, REPEATS = 64, 48, 3, 3
DRAFT_LENGTHS = (1, 2, 3, 4, 6)
COLS = ["pair", "mode", "g", "a", "a_tested", "tok/pass", "tok/pass_pred", "c", "verify_cost",
        "S_ideal", "S_refined", "S_measured", "plain_ms/tok", "spec_ms/tok"]


def heldout_prompts(tok, device):
    texts = load_split("heldout", max_files=NUM_PROMPTS)
    return [torch.tensor(tok(t[:1000])["input_ids"][:PROMPT_TOKENS], device=device) for t in texts]


def table_rows(pair, mode, rows):
    return [{"pair": pair, "mode": mode, "g": r["g"], "a": round(r["a"], 3), "a_tested": round(r["a_tested"], 3),
             "tok/pass": round(r["tokens_per_pass"], 2), "tok/pass_pred": round(r["tokens_per_pass_pred"], 2),
             "c": round(r["c"], 3), "verify_cost": round(r["verify_cost"], 2),
             "S_ideal": round(r["speedup_ideal"], 2), "S_refined": round(r["speedup_refined"], 2),
             "S_measured": round(r["speedup_measured"], 2), "plain_ms/tok": round(r["plain_ms_per_token"], 2),
             "spec_ms/tok": round(r["spec_ms_per_token"], 2)} for r in rows]


def run_pair(name, target, draft, tok, device):
    prompts = heldout_prompts(tok, device)
    out = []
    greedy = measure(target, draft, prompts, DRAFT_LENGTHS, NEW_TOKENS, temperature=0.0, repeats=REPEATS)
    out += table_rows(name, "greedy", greedy)
    # The refined model's choice of g, from the measured a, c and verify costs.
    a = sum(r["a_tested"] for r in greedy) / len(greedy)
    gs, costs = [r["g"] for r in greedy], [r["verify_cost"] for r in greedy]
    best_g = optimal_draft_length(a, greedy[0]["c"], max_g=max(DRAFT_LENGTHS),
                                  verify_cost=lambda g: float(np.interp(g, gs, costs)))  # between measured g
    sampled = measure(target, draft, prompts, sorted({1, best_g}), NEW_TOKENS, temperature=1.0, repeats=REPEATS)
    out += table_rows(name, "sample T=1", sampled)
    adaptive = measure(target, draft, prompts, (6,), NEW_TOKENS, temperature=0.0, repeats=REPEATS, adaptive=0.5)
    out += table_rows(name, "greedy adaptive 0.5", adaptive)
    return out, best_g


def main():
    start = time.perf_counter()
    target, tok = load("tiny", device="cpu")
    draft, _ = load("tiny-draft", device="cpu")
    rows, best_g = run_pair("tiny/tiny-draft", target, draft, tok, torch.device("cpu"))
    print_table(rows, COLS)
    print(f"refined model's best g (measured a, c, verify cost): {best_g}")

    # Prompt lookup on an input-grounded task: the prompt holds a held-out function and its first line
    # again; the continuation is as long as the function body.
    edits = editing_prompts(tok, num=4)
    lookup = measure_prompt_lookup(target, [p for p, _ in edits], (4, 8), [min(n, 100) for _, n in edits],
                                   repeats=REPEATS)
    lookup_rows = [{"pair": "tiny + prompt lookup", "mode": "greedy", "g": r["g"], "a": round(r["a"], 3),
                    "tok/pass": round(r["tokens_per_pass"], 2), "S_measured": round(r["speedup_measured"], 2),
                    "plain_ms/tok": round(r["plain_ms_per_token"], 2),
                    "spec_ms/tok": round(r["spec_ms_per_token"], 2)} for r in lookup]
    print()
    print_table(lookup_rows, list(lookup_rows[0]))
    rows += lookup_rows

    if torch.cuda.is_available() and not offline():
        try:
            t_hub, tok_hub = load("smollm2-360m", device="cuda")
            d_hub, _ = load("smollm2-135m", device="cuda")
            hub_rows, hub_g = run_pair("SmolLM2-360M/135M", t_hub, d_hub, tok_hub, torch.device("cuda"))
            print()
            print_table(hub_rows, COLS)
            rows += hub_rows
        except Exception as e:  # noqa: BLE001 (a hub or driver problem must not lose the CPU results)
            print(f"SmolLM2 pair skipped: {type(e).__name__}: {e}")
    else:
        why = "no CUDA GPU" if not torch.cuda.is_available() else "offline (COURSE_OFFLINE / HF_HUB_OFFLINE)"
        print(f"SmolLM2-360M/135M pair skipped: {why}")
    print(f"({time.perf_counter() - start:.0f} s)")
    print("saved", save("speculative", rows, new_tokens=NEW_TOKENS, prompts=NUM_PROMPTS, repeats=REPEATS,
                        threads=torch.get_num_threads(), best_g=best_g))


if __name__ == "__main__":
    main()
