"""Lab 03's judge: GPTQ's column loop, SmoothQuant's smoothing and the bits-per-weight prediction.

Layers, calibration sets and group layouts are drawn here (plus an edge grid: one column, groups of one, a last
group shorter than the others, a group wider than the row, 2 and 8 bits, no damping) and sent as tensors; the
answers are compared with `course_lib.quant` here. GPTQ is judged as the old tests judged it: every entry within
one grid step of `gptq_quantize` (a rounding tie may flip) and the same output error within 5 %, with the
notes' full-inverse update and round-to-nearest planted for the feedback.
"""
import torch

from course_grading.judging import Get, Judge, Let, call, ref
from course_lib.checks import check_close, check_equal
from course_lib.models.config import LlamaConfig
from course_lib.parallel.cost import layer_parameters
from course_lib.quant.gptq import gptq_quantize, hessian
from course_lib.quant.memory import bits_per_weight
from course_lib.quant.smoothquant import smooth_scales

judge = Judge(references={
    "gptq_tests": ["course_lib.quant.gptq.gptq_quantize"],
    "smooth_tests": ["course_lib.quant.smoothquant.smooth_scales"],
    "predict_bits_tests": ["course_lib.quant.memory.bits_per_weight"],
})


def randn(t, *shape):
    return torch.randn(*shape, generator=t.torch_generator())


def randint(t, lo, hi):
    return t.rng.randint(lo, hi)


# ---------------------------------------------------------------------------------------------------
# the lab's helpers, and the planted mistakes, computed here

def grid(W, bits):
    """The lab's asymmetric grid per row of W [out, k]: scale [out, 1], zero [out, 1]."""
    qmin, qmax = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    lo, hi = W.amin(1, keepdim=True).clamp(max=0), W.amax(1, keepdim=True).clamp(min=0)
    scale = ((hi - lo) / (qmax - qmin)).clamp(min=1e-8)
    return scale, torch.clamp(qmin - torch.round(lo / scale), qmin, qmax)


def rtn_column(w, scale, zero, bits):
    qmin, qmax = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    return (torch.clamp(torch.round(w / scale) + zero, qmin, qmax) - zero) * scale


def planted_gptq(W, H, bits, gs, percdamp, mistake):
    """GPTQ's loop with a known mistake: the full inverse's entries for every column ("full_inverse"), no
    error fed forward at all ("no_feedback": round-to-nearest on the group grids), or each group's grid from
    the original columns instead of the updated ones ("grid_from_original")."""
    W0, W, n = W.clone().float(), W.clone().float(), W.shape[1]
    H = H.float() + percdamp * torch.diag(H.float()).mean() * torch.eye(n)
    Hinv = torch.cholesky_inverse(torch.linalg.cholesky(H))
    rows = Hinv if mistake == "full_inverse" else torch.linalg.cholesky(Hinv, upper=True)
    Q = torch.zeros_like(W)
    for j in range(n):
        if j % (gs or n) == 0:
            s, z = grid((W0 if mistake == "grid_from_original" else W)[:, j:j + (gs or n)], bits)
        q = rtn_column(W[:, j:j + 1], s, z, bits)
        if mistake != "no_feedback":
            W[:, j + 1:] -= (W[:, j:j + 1] - q) / rows[j, j] @ rows[j:j + 1, j + 1:]
        Q[:, j:j + 1] = q
    return Q


def output_error(W, W_q, X):
    return float((X @ (W - torch.as_tensor(W_q).float()).T).pow(2).sum() / X.shape[0])


# ---------------------------------------------------------------------------------------------------
# Exercise 1: GPTQ

