# %% [markdown] id="c002"
# # Module 07 · FlashAttention
#
# Attention compares every query with every key: for a sequence of N tokens that is an N x N matrix of
# scores per head. Written out in full, that matrix is the largest tensor of the whole forward pass at
# long contexts, and moving it to and from the GPU's main memory (HBM) costs more time than the
# arithmetic. FlashAttention [@dao2022flashattention] computes **exactly** the same result without ever
# writing the matrix: it walks the keys in tiles that fit in the chip's fast on-chip memory (SRAM) and keeps
# a running softmax [@milakov2018online; @rabe2021selfattention].
#
# Lecture notes often say it is "2-4x faster", that it "reduces memory I/O by a factor of sqrt(N)", and
# that "you usually don't need to implement it yourself". This notebook checks the first two and does the
# third anyway, with `course_lib.attention`:
#
# 1. the memory of the N x N scores, computed;
# 2. the IO model: how many elements standard and tiled attention move, counted and predicted;
# 3. online softmax, step by step, and why the rescaling makes it exact;
# 4. tiled exact attention in PyTorch (causal tiles skipped, the diagonal masked);
# 5. a Triton kernel, against the reference and every SDPA backend this machine has;
# 6. PyTorch's SDPA backends and the flash-attn package: which one runs here, and why a T4 has no flash;
# 7. flash-decoding: splitting the keys of one decode step, merged by log-sum-exp;
# 8. what FlashAttention-2 and -3 changed;
# 9. causal masks when there are fewer queries than keys (decode, chunked prefill).

# %% id="c003" tags=["parameters"]
import course_lib.env

QUICK = course_lib.env.quick()
MEMORY_LENS = [512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072]
IO_LENS = [2 ** p for p in range(8, 18)]               # the IO model is arithmetic: any length is cheap
HEADS, HEAD_DIM = (4, 64) if QUICK else (32, 128)      # the speed comparison's shape
BATCH = 1 if QUICK else 4
SPEED_LENS = [128, 256, 512] if QUICK else [512, 1024, 2048, 4096, 8192]
TILED_MAX = 256 if QUICK else 2048                     # the Python-loop tiled version is timed up to here
REPEATS = 3 if QUICK else 20

# %% id="c004"
import math
import os
import subprocess
import sys
import textwrap

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F

from course_lib.attention import (LOOP_ORDERS, IOCounter, combine_splits, count_io, flash_attention_io,
                                  flash_attn_status, flash_backend_reason, flash_decode_torch, flash_io_theta,
                                  hf_attn_implementation, io_reduction, io_reduction_limit, online_softmax,
                                  reference_attention, scores_bytes, sdpa_backend_report, sdpa_default_backend,
                                  softmax_stats_update, split_partials, sram_tiles, standard_attention_io,
                                  tiled_attention, triton_status)
from course_lib.attention.backends import BACKEND_NAMES, run_backend
from course_lib.perf.hardware import get_gpu
from course_lib.perf.claims import timing_claim
from course_lib.perf.tables import format_records
from course_lib.perf.timing import compare

device = course_lib.env.device()
caps = course_lib.env.capabilities()
print(f"device: {caps.device} ({caps.device_name}), compute capability {caps.compute_capability}, "
      f"triton {'yes' if caps.triton else 'no'}")

# %% [markdown] id="c005"
# ## 1. The N x N scores
#
# Standard attention computes S = Q K^T / sqrt(d) ([N, N] per head), P = softmax(S) (another [N, N]),
# then O = P V. For a Llama-7B-sized layer (32 heads, fp16), the scores alone take:

# %% id="c006"
rows = []
for N in MEMORY_LENS:
    s = scores_bytes(N, heads=32, bytes_per_element=2)
    qkvo = 4 * N * 32 * 128 * 2                              # Q, K, V, O of the same layer: linear in N
    rows.append({"N": N, "scores (GB)": s / 1e9, "Q,K,V,O (GB)": qkvo / 1e9, "scores / QKVO": s / qkvo})
print(format_records(rows, floatfmt=".3g"))
fig, ax = plt.subplots(figsize=(6, 3))
ax.loglog(MEMORY_LENS, [r["scores (GB)"] for r in rows], "o-", label="N x N scores (32 heads, fp16)")
ax.loglog(MEMORY_LENS, [r["Q,K,V,O (GB)"] for r in rows], "s-", label="Q, K, V, O")
ax.axhline(80, color="gray", ls="--", label="an 80 GB GPU")
ax.set(xlabel="sequence length N", ylabel="GB per layer, batch 1")
ax.legend(fontsize=8)
plt.show()
at_32k = next(r for r in rows if r["N"] == 32768)
assert at_32k["scores (GB)"] > 60 and rows[-1]["scores (GB)"] > 80     # one layer's scores fill a GPU
assert rows[0]["scores / QKVO"] == 512 / (4 * 128)                    # N / 4d: grows linearly with N

