"""Planted wrong answers for the grading round trip (tests/test_grading.py).

Every lab in solutions/ must have an entry here, or `test_every_lab_has_mutants` fails.

Format:

    MUTANTS = {
        "labNN": [
            ("what is wrong, in a few words", {"<grade_id of an answer cell>": "<new source of that cell>", ...}),
            ...
        ],
    }

A mutant's submission is the student lab (labs/labNN.ipynb) with every answer cell filled with the
instructor's answer (solutions/labNN.ipynb, BEGIN/END SOLUTION lines removed), then the answer cells
named in the dict replaced by the given sources, as a student would type them (no solution
delimiters). Each mutant must score strictly between 0 and full marks: it must fail at least one test,
visible or hidden, and leave at least one exercise right. Good mutants are the mistakes students make
(an off-by-one, 128 instead of 127, a missing transpose, forgetting the bonus token), so the hidden
tests are shown to catch them. Keep them few (one or two per lab): each one is a full autograde of
the lab in CI.

Example:

    "lab02": [
        ("int8 absmax divides by 128 instead of 127", {"absmax_answer": "def absmax_quantize(x):\\n    ..."}),
    ],
"""

MUTANTS: dict[str, list[tuple[str, dict[str, str]]]] = {
    "lab00": [
        ("TPOT divides by the number of tokens, not the number of gaps (n - 1)", {"metrics": '''\
def ttft(start, times):
    if len(times) == 0:
        raise ValueError("times is empty")
    return float(times[0]) - float(start)


def e2e_latency(start, times):
    if len(times) == 0:
        raise ValueError("times is empty")
    return float(times[-1]) - float(start)


def tpot(times):
    if len(times) < 2:
        raise ValueError("need at least 2 times")
    return (float(times[-1]) - float(times[0])) / len(times)


def tokens_per_second(start, times):
    return len(times) / e2e_latency(start, times)
'''}),
    ],
    "lab01": [
        ("a matmul counted as m*n*k FLOPs (multiply-adds, the seed's slip) instead of 2*m*n*k", {"matmul_cost": '''\
def matmul_cost(m, n, k, bytes_per_element):
    flops = m * n * k
    nbytes = bytes_per_element * (m * k + k * n + m * n)
    return flops, nbytes, flops / nbytes
'''}),
    ],
    "lab02": [
        ("int8 absmax scales by 2**(bits-1) = 128 instead of 127", {"absmax": '''\
def absmax_quantize(x, bits=8):
    if not 2 <= bits <= 8:
        raise ValueError(f"bits must be in 2..8, got {bits}")
    qmax = 2 ** (bits - 1)
    scale = x.abs().max() / qmax
    if scale == 0:
        return torch.zeros_like(x, dtype=torch.int8), scale
    codes = torch.clamp(torch.round(x / scale), -qmax, qmax - 1).to(torch.int8)
    return codes, scale


def absmax_dequantize(codes, scale):
    return codes.float() * scale
'''}),
    ],
}