def gptq_case(t, what, W, X, bits, gs, pd, atol=None, answers=None):
    """One layer: the answer within one grid step of the reference (atol: tighter, for exact small cases), the
    same output error within 5 %, the caller's W untouched. The answer of the right shape is added to `answers`
    (for the average over the drawn layers), right or wrong."""
    H = hessian(X)
    got = t.run([Let("W", W), call("gptq", ref("W"), H, bits=bits, group_size=gs, percdamp=pd), Get("$W")])
    Wq = got[1].get()
    t.expect(getattr(Wq, "shape", None) == W.shape, f"{what}: expected a weight of shape {tuple(W.shape)}, got "
                                                     f"{tuple(getattr(Wq, 'shape', ())) or type(Wq).__name__}")
    if answers is not None:
        answers.append(output_error(W, Wq, X) / output_error(W, rtn(W, bits, gs), X))
    check_equal(got[2].get(), W, f"{what}: the caller's W after gptq (work on a copy)")
    r = gptq_quantize(W, H, bits=bits, group_size=gs, percdamp=pd, scale_dtype=torch.float32)
    # within a grid step several planted answers may match: the closest one is named
    planted = {t.mistake(m): planted_gptq(W, H, bits, gs, pd, m) for m in ("full_inverse", "no_feedback",
                                                                            "grid_from_original")}
    wrong = dict(sorted(planted.items(), key=lambda kv: float((torch.as_tensor(Wq).float() - kv[1]).abs().max())))
    step = float(r.scales.max())
    check_close(Wq, r.weight, what, atol=atol if atol is not None else step * 1.01, rtol=0, mistakes=wrong)
    check_close(output_error(W, Wq, X), output_error(W, r.weight, X), what + ": output error ||X W^T - X W_q^T||^2 / n",
                rtol=0.05, mistakes={k: output_error(W, v, X) for k, v in wrong.items()})


