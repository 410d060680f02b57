"""Lab 07, Parts E and F: the answer key's FlashAttention kernels (forward, backward) against SDPA.

    python bench/lab07_kernel.py               (or: course bench lab07_kernel; make gpu-check runs it)

The kernel and its launcher are read from the answer cell of solutions/lab07.ipynb (grade_id
``flash_kernel_answer``), as the lab runs them: what is timed is the code students are graded against, not
a copy. On a CUDA GPU Triton builds for (compute capability >= 7.0: a T4 included, where Triton compiles
without tensor cores and without bf16): causal, float16 (the lab's 16-bit type, which every such GPU
computes), GQA, tiles of 64, each length timed interleaved with ``torch.nn.functional.scaled_dot_product_attention``
(``course_lib.perf.timing.compare``) after a correctness check against it (max |kernel - SDPA| < 2e-2, else
exit 1). ``vs_sdpa`` = the kernel's time / SDPA's (median of the paired rounds): a plain teaching kernel is
expected to be slower, the number says by how much on this GPU.

Part F's backward (grade_id ``flash_backward_answer``, float32 as its contract says, exact ``ieee`` dots) is
checked against torch.autograd through SDPA (max relative error < 1e-3, else exit 1) and timed against SDPA's
own backward in float32 (``--bwd-seq``), with the forward excluded from both.

Without such a GPU it prints why and exits 0: on a CPU the kernel runs only in Triton's interpreter, where
the lab's tests grade it (tests/test_grading.py) and a time means nothing.

Writes bench/results/lab07_kernel-cuda.json with the device named.
"""
import argparse
import json
import linecache
import math
import sys
from pathlib import Path

import torch
from _common import print_table, save

from course_lib.env import TRITON_FLOOR_CAPABILITY, compute_capability, has_package

ROOT = Path(__file__).resolve().parents[1]
ANSWER_ID = "flash_kernel_answer"
BACKWARD_ID = "flash_backward_answer"
COLS = ["seq", "impl", "time_ms", "TFLOP/s", "vs_sdpa", "max_err"]


def skip_reason() -> str | None:
    """None when the kernel compiles here, else why this bench does not run."""
    if not torch.cuda.is_available():
        return ("no CUDA GPU: the kernel runs only in Triton's interpreter on a CPU, where the lab's tests grade "
                "it (tests/test_grading.py); a time there means nothing")
    if not has_package("triton"):
        return "the triton package is not installed"
    cc = compute_capability()
    if tuple(cc) < TRITON_FLOOR_CAPABILITY:
        return f"compute capability {cc[0]}.{cc[1]}: the lab runs its kernel in the interpreter below 7.0"
    return None


def answer_source(notebook: Path = ROOT / "solutions" / "lab07.ipynb", answer_id: str = ANSWER_ID) -> str:
    """The answer cell of Part E as a student's finished cell: the solution markers removed."""
    for cell in json.loads(notebook.read_text())["cells"]:
        if cell.get("metadata", {}).get("nbgrader", {}).get("grade_id") == answer_id:
            src = "".join(cell["source"])
            return "\n".join(ln for ln in src.split("\n") if "### BEGIN SOLUTION" not in ln
                             and "### END SOLUTION" not in ln) + "\n"
    raise ValueError(f"{notebook} has no cell with grade_id {answer_id!r}")