# %% [markdown] id="c007"
# The scores grow as N^2 and the inputs as N: at 32k tokens one layer's scores would need ~69 GB. Tiled
# attention keeps only a [block_q, block_k] tile of them at a time, so its extra memory is O(N) (the
# output and one log-sum-exp per row). "Up to 10x memory reduction" is therefore no constant: the saving
# is the ratio in the last column (N / 4d), tens at 8k tokens and hundreds at 128k.
#
# ## 2. Counting the bytes: the IO model
#
# A GPU has two memories that matter here: HBM (tens of GB, ~3 TB/s on an H100) and the SRAM of each
# streaming multiprocessor (up to 228 KB of shared memory per SM on an H100), with about an order of
# magnitude more bandwidth (the FlashAttention paper's figure: 19 TB/s of SRAM against 1.5 TB/s of HBM on
# an A100 [@dao2022flashattention]). Per head, with N tokens, head dim d and M elements of SRAM
# (`course_lib.attention.io_model` counts these):
#
# * **standard attention** (the paper's Algorithm 0) reads Q and K, writes S, reads S, writes P, reads P
#   and V, writes O: **4Nd + 4N^2** elements, Theta(Nd + N^2).
# * **tiled attention** never writes S or P, but one of the two operands is read more than once. Which one
#   depends on the loop order, and there are two:
#   * **key tiles outside**, the paper's Algorithm 1 [@dao2022flashattention, Algorithm 1]: O, l and m start
#     in HBM (zeros and -inf); for each key tile K_j, V_j (loaded once), every query tile loads Q_i, O_i,
#     l_i, m_i, updates them and writes O_i, l_i, m_i back. Q and O go through HBM once per **key tile**:
#     Nd + 2N + 2Nd + ceil(N / B_c)(3Nd + 4N) elements.
#   * **query tiles outside**, FlashAttention-2's order [@dao2024flashattention2] and ours (`tiled_attention`,
#     the Triton kernel of section 5): each query tile loads Q_i once, walks every K and V tile and writes
#     O_i once; its running m, l and output stay on chip. K and V go through HBM once per **query tile**:
#     Nd + 2Nd ceil(N / B_r) + Nd elements.
#
# **The SRAM sizes the outer loop's tile.** Algorithm 1 sets B_c = ceil(M / 4d) key rows and
# B_r = min(ceil(M / 4d), d) query rows: K_j and V_j take M/4 each, Q_i and O_i at most M/4 each, and the
# B_r x B_c score tile at most d x M/4d = M/4. The cap at d is on the **inner** tile: it keeps the score
# tile within M/4 while the outer tile grows with M. The query-outer order splits M the same way with the
# roles swapped: B_r = ceil(M / 4d), B_c = min(ceil(M / 4d), d) (`sram_tiles`). With those tiles:
#
# * key tiles outside: about 3Nd x N / B_c = **12 N^2 d^2 / M** (plus 16 N^2 d / M for l and m);
# * query tiles outside: about 2Nd x N / B_r = **8 N^2 d^2 / M**;
#
# both the paper's Theta(N^2 d^2 / M) (its Theorem 2), so the saving over standard attention tends to
# **M / 3d^2** and **M / 2d^2**: set by the SRAM against d^2, growing with M, not with N. (An earlier
# version of this notebook capped the *outer* query tile at d rows; K and V were then re-read every d
# queries, and the saving came out as a constant 2x on every GPU with M >= 4d^2, contradicting the
# theorem.)
#
# The model is checked against the loops themselves: `count_io` runs each order's tile loops and counts
# every load and store; `flash_attention_io` is the closed form; `tiled_attention`'s `IOCounter` counts
# what the real computation reads. They must agree exactly, causal or not, for lengths that are not tile
# multiples.

# %% id="c008"
g = torch.Generator().manual_seed(0)
checks = []
for N, d, bq, bk, causal in ((256, 32, 64, 64, False), (300, 16, 64, 32, True), (97, 64, 16, 24, True)):
    q, k, v = (torch.randn(1, 2, N, d, generator=g) for _ in range(3))
    counter = IOCounter()
    tiled_attention(q, k, v, causal=causal, block_q=bq, block_k=bk, counter=counter)
    for order in LOOP_ORDERS:
        loops = count_io(N, d, bq, bk, order, causal)
        closed = flash_attention_io(N, d, block_q=bq, block_k=bk, causal=causal, order=order)
        assert (loops["reads"], loops["writes"]) == (closed["reads"], closed["writes"]), (order, loops, closed)
        if order == "query_outer":                                   # the real loop, 2 heads
            assert counter.total == 2 * loops["total"], (counter, loops)
        checks.append({"N": N, "d": d, "B_r x B_c": f"{bq}x{bk}", "causal": causal, "order": order,
                       "IOCounter": counter.total // 2 if order == "query_outer" else "-",
                       "loops counted": loops["total"], "closed form": closed["total"],
                       "passes over Q": loops["q_reads"] / (N * d), "over K": loops["k_reads"] / (N * d)})
print(format_records(checks, floatfmt=".3g"))

# %% [markdown] id="c009a"
# **Tiles from real SRAM sizes.** One SM's shared memory in fp16 elements, at the two head sizes models use,
# for N = 8192 and in the limit of long sequences:

# %% id="c009"
GPUS = ["T4", "A100-80GB", "H100-SXM"]
tile_rows = []
for name in GPUS:
    gpu = get_gpu(name)
    M = gpu.smem_per_sm_kb * 1024 // 2
    for d in (64, 128):
        for order in LOOP_ORDERS:
            b_r, b_c = sram_tiles(d, M, order)
            tile_rows.append({"GPU": f"{name} ({gpu.smem_per_sm_kb} KB)", "d": d, "order": order,
                              "B_r": b_r, "B_c": b_c, "saving, N=8192": io_reduction(8192, d, M, order),
                              "saving, N->inf": io_reduction_limit(d, M, order),
                              "M/3d^2 | M/2d^2": M / ((3 if order == "kv_outer" else 2) * d * d)})
            assert b_r * b_c <= M / 4 + d and max(b_r, b_c) * d <= M / 4 + d     # every tile within ~M/4
