"""GGUF k-quant encoders against ggml's reference algorithm compiled with the system C compiler, byte for byte.

ggml's reference encoders (``quantize_row_q4_K_ref``, ``quantize_row_q6_K_ref`` in ggml-quants.c, what llama.cpp
runs without an importance matrix) are plain C. The installed ``gguf`` package has no k-quant encoder, so this
test carries its own C rendering of the published algorithm (C_SOURCE below: the Q4_K affine search with its
moving min, ggml's nearest_int, the 6-bit scale/min packing, the Q6_K symmetric search), compiles it into a
temporary folder with -ffp-contract=off (IEEE float32, no fused multiply-add), runs it on random tensors and
compares every byte with ``quantize_q4_k`` / ``quantize_q6_k``. Without a C compiler on PATH the comparison is
skipped with that reason (CI has gcc); the float32 helper checks at the end need none.
"""
import shutil
import subprocess

import numpy as np
import pytest
import torch

from course_lib.quant.gguf import (BLOCK_BYTES, _fdiv, _k4_scale_codes, _nearest_int, _pack_k4_scales, _sqrtf,
                                  quantize_q4_k, quantize_q6_k)

C_SOURCE = r"""
/* The reference k-quant encoders of ggml (quantize_row_q4_K_ref, quantize_row_q6_K_ref in ggml-quants.c),
   written for this test from the published algorithm: float32 throughout, loops in ggml's order.
   Usage: kquant_ref q4_k|q6_k|q4_k_scales|nearest N in.f32 out.bin
   N float32 values in; out: 144 (q4_k) or 210 (q6_k) bytes per 256 values; q4_k_scales: Q4_K's d, dmin and
   packed 6-bit codes (16 bytes) per 8 scales + 8 mins; nearest: N int32 of round_to_int */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SUPER 256
#define EPS_Q6 1e-15f

static uint16_t half_from_float(float f) {            /* IEEE round to nearest even */
    uint32_t u; memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    if (a >= 0x7f800000u) return (uint16_t)(sign | (a > 0x7f800000u ? 0x7e00u : 0x7c00u));
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);            /* >= 65520 rounds to inf */
    if (a <= 0x33000000u) return (uint16_t)sign;                        /* <= 2^-25 rounds to 0 */
    uint32_t e = a >> 23, m = a & 0x7fffffu, q, rem, halfway;
    if (e < 113) {                                                      /* half subnormal: units of 2^-24 */
        uint32_t s = 126 - e;
        m |= 0x800000u;
        q = m >> s; rem = m & ((1u << s) - 1); halfway = 1u << (s - 1);
    } else {
        q = ((e - 112) << 10) | (m >> 13); rem = m & 0x1fffu; halfway = 0x1000u;
    }
    if (rem > halfway || (rem == halfway && (q & 1))) q++;
    return (uint16_t)(sign | q);
}

static float float_from_half(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ffu, u;
    if (e == 0) {                                                       /* zero or subnormal: m * 2^-24 */
        float v = (float)m * 5.9604644775390625e-8f;
        memcpy(&u, &v, 4); u |= sign; memcpy(&v, &u, 4); return v;
    }
    u = sign | (e == 31 ? 0x7f800000u | (m << 13) : ((e + 112) << 23) | (m << 13));
    float v; memcpy(&v, &u, 4); return v;
}

static int round_to_int(float v) {                    /* ggml's nearest_int: add 1.5 * 2^23, read the mantissa */
    float t = v + 12582912.f;
    int32_t bits; memcpy(&bits, &t, 4);
    return (bits & 0x007fffff) - 0x00400000;
}

static int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

/* affine search for one sub-block: returns the scale, writes -min to *neg_min and the codes to L */
static float search_scale_min(int n, int nmax, const float *x, const float *w, uint8_t *L, float *neg_min,
                              float rmin, float rdelta, int nstep) {
    uint8_t trial[32];
    float lo = x[0], hi = x[0], sw = w[0], sx = w[0] * x[0];
    for (int i = 1; i < n; ++i) {
        if (x[i] < lo) lo = x[i];
        if (x[i] > hi) hi = x[i];
        sw += w[i];
        sx += w[i] * x[i];
    }
    if (lo > 0) lo = 0;
    if (hi == lo) { memset(L, 0, n); *neg_min = -lo; return 0.f; }
    float inv = nmax / (hi - lo), scale = 1 / inv, best = 0;
    for (int i = 0; i < n; ++i) {
        L[i] = (uint8_t)clampi(round_to_int(inv * (x[i] - lo)), 0, nmax);
        float e = scale * L[i] + lo - x[i];
        best += w[i] * (e * e);
    }
    for (int step = 0; step <= nstep; ++step) {
        inv = (rmin + rdelta * step + nmax) / (hi - lo);       /* lo is the best min found so far */
        float sl = 0, sl2 = 0, sxl = 0;
        for (int i = 0; i < n; ++i) {
            int l = clampi(round_to_int(inv * (x[i] - lo)), 0, nmax);
            trial[i] = (uint8_t)l;
            sl += w[i] * l;
            sl2 += w[i] * l * l;
            sxl += w[i] * l * x[i];
        }
        float det = sw * sl2 - sl * sl;
        if (!(det > 0)) continue;
        float s = (sw * sxl - sx * sl) / det, m = (sl2 * sx - sl * sxl) / det;
        if (m > 0) { m = 0; s = sxl / sl2; }
        float err = 0;
        for (int i = 0; i < n; ++i) {
            float e = s * trial[i] + m - x[i];
            err += w[i] * (e * e);
        }
        if (err < best) { memcpy(L, trial, n); best = err; scale = s; lo = m; }
    }
    *neg_min = -lo;
    return scale;
}

/* Q4_K's second level: 8 scales and 8 mins -> d, dmin (fp16) and 12 bytes of 6-bit codes: out[0..15] */
static void q4_k_scale_codes(const float *sc, const float *mn, uint8_t *ls, uint8_t *lm, uint8_t *out) {
    float max_sc = 0, max_mn = 0;
    uint8_t *packed = out + 4;
    for (int j = 0; j < 8; ++j) {
        if (sc[j] > max_sc) max_sc = sc[j];
        if (mn[j] > max_mn) max_mn = mn[j];
    }
    float isc = max_sc > 0 ? 63.f / max_sc : 0.f, imn = max_mn > 0 ? 63.f / max_mn : 0.f;
    for (int j = 0; j < 8; ++j) {
        uint8_t a = (uint8_t)round_to_int(isc * sc[j]), b = (uint8_t)round_to_int(imn * mn[j]);
        ls[j] = a < 63 ? a : 63;
        lm[j] = b < 63 ? b : 63;
    }
    for (int j = 0; j < 4; ++j) {
        packed[j] = (uint8_t)(ls[j] | ((ls[j + 4] >> 4) << 6));
        packed[j + 4] = (uint8_t)(lm[j] | ((lm[j + 4] >> 4) << 6));
        packed[j + 8] = (uint8_t)((ls[j + 4] & 0xF) | ((lm[j + 4] & 0xF) << 4));
    }
    uint16_t hd = half_from_float(max_sc / 63.f), hm = half_from_float(max_mn / 63.f);
    out[0] = hd & 0xff; out[1] = hd >> 8; out[2] = hm & 0xff; out[3] = hm >> 8;
}

static void encode_q4_k(const float *x, uint8_t *out) {          /* 256 values -> 144 bytes */
    uint8_t L[SUPER], ls[8], lm[8];
    float w[32], sc[8], mn[8];
    for (int j = 0; j < 8; ++j) {
        const float *xs = x + 32 * j;
        float s2 = 0;
        for (int l = 0; l < 32; ++l) s2 += xs[l] * xs[l];
        float rms = sqrtf(s2 / 32);
        for (int l = 0; l < 32; ++l) w[l] = rms + fabsf(xs[l]);
        sc[j] = search_scale_min(32, 15, xs, w, L + 32 * j, &mn[j], -1.f, 0.1f, 20);
    }
    q4_k_scale_codes(sc, mn, ls, lm, out);
    float d = float_from_half((uint16_t)(out[0] | out[1] << 8));
    float dmin = float_from_half((uint16_t)(out[2] | out[3] << 8));
    for (int j = 0; j < 8; ++j) {
        float dj = d * ls[j];
        if (dj == 0) continue;                                  /* keep the search's codes */
        float mj = dmin * lm[j];
        for (int l = 0; l < 32; ++l) L[32 * j + l] = (uint8_t)clampi(round_to_int((x[32 * j + l] + mj) / dj), 0, 15);
    }
    for (int c = 0; c < 4; ++c)
        for (int l = 0; l < 32; ++l) out[16 + 32 * c + l] = (uint8_t)(L[64 * c + l] | (L[64 * c + 32 + l] << 4));
}

/* symmetric search for one sub-block of 16, weights x^2: returns the scale, codes L in 0..63 */
static float search_scale_sym(const float *x, int8_t *L) {
    const int n = 16, nmax = 32;
    float big = 0, amax = 0;
    for (int i = 0; i < n; ++i) {
        float a = fabsf(x[i]);
        if (a > amax) { amax = a; big = x[i]; }
    }
    if (amax < EPS_Q6) { memset(L, 0, n); return 0.f; }
    float inv = -nmax / big, sxl = 0, sl2 = 0;
    for (int i = 0; i < n; ++i) {
        int l = clampi(round_to_int(inv * x[i]), -nmax, nmax - 1);
        L[i] = (int8_t)(l + nmax);
        float w = x[i] * x[i];
        sxl += w * x[i] * l;
        sl2 += w * l * l;
    }
    float scale = sl2 != 0 ? sxl / sl2 : 0.f, best = scale * sxl;
    for (int step = -9; step <= 9; ++step) {
        if (step == 0) continue;
        inv = -(nmax + 0.1f * step) / big;
        sxl = sl2 = 0;
        for (int i = 0; i < n; ++i) {
            int l = clampi(round_to_int(inv * x[i]), -nmax, nmax - 1);
            float w = x[i] * x[i];
            sxl += w * x[i] * l;
            sl2 += w * l * l;
        }
        if (sl2 > 0 && sxl * sxl > best * sl2) {
            for (int i = 0; i < n; ++i) L[i] = (int8_t)(nmax + clampi(round_to_int(inv * x[i]), -nmax, nmax - 1));
            scale = sxl / sl2;
            best = scale * sxl;
        }
    }
    return scale;
}

static void encode_q6_k(const float *x, uint8_t *out) {          /* 256 values -> 210 bytes */
    int8_t L[SUPER], sc8[16];
    float sc[16], max_sc = 0, max_abs = 0;
    memset(out, 0, 210);
    for (int j = 0; j < 16; ++j) {
        sc[j] = search_scale_sym(x + 16 * j, L + 16 * j);
        if (fabsf(sc[j]) > max_abs) { max_abs = fabsf(sc[j]); max_sc = sc[j]; }
    }
    if (max_abs < EPS_Q6) return;                               /* an all-zero block */
    float isc = -128.f / max_sc;
    uint16_t hd = half_from_float(1 / isc);
    float d = float_from_half(hd);
    for (int j = 0; j < 16; ++j) {
        int v = round_to_int(isc * sc[j]);
        sc8[j] = (int8_t)(v < 127 ? v : 127);
    }
    for (int j = 0; j < 16; ++j) {
        float dj = d * sc8[j];
        if (dj == 0) continue;
        for (int l = 0; l < 16; ++l) L[16 * j + l] = (int8_t)(clampi(round_to_int(x[16 * j + l] / dj), -32, 31) + 32);
    }
    for (int h = 0; h < 2; ++h) {
        const int8_t *q = L + 128 * h;
        uint8_t *ql = out + 64 * h, *qh = out + 128 + 32 * h;
        for (int l = 0; l < 32; ++l) {
            ql[l] = (uint8_t)((q[l] & 0xF) | ((q[l + 64] & 0xF) << 4));
            ql[l + 32] = (uint8_t)((q[l + 32] & 0xF) | ((q[l + 96] & 0xF) << 4));
            qh[l] = (uint8_t)((q[l] >> 4) | ((q[l + 32] >> 4) << 2) | ((q[l + 64] >> 4) << 4)
                              | ((q[l + 96] >> 4) << 6));
        }
    }
    memcpy(out + 192, sc8, 16);
    out[208] = hd & 0xff; out[209] = hd >> 8;
}

int main(int argc, char **argv) {
    if (argc != 5) { fprintf(stderr, "usage: %s q4_k|q6_k n in out\n", argv[0]); return 2; }
    int q4 = strcmp(argv[1], "q4_k") == 0, q6 = strcmp(argv[1], "q6_k") == 0;
    int k4s = strcmp(argv[1], "q4_k_scales") == 0;
    long n = atol(argv[2]), nb = n / SUPER;
    size_t out_bytes = (size_t)(q4 ? 144 * nb : q6 ? 210 * nb : k4s ? n : 4 * n);
    float *x = malloc(sizeof(float) * n);
    uint8_t *y = malloc(out_bytes), ls[8], lm[8];
    FILE *f = fopen(argv[3], "rb");
    if (!x || !y || !f || fread(x, sizeof(float), n, f) != (size_t)n) {
        fprintf(stderr, "cannot read %s\n", argv[3]);
        return 1;
    }
    fclose(f);
    if (q4 || q6) {
        for (long b = 0; b < nb; ++b) (q4 ? encode_q4_k : encode_q6_k)(x + SUPER * b, y + (q4 ? 144 : 210) * b);
    } else if (k4s) {                                           /* 16 floats (8 scales, 8 mins) -> 16 bytes */
        for (long b = 0; b < n / 16; ++b) q4_k_scale_codes(x + 16 * b, x + 16 * b + 8, ls, lm, y + 16 * b);
    } else {
        for (long i = 0; i < n; ++i) { int32_t v = round_to_int(x[i]); memcpy(y + 4 * i, &v, 4); }
    }
    f = fopen(argv[4], "wb");
    if (!f || fwrite(y, 1, out_bytes, f) != out_bytes) { fprintf(stderr, "cannot write %s\n", argv[4]); return 1; }
    fclose(f);
    return 0;
}
"""
CFLAGS = ["-O2", "-std=c99", "-ffp-contract=off"]
ENCODERS = {"q4_k": quantize_q4_k, "q6_k": quantize_q6_k}