def load_answer(answer_id: str = ANSWER_ID) -> dict:
    """Run the answer cell in a fresh namespace (with the setup cell's `math`, `torch`, `triton`, `tl`) and
    return it. @triton.jit reads its function's source through linecache, as in a notebook, so the cell
    goes there."""
    import triton
    import triton.language as tl
    src, name = answer_source(answer_id=answer_id), f"<lab07 {answer_id}>"
    linecache.cache[name] = (len(src), None, src.splitlines(True), name)
    ns = {"math": math, "torch": torch, "triton": triton, "tl": tl, "__name__": "lab07_answer"}
    exec(compile(src, name, "exec"), ns)
    return ns


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--head-dim", type=int, default=64, choices=(16, 32, 64, 128))
    ap.add_argument("--seq", type=int, nargs="+", default=[1024, 2048, 4096])
    ap.add_argument("--block", type=int, default=64, help="block_m = block_n, a power of two >= 16")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--bwd-seq", type=int, nargs="*", default=[1024, 2048],
                    help="lengths for Part F's backward (float32, head dim 64 at most); none to skip it")
    args = ap.parse_args(argv)
    why = skip_reason()
    if why is not None:
        print(f"bench/lab07_kernel.py skipped: {why}")
        return 0
    import torch.nn.functional as F

    from course_lib.perf.timing import compare
    flash_attention = load_answer()["flash_attention"]
    B, H, K, D = args.batch, args.heads, args.kv_heads, args.head_dim
    dev, dtype = torch.device("cuda"), torch.float16
    rows, failed = [], []
    for N in args.seq:
        g = torch.Generator(device=dev).manual_seed(N)
        q = torch.randn(B, H, N, D, generator=g, device=dev).to(dtype)
        k, v = (torch.randn(B, K, N, D, generator=g, device=dev).to(dtype) for _ in range(2))
        # SDPA gets K and V expanded to every query head once, outside the timing (its GQA flag needs a
        # recent torch); the kernel reads the KV head in place
        ke, ve = k.repeat_interleave(H // K, 1), v.repeat_interleave(H // K, 1)
        mine = lambda: flash_attention(q, k, v, causal=True, block_m=args.block, block_n=args.block)  # noqa: E731
        sdpa = lambda: F.scaled_dot_product_attention(q, ke, ve, is_causal=True)  # noqa: E731
        err = (mine().float() - sdpa().float()).abs().max().item()
        if not err < 2e-2:
            failed.append(f"N={N}: max |kernel - SDPA| = {err:.3g}")
        cmp = compare({"lab07 kernel": mine, "sdpa": sdpa}, warmup=2, repeats=args.repeats, device=dev)
        flops = 4 * B * H * N * N * D / 2
        for name in ("lab07 kernel", "sdpa"):
            t = cmp.time(name)
            rows.append({"seq": N, "impl": name, "time_ms": round(t * 1e3, 3), "TFLOP/s": round(flops / t / 1e12, 2),
                         "vs_sdpa": round(cmp.ratio(name, "sdpa"), 2),
                         "max_err": f"{err:.1e}" if name != "sdpa" else "", "note": cmp.note()})
    bwd_rows = backward_rows(args, failed) if args.bwd_seq else []
    cc = compute_capability()
    print(f"{torch.cuda.get_device_name()} (compute capability {cc[0]}.{cc[1]}): B={B} H={H} Hkv={K} d={D} fp16 "
          f"causal, tiles {args.block}x{args.block}; vs_sdpa = kernel time / SDPA time (paired rounds)")
    print_table(rows, COLS)
    if bwd_rows:
        print(f"Part F backward: B={B} H={H} Hkv={K} d={min(D, 64)} fp32 causal, tiles 32x32; the forward's time "
              "excluded; vs_sdpa = backward time / SDPA's backward time")
        print_table(bwd_rows, COLS)
    path = save('lab07_kernel', rows + bwd_rows, dtype='fp16 forward, fp32 backward', causal=True, block=args.block)
    print(f"wrote {path}")
    if failed:
        print("the lab's kernel disagrees with SDPA: " + "; ".join(failed), file=sys.stderr)
        return 1
    return 0


def backward_rows(args, failed: list) -> list[dict]:
    """Part F's answer: gradients checked against autograd through SDPA, then timed against SDPA's backward."""
    import torch.nn.functional as F

    from course_lib.perf.timing import compare
    flash_attention_backward = load_answer(BACKWARD_ID)["flash_attention_backward"]
    B, H, K, D = args.batch, args.heads, args.kv_heads, min(args.head_dim, 64)   # the contract's head dims
    dev, rows = torch.device("cuda"), []
    for N in args.bwd_seq:
        g = torch.Generator(device=dev).manual_seed(N + 1)
        q, do = (torch.randn(B, H, N, D, generator=g, device=dev) for _ in range(2))
        k, v = (torch.randn(B, K, N, D, generator=g, device=dev) for _ in range(2))
        expanded = (q, k.repeat_interleave(H // K, 1), v.repeat_interleave(H // K, 1))   # SDPA's heads: H each
        leaves = [x.clone().requires_grad_() for x in expanded]
        out = F.scaled_dot_product_attention(*leaves, is_causal=True)
        s = (q @ leaves[1].detach().transpose(-1, -2)) / math.sqrt(D)
        s = s.masked_fill(torch.ones(N, N, dtype=torch.bool, device=dev).triu(1), float("-inf"))
        lse, o = torch.logsumexp(s, -1), out.detach()
        del s
        mine = lambda: flash_attention_backward(q, k, v, o, lse, do, causal=True, block_m=32, block_n=32)  # noqa: E731
        sdpa = lambda: torch.autograd.grad(out, leaves, do, retain_graph=True)  # noqa: E731
        got, want = mine(), sdpa()
        want = (want[0], *(w.unflatten(1, (K, H // K)).sum(2) for w in want[1:]))   # GQA: sum a KV head's queries
        err = max(((a - b).abs().max() / b.abs().max()).item() for a, b in zip(got, want))
        if not err < 1e-3:
            failed.append(f"backward N={N}: max relative |kernel - autograd| = {err:.3g}")
        cmp = compare({"lab07 backward": mine, "sdpa backward": sdpa}, warmup=2, repeats=args.repeats, device=dev)
        flops = 2.5 * 4 * B * H * N * N * D / 2          # five tile matmuls against the forward's two, causal
        for name in ("lab07 backward", "sdpa backward"):
            t = cmp.time(name)
            rows.append({"seq": N, "impl": name, "time_ms": round(t * 1e3, 3), "TFLOP/s": round(flops / t / 1e12, 2),
                         "vs_sdpa": round(cmp.ratio(name, "sdpa backward"), 2),
                         "max_err": f"{err:.1e}" if name != "sdpa backward" else "", "note": cmp.note()})
    return rows


if __name__ == "__main__":
    sys.exit(main())