print(format_records(tile_rows, floatfmt=".3g"))
sat = {(r["GPU"].split()[0], r["d"], r["order"]): r["saving, N->inf"] for r in tile_rows}
assert 2.2 < sat["H100-SXM", 128, "kv_outer"] < 2.5 and 3.4 < sat["H100-SXM", 128, "query_outer"] < 3.7
assert 6.5 < sat["A100-80GB", 64, "kv_outer"] < 7 and 10 < sat["A100-80GB", 64, "query_outer"] < 10.5
assert sat["T4", 128, "kv_outer"] < 1 <= sat["T4", 128, "query_outer"]     # M < 3d^2: tiling moves more

# %% [markdown] id="c009b"
# The last rows are worth a look: a T4's 64 KB at d = 128 is below 3d^2 elements, and there Algorithm 1's
# order moves *more* than standard attention: per key tile of B_c = 64 rows it moves Q and O in and O out
# (3Nd, about 6N elements per key at d = 128), more than the 4N per key of writing and reading S and P; the
# query-outer order only breaks even. The
# model counts shared memory only; a real kernel also keeps its accumulator in the register file (256 KB per
# SM on these GPUs), so its tiles can be larger than `sram_tiles` says.
#
# How the saving grows with the SRAM, and how it does not grow with N:

# %% id="c009c"
M_KB = [16, 32, 48, 64, 96, 128, 164, 192, 228, 256, 384, 512]
fig, (a1, a2) = plt.subplots(1, 2, figsize=(10.5, 3.4))
for d, color in ((64, "tab:blue"), (128, "tab:orange")):
    for order, style in (("kv_outer", "o--"), ("query_outer", "s-")):
        lim = [io_reduction_limit(d, kb * 512, order) for kb in M_KB]
        a1.loglog(M_KB, lim, style, color=color, ms=4, label=f"d={d}, {order.replace('_', ' ')}")
        # proportional to M once M is a few d^2: M / 3d^2 (key tiles outside), M / 2d^2 (query tiles outside)
        c = 3 if order == "kv_outer" else 2
        assert all(abs(x / (kb * 512 / (c * d * d)) - 1) < 0.15 for kb, x in zip(M_KB, lim) if kb * 512 >= 8 * d * d)
for name in GPUS:
    a1.axvline(get_gpu(name).smem_per_sm_kb, color="gray", lw=0.8, ls=":")
    a1.text(get_gpu(name).smem_per_sm_kb, 0.2, name.split("-")[0], rotation=90, fontsize=7, va="bottom")
a1.axhline(1, color="k", lw=0.6)
a1.set_xticks([16, 32, 64, 128, 256, 512], ["16", "32", "64", "128", "256", "512"])
a1.xaxis.set_minor_formatter(plt.NullFormatter())
a1.set(xlabel="shared memory per SM (KB, fp16 elements = KB x 512)", ylabel="standard / tiled (N -> inf)",
       title="IO saving grows with the SRAM")
a1.legend(fontsize=7)
h100 = get_gpu("H100-SXM")
M = h100.smem_per_sm_kb * 1024 // 2
d = 128
for order, style in (("kv_outer", "o--"), ("query_outer", "s-")):
    red = [io_reduction(N, d, M, order) for N in IO_LENS]
    a2.semilogx(IO_LENS, red, style, ms=4, label=f"{order.replace('_', ' ')} (model)")
    assert abs(red[-1] / red[-2] - 1) < 0.02 and abs(red[-1] / io_reduction_limit(d, M, order) - 1) < 0.02
a2.semilogx(IO_LENS, [math.sqrt(N) / 8 for N in IO_LENS], "r:", label="sqrt(N) / 8: the notes' growth, scaled")
a2.set(xlabel="N", ylabel="standard / tiled", title=f"H100 ({h100.smem_per_sm_kb} KB), d = {d}: flat in N",
       ylim=(0, 6))
a2.legend(fontsize=7)
plt.tight_layout()
plt.show()
fla = {o: [flash_attention_io(N, d, sram_elements=M, order=o)["total"] for N in IO_LENS] for o in LOOP_ORDERS}
theta = [flash_io_theta(N, d, M) for N in IO_LENS]
print("tiled / (N^2 d^2 / M) at N = " + f"{IO_LENS[-1]}: " + ", ".join(
    f"{o} {fla[o][-1] / theta[-1]:.2f}" for o in LOOP_ORDERS) + "  (12 + 16/d and 8: the Theta's constants)")
assert abs(fla["kv_outer"][-1] / theta[-1] - (12 + 16 / d)) < 0.3 and abs(fla["query_outer"][-1] / theta[-1] - 8) < 0.2

# %% [markdown] id="c009d"
# **Against the paper's measurement.** Figure 2 of the paper measures attention in GPT-2 medium (N = 1024,
# d = 64, 16 heads, batch 64) on an A100: **40.3 GB** of HBM reads and writes for standard attention against
# **4.4 GB** for FlashAttention, forward and backward [@dao2022flashattention, Figure 2]. The model counts the
# forward pass only, in fp16, with an A100's 164 KB of shared memory per SM and with the 192 KB per SM
# behind the paper's "20 MB of SRAM" (108 SMs):

