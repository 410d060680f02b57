"""Weight-only quantized decode GEMVs at SmolLM2-1.7B's shape: bf16 (fp32) vs int8 vs int4 weights.

    python bench/quant.py [--quick] [--reference]          (or: course bench quant)

One decoder layer's batch-1 matmuls (hidden 2048, intermediate 8192: q, k, v, o, gate, up, down; 67M
weights) through torch's fused weight-only kernels (``torch._weight_int8pack_mm``, ``_weight_int4pack_mm``
or its CPU twin), bf16 activations. Rows are timed in turns and reported as medians, with the speed-up
over bf16 measured in the same run. gpt-fast reports 1.48x (int8) and 1.88x (int4) tokens/s over bf16
for a whole Llama-2-7B on an A100: the target for a GPU run (theirs is a whole model, ours one layer's
GEMVs, the part quantization speeds up). --quick: hidden 512 / intermediate 2048, for tests.
Writes bench/results/quant-<cpu|cuda>.json.
"""
import argparse

import torch
from _common import device_name, print_table, save

from course_lib.quant.fast import GPT_FAST_A100, decode_gemv_benchmark


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a small shape (hidden 512, intermediate 2048)")
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--intermediate", type=int, default=8192)
    ap.add_argument("--group-size", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--reference", action="store_true", help="add the unfused dequantize+matmul row (slow on CPU)")
    args = ap.parse_args(argv)
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    hidden, inter = (512, 2048) if args.quick else (args.hidden, args.intermediate)
    rows = decode_gemv_benchmark(hidden, inter, args.repeats, args.group_size, dev, reference=args.reference)
    print(f"batch-1 decode GEMVs of one layer, hidden {hidden}, intermediate {inter}, on {device_name()}")
    print_table(rows, list(rows[0]))
    by = {r["weights"].split()[0]: r["speed-up vs 16-bit"] for r in rows}
    print(f"gpt-fast on an A100 (whole Llama-2-7B): int8 {GPT_FAST_A100['int8']}x, int4 {GPT_FAST_A100['int4']}x; "
          f"here: int8 {by.get('int8', 'n/a')}x, int4 {by.get('int4', 'n/a')}x")
    print("saved", save("quant", rows, hidden=hidden, intermediate=inter, group_size=args.group_size,
                        repeats=args.repeats, gpt_fast_a100=GPT_FAST_A100))


if __name__ == "__main__":
    main()