@pytest.fixture(scope="module")
def c_reference(tmp_path_factory):
    """Compile C_SOURCE once; return run(mode, float32 array) -> the program's output bytes."""
    cc = next((shutil.which(c) for c in ("cc", "gcc", "clang") if shutil.which(c)), None)
    if cc is None:
        pytest.skip("no C compiler (cc, gcc or clang) on PATH: the byte comparison with ggml's reference "
                    "algorithm compiles it (CI has gcc)")
    folder = tmp_path_factory.mktemp("kquant_c_reference")
    src, exe = folder / "kquant_ref.c", folder / "kquant_ref"
    src.write_text(C_SOURCE)
    res = subprocess.run([cc, *CFLAGS, "-o", str(exe), str(src), "-lm"], capture_output=True, text=True)
    assert res.returncode == 0, f"the C reference does not compile with {cc}:\n{res.stderr}"

    def run(mode: str, values: np.ndarray) -> bytes:
        values = np.ascontiguousarray(values, dtype=np.float32).reshape(-1)
        (folder / "in.f32").write_bytes(values.tobytes())        # native byte order, as the C program reads it
        done = subprocess.run([str(exe), mode, str(values.size), str(folder / "in.f32"), str(folder / "out.bin")],
                              capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        return (folder / "out.bin").read_bytes()

    return run


def _tensors(seed):
    """Random tensors of several shapes and scales, and the blocks that have bitten k-quant encoders."""
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g)                   # noqa: E731
    yield "normal 128x1024", r(128, 1024)                        # 512 super-blocks: rare 1-ulp slips show here
    yield "1-D", r(256)
    yield "3-D", r(2, 3, 768) * 0.05
    for scale in (1e-6, 1e-3, 1e3, 3e5):
        yield f"randn * {scale:g}", r(4, 512) * scale
    yield "uniform positive", torch.rand(8, 256, generator=g) * 3  # min clamps to 0: dmin, mins 0
    yield "negative only", -torch.rand(8, 256, generator=g) - 0.5
    yield "positive only", torch.rand(8, 256, generator=g) + 0.5
    z = r(9, 256)
    z[0] = 0                                                      # an all-zero super-block
    z[1, :32] = 0                                                 # an all-zero Q4_K sub-block
    z[2, 16:32] = 0                                               # an all-zero Q6_K sub-block
    z[3, ::2] = 0
    z[4] = -0.75                                                  # constant negative super-block
    z[5, 32:64] = 3.0                                             # constant positive sub-block
    z[6, :255] = 0                                                # one value in 256
    z[7] = z[7].abs()                                             # no negative value: dmin stored as +0
    z[8] = -0.0
    yield "zeros and constants", z
    h = r(8, 256) * 0.01
    h[torch.arange(8), torch.randint(0, 256, (8,), generator=g)] = torch.tensor(
        [50.0, -80.0, 300.0, -1e4, 7.0, -7.0, 1e3, 2.0])           # one outlier per super-block
    yield "outliers", h
    yield "integers (ties)", torch.randint(-8, 8, (8, 256), generator=g).float()
    yield "half-integers", torch.randint(-16, 16, (8, 256), generator=g).float() / 2
    t = r(3, 16, 256)
    yield "heavy tails", t[0] / (t[1] ** 2 / 2 + t[2] ** 2 / 2).sqrt()   # Student t, 2 degrees of freedom
    yield "subnormal float32", r(4, 256) * 1e-40                  # fp16 scales underflow to 0
    yield "a decade per row", r(8, 256) * torch.logspace(-6, 3, 8)[:, None]
    s = r(8, 256)
    s[:, :128] *= 1e-4                                            # tiny sub-blocks beside normal ones
    yield "mixed sub-blocks", s