# %% id="c009e"
PAPER_GB = {"standard": 40.3, "FlashAttention": 4.4}       # Dao et al. 2022, Figure 2 (forward + backward)
N, d, heads, batch = 1024, 64, 16, 64
to_gb = 2 * heads * batch / 1e9                            # fp16 elements of one (batch, head) -> GB
std_gb = standard_attention_io(N, d)["total"] * to_gb
paper_rows = [{"what": "paper, measured (fwd + bwd)", "standard GB": PAPER_GB["standard"],
               "tiled GB": PAPER_GB["FlashAttention"], "saving": PAPER_GB["standard"] / PAPER_GB["FlashAttention"]}]
for kb in (get_gpu("A100-80GB").smem_per_sm_kb, 192):
    for order in LOOP_ORDERS:
        t_gb = flash_attention_io(N, d, sram_elements=kb * 512, order=order)["total"] * to_gb
        paper_rows.append({"what": f"model, forward, {kb} KB, {order}", "standard GB": std_gb, "tiled GB": t_gb,
                           "saving": std_gb / t_gb})
print(format_records(paper_rows, floatfmt=".3g"))
assert all(3 < r["saving"] < 12 for r in paper_rows)      # one order of magnitude, model and measurement
assert abs(PAPER_GB["standard"] / PAPER_GB["FlashAttention"] - 9.16) < 0.01

# %% [markdown] id="c010"
# The model's forward pass moves about a quarter of the paper's standard-attention bytes: the measurement
# also counts the backward pass, which reads and writes several more N x N matrices (P again, dP, dS), and
# GPT-2's masking and dropout passes over them. What compares is the saving: several-fold in the model,
# 9.2x measured, the same order of magnitude at N = 1024 (and the model's saving would be the same at
# N = 64k, where the notes' sqrt(N) would make it 8x larger).
#
# > **Claim checked.** The notes say FlashAttention "reduces memory I/O cost by a factor of sqrt(N)". The
# > loops counted above say otherwise: tiled attention moves Theta(N^2 d^2 / M) elements against standard
# > attention's Theta(Nd + N^2) [@dao2022flashattention, Theorem 2], so the saving tends to about M / 3d^2
# > (the paper's loop order) or M / 2d^2 (FlashAttention-2's), **set by the SRAM against d^2**: about 2.3x
# > and 3.6x on an H100 SM at d = 128, 6.7x and 10x on an A100 SM at d = 64, and more with every doubling of
# > M; it stops growing with N, where sqrt(N) would keep growing (16x at 256 tokens, 362x at 131k). Where
# > FlashAttention's advantage does grow with N is **memory** (section 1: O(N) instead of O(N^2)), and it is
# > exact, not an approximation.
#
# ## 3. Online softmax, step by step
#
# Softmax needs the row's maximum (for stability) and the sum of exponentials before it can write a
# single output, which seems to demand the whole row. The online version reads the row in pieces and
# keeps a running max m and a running sum l; when a new piece raises the max, the sum so far was
# measured against the old max and is **rescaled** by exp(m_old - m_new):

# %% id="c011"
row = torch.tensor([[1.0, 3.0, 0.5, 2.0, 6.0, 1.5, 4.0, 0.0, 7.0, 2.5]])
m, l = torch.tensor([-math.inf]), torch.tensor([0.0])
steps = []
for i in range(0, row.shape[1], 3):
    piece = row[:, i:i + 3]
    m_old = m.clone()
    m, l = softmax_stats_update(m, l, piece)
    steps.append({"tile": f"{piece[0].tolist()}", "m": m.item(), "rescale exp(m_old - m)":
                  math.exp(m_old.item() - m.item()) if m_old.isfinite() else 0.0, "l": l.item()})
print(format_records(steps, floatfmt=".4g"))
assert math.isclose(m.item(), row.max().item()) and math.isclose(l.item(), torch.exp(row - row.max()).sum().item(),
                                                                 rel_tol=1e-6)
for split in ([10], [1] * 10, [4, 1, 5], 3):
    assert torch.allclose(online_softmax(row, split), row.softmax(-1), atol=1e-7)
print("online softmax == softmax on every split tried; max |diff| =",
      f"{(online_softmax(row, [4, 1, 5]) - row.softmax(-1)).abs().max():.1e}")

# %% [markdown] id="c012"
# Attention keeps a third running quantity, the unnormalized output acc = sum exp(s - m) v, rescaled by
# the same factor; out = acc / l at the end. Two partial results over different key ranges merge the same
# way (a log-sum-exp merge), which section 7 uses to split the keys across GPU programs.
#
# ## 4. Tiled exact attention
#
# `tiled_attention` is FlashAttention's forward pass written in PyTorch: a loop over query tiles, an inner
# loop over key tiles, the running (m, l, acc) per row. Causal: a key tile wholly in the future of a query
# tile is skipped (never loaded), and only the tiles crossing the diagonal are masked. The map below shows
# which tiles a causal pass visits.

# %% id="c013"
N_DEMO, BQ, BK = 100, 16, 16
q, k, v = (torch.randn(2, 8, N_DEMO, 32, generator=g) for _ in range(3))
k, v = k[:, :2].contiguous(), v[:, :2].contiguous()              # GQA: 8 query heads read 2 KV heads
errs = {}
for causal in (False, True):
    ref = reference_attention(q, k, v, causal=causal)
    errs[causal] = (tiled_attention(q, k, v, causal=causal, block_q=BQ, block_k=BK) - ref).abs().max().item()