def rtn(W, bits, gs):
    """Round-to-nearest on the same group layout (GPTQ's baseline)."""
    g = gs or W.shape[1]
    return torch.cat([rtn_column(W[:, j:j + 1], *grid(W[:, j // g * g:(j // g + 1) * g], bits), bits)
                      for j in range(W.shape[1])], dim=1)


@judge.part("gptq_tests", groups={"values": 3, "errors": 1})
def gptq(t):
    W = torch.tensor([[0.30, -0.42, 0.17, 0.05], [-0.21, 0.08, 0.44, -0.35]])
    X = torch.tensor([[1.0, 0.9, 0.2, -0.3], [0.5, 0.6, -1.0, 0.2], [-0.8, -0.7, 0.4, 1.0], [0.3, 0.1, 0.9, -0.6],
                      [1.2, 1.0, -0.2, 0.1]])
    with t.case("gptq(W [2, 4], H of 5 rows, bits=3, group_size=2) (the visible example)", group="values"):
        gptq_case(t, "gptq(W [2, 4], H of 5 rows, bits=3, group_size=2)", W, X, 3, 2, 0.01, atol=1e-5)
    # (out, in, bits, group_size, percdamp): one column, groups of one, a last group shorter than the others, a
    # group wider than the row, the extreme bit widths, no damping, heavy damping
    grid_cases = [(3, 1, 4, None, 0.01), (4, 6, 4, 1, 0.01), (5, 10, 3, 4, 0.01), (5, 10, 4, 16, 0.01),
                  (6, 12, 2, None, 0.01), (6, 12, 8, 3, 0.05), (1, 16, 4, 8, 0.0), (8, 9, 5, 9, 0.5)]
    for out, n_in, bits, gs, pd in grid_cases:
        W = randn(t, out, n_in) * 0.1
        X = randn(t, 3 * n_in, n_in) @ randn(t, n_in, n_in)
        what = (f"gptq(W [{out}, {n_in}], H from {3 * n_in} correlated rows, bits={bits}, group_size={gs}, "
                f"percdamp={pd})")
        with t.case(what, group="values"):
            gptq_case(t, what, W, X, bits, gs, pd)
    ratios, drawn = [], 6
    for _ in range(drawn):
        out, n_in = randint(t, 4, 40), randint(t, 4, 40)
        n, bits = randint(t, 2 * n_in, 4 * n_in), randint(t, 3, 8)
        gs = t.rng.choice([None, 4, 8, randint(t, 3, 16)])
        pd = t.rng.choice([0.01, 0.05, 0.1])
        W = randn(t, out, n_in) * t.rng.uniform(0.05, 1.05)
        X = randn(t, n, n_in) @ randn(t, n_in, n_in)
        what = f"gptq(W [{out}, {n_in}], H from {n} correlated rows, bits={bits}, group_size={gs}, percdamp={pd})"
        with t.case(what, group="values"):
            gptq_case(t, what, W, X, bits, gs, pd, answers=ratios)
    # GPTQ is greedy: on one small layer it can land above round-to-nearest (about 1 layer in 130), so the
    # comparison is over the drawn layers together
    with t.case(f"GPTQ's output error below round-to-nearest's on average over {drawn} drawn layers", group="values"):
        t.expect(len(ratios) == drawn, f"only {len(ratios)} of the {drawn} drawn layers were quantized")
        t.expect(sum(ratios) / drawn < 1, f"GPTQ's output error is not below round-to-nearest's on average over "
                                          f"{drawn} drawn layers (error / RTN's: {[round(r, 3) for r in ratios]}): is "
                                          "each column's error fed forward?")
    W, X = randn(t, 6, 12) * 0.1, randn(t, 48, 12)
    H = hessian(X)
    for bad, args, kwargs in (("H of shape [5, 5] for W [6, 12]", (W, H[:5, :5]), {}),
                              ("H of shape [12, 11]", (W, H[:, :11]), {}),
                              ("bits=1", (W, H), {"bits": 1}), ("bits=9", (W, H), {"bits": 9}),
                              ("bits=4.0", (W, H), {"bits": 4.0}), ("group_size=0", (W, H), {"group_size": 0}),
                              ("group_size=-2", (W, H), {"group_size": -2}),
                              ("group_size=2.5", (W, H), {"group_size": 2.5}),
                              ("percdamp=1.5", (W, H), {"percdamp": 1.5}), ("percdamp=1.0", (W, H), {"percdamp": 1.0}),
                              ("percdamp=-0.1", (W, H), {"percdamp": -0.1})):
        with t.case(f"gptq with {bad}", group="errors"):
            t.raises(t.outcome("gptq", *args, **kwargs), "ValueError", what=f"gptq with {bad}")


# ---------------------------------------------------------------------------------------------------
# Exercise 2: SmoothQuant

def smooth_case(t, what, a, W, alpha, x=None):
    got = t.call("smooth", a, W, alpha)
    t.expect(isinstance(got, (tuple, list)) and len(got) == 2, f"{what}: expected (s, W_smoothed), got {got!r}"[:300])
    s, Ws = got
    want = smooth_scales(a, W.abs().amax(0), alpha)
    check_close(s, want, what + ": s", rtol=1e-4)
    check_close(Ws, W * want, what + ": W_smoothed (each input column j times s_j)", rtol=1e-4, atol=1e-7,
                mistakes={t.mistake("smooth_direction"): W / want})
    if x is not None:
        check_close((x / s) @ Ws.T, x @ W.T, what + ": (x / s) @ W_smoothed.T vs x @ W.T", rtol=1e-4, atol=1e-4,
                    mistakes={t.mistake("smooth_direction"): (x / s) @ (W / s).T})


@judge.part("smooth_tests", groups={"values": 3, "errors": 1})
def smooth(t):
    W = torch.tensor([[0.5, -0.1, 2.0], [0.25, 0.2, -1.0]])
    a = torch.tensor([4.0, 100.0, 1.0])
    x = torch.tensor([[1.0, -90.0, 0.5], [-4.0, 3.0, 1.0]])
    cases = [("smooth([4, 100, 1], W [2, 3], 0.5) (the visible example)", a, W, 0.5, x),
             ("smooth([4, 100, 1], W [2, 3], 0) (s_j = 1 / max|W_:,j|)", a, W, 0.0, None),
             ("smooth([4, 100, 1], W [2, 3], 1) (s_j = max|x_j|)", a, W, 1.0, None)]
    # a dead activation channel and a dead weight column (both clamped to 1e-5), one row, one column
    W = randn(t, 4, 5)
    W[:, 3] = 0
    a = randn(t, 5).abs() * 20
    a[1] = 0
    cases.append(("smooth(x_absmax with a channel of 0, W [4, 5] with a column of 0, 0.5)", a, W, 0.5, None))
    cases.append(("smooth(x_absmax [7], W [1, 7], 0.3) (one output row)", randn(t, 7).abs() * 9, randn(t, 1, 7), 0.3,
                  None))
    cases.append(("smooth(x_absmax [1], W [6, 1], 0.8) (one input channel)", randn(t, 1).abs() * 9, randn(t, 6, 1), 0.8,
                  None))
    for _ in range(10):
        out, n_in = randint(t, 2, 49), randint(t, 2, 49)
        W = randn(t, out, n_in)
        x = randn(t, 16, n_in) * (torch.rand(n_in, generator=t.torch_generator()) * 30)
        alpha = t.rng.random()
        cases.append((f"smooth(x_absmax of 16 tokens, W [{out}, {n_in}], alpha={alpha:.3f})", x.abs().amax(0), W,
                      alpha, x))
    for what, a, W, alpha, x in cases:
        with t.case(what, group="values"):
            smooth_case(t, what, a, W, alpha, x)
    a, W = torch.tensor([4.0, 100.0, 1.0]), torch.tensor([[0.5, -0.1, 2.0], [0.25, 0.2, -1.0]])
    for alpha in (1.5, -0.1, 1.01):
        with t.case(f"smooth with alpha={alpha}", group="errors"):
            t.raises(t.outcome("smooth", a, W, alpha), "ValueError", what=f"smooth with alpha={alpha}")


# ---------------------------------------------------------------------------------------------------
# Exercise 3: predict the bits per weight

def model_bits(cfg, per, keep_bits, head_twice=False):
    """Bits per parameter of the whole model: the decoder linears (`layer_parameters`, without its norms) at
    `per`, the rest of `num_parameters()` at keep_bits; `head_twice` counts a tied head again (the mistake)."""
    lp = layer_parameters(cfg)
    linear = cfg.num_hidden_layers * (lp["attention"] + lp["mlp"])
    kept = cfg.num_parameters() - linear
    if head_twice and cfg.tie_word_embeddings:
        kept += cfg.vocab_size * cfg.hidden_size
    return (linear * per + kept * keep_bits) / (linear + kept)


def draw_fields(t):
    kv = t.rng.choice([1, 2, 4, 8])
    return dict(vocab_size=t.rng.choice([256, 32000, 128256, t.rng.randint(100, 200_000)]),
                hidden_size=64 * t.rng.randint(1, 80), intermediate_size=t.rng.randint(64, 20_000),
                num_hidden_layers=t.rng.randint(1, 80), num_attention_heads=kv * t.rng.choice([1, 2, 4, 8]),
                num_key_value_heads=kv, head_dim=2 * t.rng.randint(8, 80), tie_word_embeddings=t.rng.random() < 0.5)


@judge.part("predict_bits_tests", groups={"values": 3, "errors": 1})
def predict_bits(t):
    grid_cases = [(4, 128, 16, 0), (4, 128, 16, 8), (3, None, 16, 0), (8, 32, 16, 8), (3, None, 16, 8), (1, 1, 16, 0),
                  (2, 1, 32, 8), (4, 3, 16, 4), (8, 4096, 32, 32), (5, 7, 8, 0)]
    drawn = [(randint(t, 1, 8), None if t.rng.random() < 0.1 else randint(t, 1, 512), t.rng.choice([8, 16, 32]),
              t.rng.choice([0, 4, 8])) for _ in range(15)]
    for b, gs, sb, zb in grid_cases + drawn:
        what = f"predict_bits_per_weight({b}, {gs}, {sb}, {zb})"
        with t.case(what, group="values"):
            check_close(t.call("predict_bits_per_weight", b, gs, sb, zb), bits_per_weight(b, gs, sb, zb), what,
                        rtol=1e-9, mistakes={t.mistake("zero_point_forgotten"): bits_per_weight(b, gs, sb, 0)})
    llama3 = dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                  num_attention_heads=32, num_key_value_heads=8, tie_word_embeddings=False)
    models = [(llama3, 4, 128, 16, 0, 16), (llama3, 4, 128, 16, 8, 16), (llama3, 3, None, 16, 0, 32),
              (dict(llama3, num_hidden_layers=1, tie_word_embeddings=True), 4, 32, 16, 8, 16),
              (dict(llama3, num_key_value_heads=32, head_dim=64), 8, 64, 16, 0, 8)]
    models += [(draw_fields(t), randint(t, 2, 8), t.rng.choice([None, 32, 64, 128, randint(t, 1, 256)]),
                t.rng.choice([8, 16, 32]), t.rng.choice([0, 4, 8]), t.rng.choice([16, 32])) for _ in range(25)]
    for fields, b, gs, sb, zb, kb in models:
        cfg = LlamaConfig(**fields)
        per = bits_per_weight(b, gs, sb, zb)
        want = model_bits(cfg, per, kb)
        wrong = {t.mistake("zero_point_forgotten"): model_bits(cfg, bits_per_weight(b, gs, sb, 0), kb),
                 t.mistake("model_all_quantized"): per,
                 t.mistake("head_counted_twice"): model_bits(cfg, per, kb, head_twice=True)}
        what = (f"predict_bits_per_weight({b}, {gs}, {sb}, {zb}, config=LlamaConfig(V={cfg.vocab_size}, "
                f"D={cfg.hidden_size}, F={cfg.intermediate_size}, layers={cfg.num_hidden_layers}, "
                f"H={cfg.num_attention_heads}, K={cfg.num_key_value_heads}, Dh={cfg.head_dim}, "
                f"{'tied' if cfg.tie_word_embeddings else 'untied'}), keep_bits={kb})")
        with t.case(what, group="values"):
            o = t.run([call("lib:course_lib.models.config.LlamaConfig", store="cfg", send=False, **fields),
                       call("predict_bits_per_weight", b, gs, sb, zb, ref("cfg"), kb)])[-1]
            check_close(o.get(), want, what, rtol=1e-9,
                        mistakes={k: v for k, v in wrong.items() if abs(v / want - 1) > 1e-9})
    for args in ((4, 0), (0, 128), (-1, 32), (2.5, 32), (4, -4), (4, 2.5)):
        what = f"predict_bits_per_weight{args}"
        with t.case(what, group="errors"):
            t.raises(t.outcome("predict_bits_per_weight", *args), "ValueError", what=what)


def mutants():
    """Planted wrong answers for the round trips (tests/test_judges.py, tests/test_grading.py)."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from judge_tools import solution_with
    return [
        ("GPTQ spreads the error with the full inverse's entries [H^-1]_jj, [H^-1]_jk (the notes' formula), and "
         "SmoothQuant divides the weight by s like the activations",
         {"gptq_answer": solution_with("lab03", "gptq_answer", {
             "    U = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(H)), upper=True)":
             "    U = torch.cholesky_inverse(torch.linalg.cholesky(H))"}),
          "smooth_answer": solution_with("lab03", "smooth_answer", {
              "    return s, W * s[None, :]": "    return s, W / s[None, :]"})},
         ["full_inverse", "smooth_direction"]),
        ("GPTQ without error feedback (plain round-to-nearest on the group grids); the predicted bits leave out the "
         "zero point",
         {"gptq_answer": solution_with("lab03", "gptq_answer", {
             "        W[:, j + 1:] -= err @ U[j:j + 1, j + 1:]\n": ""}),
          "predict_bits": solution_with("lab03", "predict_bits", {
              "    per = float(bits) if group_size is None else bits + (scale_bits + zero_point_bits) / group_size":
              "    per = float(bits) if group_size is None else bits + scale_bits / group_size"})},
         ["no_feedback", "zero_point_forgotten"]),
        ("GPTQ computes each group's grid from the original columns, not the updated ones",
         {"gptq_answer": solution_with("lab03", "gptq_answer", {
             "    W = W.clone().float()\n": "    W = W.clone().float()\n    W0 = W.clone()\n",
             "            scale, zero = grid(W[:, j:j + g], bits)":
             "            scale, zero = grid(W0[:, j:j + g], bits)"})},
         ["grid_from_original"]),
        ("the whole model priced with a tied LM head stored twice (exercise 3, the prediction)",
         {"predict_bits": solution_with("lab03", "predict_bits", {
             "V * D * (1 if c.tie_word_embeddings else 2)": "V * D * 2"})},
         ["head_counted_twice"]),
    ]


# The written part, graded by the instructor (course_grading/manual.py): its rubric lives here, never in
# the student's notebook; the feedback page shows it with the instructor's score and comment.
WRITTEN = {
    "written_gptq_vs_rtn": {"points": 2, "rubric": [
        (1, "quotes their own GPTQ and RTN errors on calibration and held-out inputs with both ratios, and "
            "explains that GPTQ minimizes the output error on the calibration inputs by compensating each "
            "column's rounding error on the remaining columns (through the inverse Hessian)"),
        (1, "explains the held-out difference by how well the calibration covariance describes other inputs "
            "(fitting the calibration batch), and proposes a remedy with its reason (more varied calibration "
            "data, larger damping)"),
    ]},
}