def _first_difference(ours: np.ndarray, ref: np.ndarray, nb: int) -> str:
    blocks = np.nonzero((ours.reshape(-1, nb) != ref.reshape(-1, nb)).any(axis=1))[0]
    b = int(blocks[0])
    hexs = lambda a: a.reshape(-1, nb)[b].tobytes().hex(" ")     # noqa: E731
    return f"{len(blocks)} super-blocks differ; first #{b}:\n ours {hexs(ours)}\n  C   {hexs(ref)}"


@pytest.mark.parametrize("fmt", ["q4_k", "q6_k"])
def test_bytes_equal_the_c_reference(c_reference, fmt):
    nb = BLOCK_BYTES[fmt]
    for seed in (0, 1):
        for name, x in _tensors(seed):
            ours = ENCODERS[fmt](x).numpy().reshape(-1)
            ref = np.frombuffer(c_reference(fmt, x.numpy()), dtype=np.uint8)
            assert ours.size == ref.size == x.numel() // 256 * nb, name
            if not np.array_equal(ours, ref):
                pytest.fail(f"{fmt} bytes differ from the C reference on {name!r} (seed {seed}): "
                            + _first_difference(ours, ref, nb))


def _near_ties(rng, n):
    """n rows of (max, s), float32, where C's 63.f / max and torch's 63.0 / max (a reciprocal, then a multiply)
    differ by an ulp and s sits so close to a rounding boundary that nearest_int(inv * s) differs with them."""
    f = np.float32
    out = []
    while len(out) < n:
        m = rng.uniform(0.05, 4.0, 4096).astype(f)
        one, two = f(63) / m, (f(1) / m) * f(63)                 # numpy float32 division rounds once
        for mi, i1, i2 in zip(m[one != two], one[one != two], two[one != two]):
            s = f((rng.integers(0, 62) + 0.5) / np.float64(i1))
            for _ in range(8):                                    # walk along the float32s to the boundary
                if np.rint(f(i1 * s)) != np.rint(f(i2 * s)):
                    out.append((mi, s))
                    break
                s = np.nextafter(s, f(0) if f(i1 * s) < np.rint(f(i1 * s)) else f(np.inf))   # toward k + 0.5
            if len(out) == n:
                break
    return np.array(out, dtype=f)