print(f"N={N_DEMO} (not a multiple of {BQ}), GQA 8/2: max |tiled - reference| = {errs[False]:.1e} "
      f"(non-causal), {errs[True]:.1e} (causal)")
assert max(errs.values()) < 1e-5
tiles_q, tiles_k = -(-N_DEMO // BQ), -(-N_DEMO // BK)
grid = torch.zeros(tiles_q, tiles_k)
for i in range(tiles_q):
    for j in range(tiles_k):
        first_q, last_q, first_k, last_k = i * BQ, min(N_DEMO, (i + 1) * BQ) - 1, j * BK, min(N_DEMO, (j + 1) * BK) - 1
        grid[i, j] = 0 if first_k > last_q else (2 if last_k <= first_q else 1)
counter = IOCounter()
tiled_attention(q[:1, :1], k[:1, :1], v[:1, :1], causal=True, block_q=BQ, block_k=BK, counter=counter)
assert counter.tiles_visited == int((grid > 0).sum()) and counter.tiles_skipped == int((grid == 0).sum())
fig, ax = plt.subplots(figsize=(3.6, 3.2))
ax.imshow(grid, cmap="Greens", vmin=0, vmax=2)
ax.set(xlabel="key tile", ylabel="query tile", title="causal: skipped / masked / full")
plt.show()
print(f"causal tiles: {int((grid == 2).sum())} full, {int((grid == 1).sum())} masked (diagonal), "
      f"{int((grid == 0).sum())} skipped of {tiles_q * tiles_k}")

# %% [markdown] id="c014"
# ## 5. A Triton kernel
#
# `course_lib/attention/triton_flash.py` is the same algorithm as one GPU kernel: a program per (query
# tile, head) loads its Q tile once into registers, walks K and V in tiles (GQA: straight from the KV
# head, no copy), runs both matmuls on tensor cores (`tl.dot`), keeps m, l, acc in fp32 in the log2
# domain (`exp2`, the scale folded with log2 e), and writes only the output and one log-sum-exp per row.
# The key loop is split so that full tiles pay no mask and only the diagonal tiles (causal) or the last
# partial tile are masked. Tile sizes, warps and pipeline stages are autotuned on a GPU.
#
# On a GPU the next cell checks it against the reference at real sizes; on a CPU it runs under Triton's
# interpreter (`TRITON_INTERPRET=1` must be set before Triton is imported: a separate process), which
# shows correctness, not speed. Triton supports GPUs of compute capability 8.0 and newer, so on Colab's
# usual T4 (7.5) the course does not launch its Triton kernels: the cell takes the interpreter route as
# on a CPU, and `backend="auto"` elsewhere (paged attention, the serving engine) takes the PyTorch paths,
# with a one-line notice.

# %% id="c015"
if course_lib.env.triton_gpu_supported():
    from course_lib.attention.triton_flash import flash_attention_triton, flash_decode_triton
    qc, kc, vc = (torch.randn(1, 16, 2048, 128, device="cuda", dtype=torch.float16) for _ in range(3))
    for causal in (False, True):
        err = (flash_attention_triton(qc, kc, vc, causal=causal).float()
               - reference_attention(qc, kc, vc, causal=causal).float()).abs().max().item()
        print(f"Triton vs reference on {torch.cuda.get_device_name()}, N=2048, d=128, fp16, causal={causal}: "
              f"max error {err:.1e}")
        assert err < 5e-3
elif caps.triton:
    script = textwrap.dedent("""
        import torch
        from course_lib.attention import reference_attention
        from course_lib.attention.triton_flash import flash_attention_triton
        g = torch.Generator().manual_seed(0)
        q = torch.randn(1, 4, 37, 64, generator=g)                   # 37: not a multiple of the 16-row tile
        k, v = torch.randn(1, 2, 37, 64, generator=g), torch.randn(1, 2, 37, 64, generator=g)
        for causal in (False, True):
            err = (flash_attention_triton(q, k, v, causal=causal) - reference_attention(q, k, v, causal=causal))
            print(f"{err.abs().max().item():.3e}")
    """)
    env = dict(os.environ, TRITON_INTERPRET="1", OMP_NUM_THREADS="1")
    res = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    errs = [float(x) for x in res.stdout.split()]
    assert len(errs) == 2 and max(errs) < 1e-5
    print(f"Triton kernel under the CPU interpreter (N=37, GQA 4/2, d=64): max |Triton - reference| = "
          f"{errs[0]:.1e} non-causal, {errs[1]:.1e} causal. On a GPU Triton supports this cell runs it natively "
          "at N=2048.")
else:
    print("Triton is not installed here; on a GPU with Triton this cell checks the kernel at real sizes.")
triton_ok, triton_line = triton_status()                 # where the course's Triton kernels run, and why
print(triton_line)
assert triton_ok == course_lib.env.triton_gpu_supported()

# %% [markdown] id="c016"
# ### Speed: the kernel against every SDPA backend
#
# FLOPs of attention: two N x N x d matmuls, 4 B H N^2 d, half of it when causal. Below: time and TFLOP/s
# for each implementation this machine has, and the share of the device's dense peak (from the hardware
# table, GPUs only). At each length the implementations are timed interleaved (`compare`, Module 00), each
# by its fastest run. On a CPU the Triton row is absent (the interpreter is not a speed measurement), as on a
# GPU Triton does not support (a T4); `bench/attention.py` runs the same comparison at the GPU goal's size
# (sequence 4096, d = 128, bf16).

# %% id="c017"
speed_dtype = torch.bfloat16 if course_lib.env.real_bf16() else (torch.float16 if device.type == "cuda"
                                                                   else torch.float32)
dtype_name = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}[speed_dtype]
try:
    peak = get_gpu(torch.cuda.get_device_name()).peak_flops(dtype_name) if device.type == "cuda" else None
