"""Plain (recompute) generation on the bundled pair: TTFT, TPOT, tokens/s, and the draft/target cost ratio.

    python bench/generation.py          (or: course bench generation)

Writes bench/results/generation-<cpu|cuda>.json with the device named.
"""
import torch
from _common import print_table, save

from course_lib.generation import generate
from course_lib.models import flops_per_token, load
from course_lib.perf.metrics import summarize

PROMPT = "import os\nimport sys\n\n\ndef main(argv=None):\n    parser = argparse.ArgumentParser("
NEW_TOKENS, REQUESTS = 32, 5


def main():
    names = ("tiny", "tiny-draft")
    pairs = {name: load(name) for name in names}
    ids = {name: tok(PROMPT)["input_ids"] for name, (_, tok) in pairs.items()}
    for name, (model, _) in pairs.items():
        generate(model, ids[name], 4)  # warm-up: allocator, lazy init
    # Requests alternate between the two models, so a burst of load on a shared machine slows both
    # alike and their ratio stays honest (measured one after the other, a burst lands on one model).
    traces = {name: [] for name in names}
    for _ in range(REQUESTS):
        for name, (model, _) in pairs.items():
            traces[name].append(generate(model, ids[name], NEW_TOKENS).trace)
    rows = []
    for name, (model, _) in pairs.items():
        s = summarize(traces[name])
        rows.append({"model": name, "params": f"{model.num_parameters():,}",
                     "flops/token": f"{flops_per_token(model.config):,}",
                     "ttft_p50_ms": round(s["ttft_p50"] * 1e3, 2), "tpot_p50_ms": round(s["tpot_p50"] * 1e3, 2),
                     "tokens_per_s_p50": round(s["tokens_per_second_p50"], 1)})
    rows.append({"model": "draft/target", "params": "", "flops/token": "",
                 "ttft_p50_ms": round(rows[1]["ttft_p50_ms"] / rows[0]["ttft_p50_ms"], 2),
                 "tpot_p50_ms": round(rows[1]["tpot_p50_ms"] / rows[0]["tpot_p50_ms"], 2),
                 "tokens_per_s_p50": round(rows[1]["tokens_per_s_p50"] / rows[0]["tokens_per_s_p50"], 2)})
    print_table(rows, list(rows[0]))
    print("saved", save("generation", rows, new_tokens=NEW_TOKENS, requests=REQUESTS,
                        threads=torch.get_num_threads()))


if __name__ == "__main__":
    main()