def _near_fp16_ties(rng, n):
    """n float32 maxima m for which m / 63 (C) and m * (1/63) (torch on CUDA: a multiply by the reciprocal)
    round to different fp16 values of d: both land beside a midpoint between two fp16 numbers."""
    f = np.float32
    a = rng.uniform(1e-3, 10.0, 4 * n).astype(np.float16)
    mid = (a.astype(np.float64) + np.nextafter(a, np.float16(np.inf)).astype(np.float64)) / 2
    start = (mid * 63).astype(f).view(np.int32)
    cand = (start[:, None] + np.arange(-40, 41, dtype=np.int32)).view(f)        # 81 neighbouring float32s
    hit = (cand / f(63)).astype(np.float16) != (cand * (f(1) / f(63))).astype(np.float16)
    rows = np.nonzero(hit.any(axis=1))[0][:n]
    assert rows.size == n
    return cand[rows, hit[rows].argmax(axis=1)]


def test_q4_k_scale_step_equals_the_c_reference(c_reference):
    """Q4_K's second level alone (8 scales and 8 mins -> fp16 d, dmin and the 12 packed 6-bit bytes), on many
    more super-blocks than the encoder test reaches: planted near-ties of 63/max, zeros and -0.0, values below
    0 (C stores (uint8_t)nearest_int, which wraps, then MIN(63, .)), fp16 d underflowing to 0."""
    rng = np.random.default_rng(5)
    parts = [rng.uniform(0, 2, (4000, 16))]
    e = rng.uniform(0, 1, (400, 16))
    e[:100, :8] = 0                                               # no scale: d = 0, every ls = 0
    e[100:200, 8:] = -0.0                                         # mins all -0.0: dmin must be +0
    e[200:300, 3] = -e[200:300, 3]                                # a negative scale
    e[300:, 12] = -0.004                                          # a small negative min
    parts += [e, rng.uniform(0, 1e-9, (200, 16)), rng.uniform(0, 3e5, (200, 16))]
    ties = _near_ties(rng, 400)
    t = rng.uniform(0, 1, (200, 16)) * np.repeat(ties[:200, :1], 16, axis=1)   # everything below the max ...
    t[:, 0], t[:, 5] = ties[:200, 0], ties[:200, 1]                            # ... max and its near-tie scale
    t[:, 8:] = rng.uniform(0, 1, (200, 8)) * ties[200:, :1]
    t[:, 8], t[:, 14] = ties[200:, 0], ties[200:, 1]                           # the same for the mins
    m_sc, m_mn = _near_fp16_ties(rng, 200).reshape(2, 100, 1)     # maxima whose d, dmin sit by fp16 midpoints
    h = rng.uniform(0, 1, (100, 16)) * np.concatenate([np.repeat(m_sc, 8, 1), np.repeat(m_mn, 8, 1)], axis=1)
    h[:, 2], h[:, 11] = m_sc[:, 0], m_mn[:, 0]
    parts += [t, h]
    v = np.concatenate(parts).astype(np.float32)                  # [n, 16]: 8 scales, then 8 mins
    ref = np.frombuffer(c_reference("q4_k_scales", v), dtype=np.uint8).reshape(-1, 16)
    sc, mn = torch.from_numpy(v[:, :8].copy()), torch.from_numpy(v[:, 8:].copy())
    ls, lm, d_bytes, dmin_bytes = _k4_scale_codes(sc, mn)
    ours = torch.cat([d_bytes, dmin_bytes, _pack_k4_scales(ls, lm)], dim=1).numpy()
    bad = np.nonzero((ours != ref).any(axis=1))[0]
    assert bad.size == 0, f"{bad.size} of {len(v)} differ; first: {v[bad[0]]} ours {ours[bad[0]]} C {ref[bad[0]]}"