except ValueError:
    peak = None
impls = {}
if course_lib.env.triton_gpu_supported():
    impls["triton (course)"] = lambda q, k, v: flash_attention_triton(q, k, v, causal=True)
for name in BACKEND_NAMES:
    impls[f"sdpa {name}"] = lambda q, k, v, name=name: run_backend(name, q, k, v, causal=True)
impls["tiled (PyTorch loop)"] = lambda q, k, v: tiled_attention(q, k, v, causal=True, block_q=128, block_k=128)
speed = []
try:
    from tqdm.auto import tqdm
except ImportError:
    tqdm = lambda x, **kw: x  # noqa: E731
cmp_at = {}
for N in tqdm(SPEED_LENS, desc="sequence lengths"):
    q, k, v = (torch.randn(BATCH, HEADS, N, HEAD_DIM, device=device).to(speed_dtype) for _ in range(3))
    flops = 4 * BATCH * HEADS * N * N * HEAD_DIM / 2
    runs = {}
    for name, fn in impls.items():
        if name.startswith("tiled") and N > TILED_MAX:
            continue
        try:
            fn(q, k, v)
        except RuntimeError:
            continue                                    # this backend cannot run here (see section 6)
        runs[name] = lambda fn=fn: fn(q, k, v)
    cmp_at[N] = compare(runs, warmup=1, repeats=REPEATS, device=device)
    for name in runs:
        t = cmp_at[N].time(name)
        speed.append({"N": N, "impl": name, "ms": t * 1e3, "TFLOP/s": flops / t / 1e12,
                      "% of peak": None if peak is None else 100 * flops / t / peak})
print(f"B={BATCH} H={HEADS} d={HEAD_DIM} {dtype_name} causal on {caps.device_name}, fastest of {REPEATS} runs")
print(format_records(speed, floatfmt=".3g"))
fig, ax = plt.subplots(figsize=(6, 3.2))
for name in dict.fromkeys(r["impl"] for r in speed):
    pts = [(r["N"], r["TFLOP/s"]) for r in speed if r["impl"] == name]
    ax.plot(*zip(*pts), "o-", label=name)
ax.set(xscale="log", yscale="log", xlabel="sequence length", ylabel="TFLOP/s", title=f"attention forward, {caps.device}")
ax.legend(fontsize=8)
plt.show()
by = {(r["N"], r["impl"]): r["ms"] for r in speed}
N_big = SPEED_LENS[-1]
# the math backend materializes the N x N scores and may not fit at the longest length (then it is skipped)
N_both = max((N for N in SPEED_LENS if (N, "sdpa math") in by and (N, "sdpa flash") in by), default=None)
flash_vs_math = None if N_both is None else by[(N_both, "sdpa math")] / by[(N_both, "sdpa flash")]
if flash_vs_math is None:
    print("no length at which both SDPA's flash and math backends ran on this device")
else:
    timing_claim(f"at N={N_both} SDPA's flash backend is faster than its math backend on this device",
                 held=flash_vs_math > 1.0, measured=f"{flash_vs_math:.1f}x; {cmp_at[N_both].describe()}")

# %% [markdown] id="c018"
# > **Claim checked.** "2-4x faster attention" is a measurement on particular GPUs, sizes and baselines
# > (the paper's, against PyTorch attention of 2022, on an A100). The cell above shows this device's own
# > ratio of SDPA's flash backend over its math backend at the largest length tried, on this run; it grows with N,
# > because the math backend's cost is dominated by writing and reading the N x N scores. On a CPU,
# > "flash" is PyTorch's own tiled CPU kernel; on a GPU the Triton row and the share of the peak show how
# > close a tiled kernel gets to the tensor cores' limit.
#
# ## 6. SDPA backends, and the flash-attn package
#
# `F.scaled_dot_product_attention` dispatches to one of several kernels. `sdpa_kernel(SDPBackend.X)`
# forces one; a backend that cannot take the call refuses with a reason.

# %% id="c019"
q, k, v = (torch.randn(1, 4, 256, 64, device=device).to(speed_dtype) for _ in range(3))
report = sdpa_backend_report(q, k, v, causal=True)
print(format_records(report))
print(f"SDPA's default choice for this call: {sdpa_default_backend(q, k, v, causal=True)}")
assert next(r for r in report if r["backend"] == "math")["ok"]
for cc, name in (((7, 5), "T4"), ((8, 0), "A100"), ((9, 0), "H100")):
    why = flash_backend_reason(cc, torch.float16)
    print(f"{name} (sm_{cc[0]}{cc[1]}): {'flash backend available' if why is None else 'no flash backend: ' + why}")
assert flash_backend_reason((7, 5)) is not None and flash_backend_reason((8, 0)) is None