def test_nearest_int_is_the_c_trick(c_reference):
    """Round half to even below 2**22; beyond it, and for inf/NaN, whatever the float32 add leaves (which
    is not the rounded value): the same int as C, so the clamps after it agree."""
    g = torch.Generator().manual_seed(2)
    v = torch.cat([torch.randn(4096, generator=g) * 40, torch.arange(-20, 21) + 0.5,        # ties
                   torch.tensor([2.0 ** 22 - 1.5, 4194303.0, 5e6, -5e6, 1e9, -3e10, 16777217.0]),
                   torch.tensor([float("inf"), float("-inf"), float("nan"), -0.0, 1e-45])])
    ref = np.frombuffer(c_reference("nearest", v.numpy()), dtype=np.int32)
    assert np.array_equal(_nearest_int(v).numpy(), ref)
    assert not np.array_equal(ref[-12:-5], torch.round(v[-12:-5]).to(torch.int32).numpy())   # not just round


def test_float32_helpers_round_once_like_c():
    """C's 63.f / s, m / 63.f and sqrtf(v) round once; torch's 63.0 / t (reciprocal, then multiply), t / 63.0
    on CUDA (the same) and its float32 CPU sqrt do not always. numpy's float32 division and sqrt are IEEE,
    correctly rounded: the oracle."""
    g = torch.Generator().manual_seed(3)
    den = torch.rand(100_000, generator=g) * 3 + 1e-3
    v = torch.rand(100_000, generator=g) * 100
    assert np.array_equal(_fdiv(63.0, den).numpy(), np.float32(63.0) / den.numpy())
    assert np.array_equal(_fdiv(v, 63.0).numpy(), v.numpy() / np.float32(63.0))
    assert np.array_equal(_sqrtf(v).numpy(), np.sqrt(v.numpy()))
    tiny = torch.tensor([1e-45, 1e-40, 1e-30, 3.4e38, 0.0])
    assert np.array_equal(_sqrtf(tiny).numpy(), np.sqrt(tiny.numpy()))