# %% [markdown] id="c020"
# A Colab T4 (Turing, sm_75) gets the memory-efficient backend for fp16 attention, not the flash one:
# PyTorch's flash backend is FlashAttention-2, compiled for Ampere and newer only. The separate
# **flash-attn** package (Tri Dao's) has the same limit, and is an optional extra: on Hugging Face models
# it is selected with `attn_implementation="flash_attention_2"` where it is installed and supported, and
# SDPA is the fallback.

# %% id="c021"
usable, line = flash_attn_status()
print(line)
impl = hf_attn_implementation()
print(f'transformers: AutoModelForCausalLM.from_pretrained(path, attn_implementation="{impl}")')
assert impl == ("flash_attention_2" if usable else "sdpa") and "\n" not in line

# %% [markdown] id="c022"
# ## 7. Flash-decoding: splitting the keys
#
# A decode step has one query per sequence. A kernel with one program per (sequence, KV head) has
# B * K programs: batch 1 with 8 KV heads runs 8 programs on a GPU with 132 SMs, while a long cache is
# read. Flash-decoding splits each sequence's keys into chunks processed by separate programs; each writes
# its partial (m, l, acc), and a second, tiny kernel merges them with log-sum-exp weights:
#
#     out = sum_s exp(m_s - M) acc_s / sum_s exp(m_s - M) l_s,   M = max_s m_s
#
# The merge is exact (it is the online-softmax merge of section 3). The paged decode kernel of Module 06
# splits the same way and launches **the same reduction** (`course_lib.attention.triton_splitkv`).
#
# Lengths: a sequence of length 0 (a padded batch slot) reads no key, every split is empty, and the merge
# returns a zero row rather than 0/0, the reference's rule for a row with no key. A length outside [0, S]
# is a `ValueError`; the Triton kernels check it only with `validate=True`, since reading the lengths of a
# GPU tensor is a host sync in the decode step.

# %% id="c023"
qd = torch.randn(2, 8, 64, generator=g)
kd, vd = torch.randn(2, 2, 300, 64, generator=g), torch.randn(2, 2, 300, 64, generator=g)
want = reference_attention(qd[:, :, None], kd, vd)[:, :, 0]
split_rows = []
want[1] = reference_attention(qd[1:, :, None], kd[1:, :, :41], vd[1:, :, :41])[0, :, 0]   # row 1: 41 keys
for ns in (1, 2, 4, 16, 24):                  # row 1 cut in 24 splits of 2 keys: 3 are empty, weigh nothing
    m_s, l_s, acc_s = split_partials(qd, kd, vd, ns, lengths=[300, 41])
    got = combine_splits(m_s, l_s, acc_s)
    split_rows.append({"splits": ns, "max |split - reference|": (got - want).abs().max().item(),
                       "empty splits (row 1)": int(torch.isinf(m_s[1, 0]).sum())})
    assert torch.allclose(got, want, atol=1e-5)
assert split_rows[-1]["empty splits (row 1)"] == 3
print(format_records(split_rows, floatfmt=".1e"))
assert torch.allclose(flash_decode_torch(qd, kd, vd, num_splits=3, lengths=[300, 41]), want, atol=1e-5)
empty = flash_decode_torch(qd, kd, vd, num_splits=4, lengths=[0, 41])          # row 0: an empty sequence
assert torch.equal(empty[0], torch.zeros_like(empty[0])) and torch.allclose(empty[1], want[1], atol=1e-5)
try:
    flash_decode_torch(qd, kd, vd, lengths=[301, 41])
    raise AssertionError("expected a length past the 300 cached keys to be refused")
except ValueError as e:
    print("ValueError:", e)
h100_programs = [{"batch": B, "KV heads": 8, "programs (no split)": B * 8,
                  "share of H100 SMs busy": min(1.0, B * 8 / h100.sms)} for B in (1, 4, 16, 64)]
print(format_records(h100_programs, floatfmt=".2f"))
if course_lib.env.triton_gpu_supported():
    qg = qd.cuda().half()
    kg, vg = kd.cuda().half(), vd.cuda().half()
    lens_g = torch.tensor([300, 41], device="cuda")
    for ns in (1, 4):
        e = (flash_decode_triton(qg, kg, vg, lengths=lens_g, num_splits=ns).float().cpu() - want).abs().max().item()
        print(f"Triton flash-decoding, {ns} splits: max error {e:.1e}")
        assert e < 5e-3

# %% [markdown] id="c024"
# ## 8. What FlashAttention-2 and -3 changed
#
# * **FlashAttention (2022)** [@dao2022flashattention]: tiling plus online softmax, the IO analysis of
#   section 2, recomputation of the scores in the backward pass instead of storing them. Key/value tiles
#   in the outer loop.
# * **FlashAttention-2 (2023)** [@dao2024flashattention2]: query tiles in the outer loop (our loop order),
#   so each program owns its output rows and never writes partial results (O and the running statistics
#   no longer go through HBM once per key tile: section 2's M / 2d^2 against M / 3d^2); parallelism over the sequence,
#   not only batch x heads; fewer non-matmul FLOPs (the division by l once at the end, not per tile: an
#   A100 does matmuls ~16x faster than other FP32 arithmetic, 312 against 19.5 TFLOP/s); work split between
#   warps so that they share less through shared memory. About 2x FlashAttention-1, ~50-70% of an A100's
#   peak in the forward pass.
# * **FlashAttention-3 (2024, Hopper)** [@shah2024flashattention3]: warp specialization (producer warps
#   load tiles with the TMA engine while consumer warps compute), asynchronous wgmma matmuls overlapped
#   with the softmax of the previous tile (ping-pong between warp groups), and FP8 with block quantization
#   and incoherent processing to keep the error down. Its arXiv version (July 2024) reports ~75% of an
#   H100's FP16 peak (740 TFLOP/s); the NeurIPS 2024 version, BF16 up to 840 TFLOP/s (85%).
#
# Our Triton kernel is FlashAttention-2's algorithm; Triton's compiler does the pipelining of the loads
# (cp.async / TMA) but not FlashAttention-3's warp specialization. The speed table of section 5 shows
# where it stands on this device; on an H100, `bench/attention.py` prints its share of the 989 TFLOP/s
# bf16 peak next to SDPA's flash backend.

# %% id="c025"
print(format_records([r for r in speed if r["N"] == N_big], floatfmt=".3g"))

# %% [markdown] id="c026"
# ## 9. Causal masks when there are fewer queries than keys
#
# In training and in a prefill without a cache, queries and keys are the same N positions, and "causal"
# means query i sees keys 0..i: the mask is the lower triangle of a square. In **decode** (1 new query
# against S cached keys) and in **chunked prefill** (a chunk of T queries appended to S - T cached keys),
# the T queries are the **last** T positions of the sequence. Query t sits at absolute position
# S - T + t and must see keys 0..S - T + t: the diagonal of the mask runs into the **bottom-right** corner
# of the T x S rectangle. The other convention, top-left (query t sees keys 0..t), would let the one decode
# query see only the first key. `course_lib.attention` uses bottom-right everywhere (`allowed_mask`, the
# tiled version, the Triton kernels), the convention of the flash-attn package since its version 2.1.
# PyTorch's `scaled_dot_product_attention(is_causal=True)` aligns top-left when T != S;
# `torch.nn.attention.bias.causal_lower_right` builds the bottom-right mask for it. The check: the T queries
# of a chunk, attended causally against all S keys, give exactly the last T rows of full causal attention,
# and the top-left mask does not.

# %% id="c027"
S_FULL, T_CHUNK = 40, 7
qf, kf, vf = (torch.randn(1, 2, S_FULL, 16, generator=g) for _ in range(3))
full = reference_attention(qf, kf, vf, causal=True)                            # square: T = S
chunk = tiled_attention(qf[:, :, -T_CHUNK:], kf, vf, causal=True, block_q=4, block_k=8)
decode = reference_attention(qf[:, :, -1:], kf, vf, causal=True)               # one query, all keys
top_left = torch.ones(T_CHUNK, S_FULL).tril().bool()                          # query t sees keys 0..t
wrong = F.scaled_dot_product_attention(qf[:, :, -T_CHUNK:], kf, vf, attn_mask=top_left)
sdpa_causal = F.scaled_dot_product_attention(qf[:, :, -T_CHUNK:], kf, vf, is_causal=True)
assert torch.allclose(sdpa_causal, wrong, atol=1e-6)                           # PyTorch's is_causal: top-left
try:
    from torch.nn.attention.bias import causal_lower_right                    # a prototype API in PyTorch 2.x
    lower_right = F.scaled_dot_product_attention(qf[:, :, -T_CHUNK:], kf, vf, causal_lower_right(T_CHUNK, S_FULL))
    assert torch.allclose(lower_right, full[:, :, -T_CHUNK:], atol=1e-5)
    print("SDPA with is_causal=True is top-left; with causal_lower_right it matches the bottom-right result")
except ImportError:
    print("(torch.nn.attention.bias is not in this PyTorch)")
print(f"{T_CHUNK} queries against {S_FULL} keys, bottom-right: max |chunk - last rows of full| = "
      f"{(chunk - full[:, :, -T_CHUNK:]).abs().max():.1e}; one decode query: "
      f"{(decode - full[:, :, -1:]).abs().max():.1e}")
print(f"top-left alignment instead: max difference {(wrong - full[:, :, -T_CHUNK:]).abs().max():.2f}")
assert torch.allclose(chunk, full[:, :, -T_CHUNK:], atol=1e-5) and torch.allclose(decode, full[:, :, -1:], atol=1e-5)
assert not torch.allclose(wrong, full[:, :, -T_CHUNK:], atol=1e-2)

# %% [markdown] id="c028"
# ## Further reading
#
# Used in this notebook:
#
# * [@dao2022flashattention]: tiling with online softmax, the IO analysis and the tile sizes of section 2,
#   the SRAM and HBM bandwidths.
# * [@dao2024flashattention2]: query tiles outside, fewer non-matmul FLOPs, parallelism over the sequence
#   (our loop order, section 8).
# * [@shah2024flashattention3]: warp specialization, asynchronous wgmma, FP8 attention on Hopper.
# * [@milakov2018online]: the online softmax normalizer of section 3.
# * [@rabe2021selfattention]: exact attention in O(sqrt(n)) memory by chunking keys and queries, the same
#   running-max idea, before FlashAttention.
#
# To go further:
#
# * [@dao2023flashdecoding]: flash-decoding (section 7) with its measurements on long contexts.
# * The FlashAttention paper's backward pass (the scores recomputed from the saved softmax statistics
#   instead of stored) and its block-sparse extension [@dao2022flashattention].
