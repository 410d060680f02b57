"""`course doctor`: what this machine can do for the course, and whether the install works.

Exit status 0 when the course can run (torch imports, the bundled models load and generate), 1 when
something the course needs is broken. It says whether the notebooks run in quick or full mode, and runs a
tiny smoke test of each optional path it reports (bitsandbytes int8 and NF4 linears on this CPU, through the
course's routing of the 4-bit CPU paths; one of the course's Triton kernels, on the GPU where Triton supports
it, else under Triton's interpreter in a subprocess), saying what each gives. An optional path that is
missing or fails its smoke is a "--" row with a one-line cause, never a traceback and never a failure of the
whole doctor: only the required rows can fail it.
"""
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

from course_lib import env

Row = tuple  # (name, ok, detail, required)
TRITON_SMOKE_TIMEOUT_S = 60
# rows that are optional fast paths (the final sentence lists which work here)
OPTIONAL_PATHS = ("bitsandbytes int8", "bitsandbytes nf4", "triton", "flash-attn")


def _cause(e: BaseException) -> str:
    """An exception in one line: its type and the first line of its message, cut to 160 characters."""
    msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
    line = f"{type(e).__name__}: {msg}" if msg else type(e).__name__
    return line if len(line) <= 160 else line[:157] + "..."


def mode_row() -> Row:
    """Quick or full notebook sizes (``env.quick()``), and why."""
    forced = os.environ.get("COURSE_QUICK", "").strip()
    quick = env.quick()
    if forced:
        why = f"COURSE_QUICK={forced} is set"
    elif quick:
        why = "no CUDA GPU here (COURSE_QUICK=0 forces the full sizes)"
    else:
        why = "a CUDA GPU is here (COURSE_QUICK=1 forces the small sizes)"
    return ("notebook mode", True, f"{'quick (small sizes)' if quick else 'full (real sizes)'}, because {why}",
            False)


@contextmanager
def _quiet(logger_name: str):
    """bitsandbytes logs warnings at import and on int8 calls (an optional download missing, an fp16 cast):
    not the doctor's business."""
    log = logging.getLogger(logger_name)
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)


def _rel(a, b) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def bnb_int8_smoke() -> str:
    """One bitsandbytes int8 linear (LLM.int8, threshold 6) on this CPU against the float linear."""
    import torch
    from torch import nn

    from course_lib.quant_eval import bnb_int8_cpu_matmul, bnb_linear
    g = torch.Generator(device="cpu").manual_seed(0)
    lin = nn.Linear(256, 64)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(64, 256, generator=g, device="cpu") * 0.05)
        lin.bias.copy_(torch.randn(64, generator=g, device="cpu") * 0.05)
    x = torch.randn(8, 256, generator=g, device="cpu")
    layer = bnb_linear(lin, "int8").eval()
    with torch.no_grad():
        err = _rel(layer(x), lin(x))
    if not err < 0.05:
        raise ValueError(f"int8 linear off the float linear by {err:.3f} (relative; expected < 0.05)")
    return f"int8 linear on this CPU: relative error {err:.4f} vs float; {bnb_int8_cpu_matmul()}"


def bnb_nf4_smoke() -> str:
    """Two bitsandbytes NF4 linears on this CPU, routed by ``quant_eval.route_bnb_cpu`` ("auto"): 64x256 (the
    packed path can take it) and 688x256 (N % 32 != 0, like the bundled model's MLP). Each output is checked
    against the float linear (NF4 rounding) and against its own dequantized weight (bf16 on the packed path)."""
    import torch
    from torch import nn

    import bitsandbytes.functional as bnbF
    from course_lib.quant_eval import bnb_linear, route_bnb_cpu
    g = torch.Generator(device="cpu").manual_seed(0)
    x = torch.randn(8, 256, generator=g, device="cpu")
    layers, floats = nn.ModuleList(), []
    for n_out in (64, 688):
        lin = nn.Linear(256, n_out)
        with torch.no_grad():
            lin.weight.copy_(torch.randn(n_out, 256, generator=g, device="cpu") * 0.05)
            lin.bias.copy_(torch.randn(n_out, generator=g, device="cpu") * 0.05)
        floats.append(lin)
        layers.append(bnb_linear(lin, "nf4"))
    layers.eval()
    routes = route_bnb_cpu(layers, "auto")
    parts = []
    for i, (layer, lin) in enumerate(zip(layers, floats)):
        w = bnbF.dequantize_4bit(layer.weight.data, layer.weight.quant_state).float()     # before any repack
        with torch.no_grad():
            y, want_float = layer(x), lin(x)
        err_float, err_own = _rel(y, want_float), _rel(y, x @ w.T + lin.bias)
        path = routes[str(i)].path
        own_tol = 1e-2 if path == "packed" else 1e-5
        if not (err_float < 0.2 and err_own < own_tol):
            raise ValueError(f"NF4 {lin.out_features}x256 on the {path} path: relative error {err_float:.3f} vs "
                             f"float (expected < 0.2), {err_own:.1e} vs its dequantized weight (< {own_tol:g})")
        parts.append(f"{lin.out_features}x256 takes the {path} path ({routes[str(i)].why}), relative error "
                     f"{err_float:.3f} vs float")
    return f"NF4 linears on this CPU: {'; '.join(parts)}"


def bnb_rows() -> list[Row]:
    if not env.has_package("bitsandbytes"):
        return [("bitsandbytes", False, "not installed (optional; pip install 'course_lib[quant]'): notebook 03 "
                 "skips its bitsandbytes rows", False)]
    rows = []
    try:
        with _quiet("bitsandbytes"):
            import bitsandbytes
        rows.append(("bitsandbytes", True, f"installed ({bitsandbytes.__version__})", False))
    except Exception as e:  # a broken native library: say so, never crash
        return [("bitsandbytes", False, f"installed but does not import: {_cause(e)}", False)]
    for name, smoke in (("bitsandbytes int8", bnb_int8_smoke), ("bitsandbytes nf4", bnb_nf4_smoke)):
        try:
            with _quiet("bitsandbytes"):
                rows.append((name, True, smoke(), False))
        except Exception as e:
            rows.append((name, False, f"smoke test failed: {_cause(e)}", False))
    return rows


# One of the course's Triton kernels (FlashAttention forward, causal, one 16x16 tile) against the PyTorch
# reference, in a fresh process: TRITON_INTERPRET must be set before triton is imported.
TRITON_SMOKE = r"""
import json, sys
import torch, triton
from course_lib.attention.reference import reference_attention
from course_lib.attention.triton_flash import flash_attention_triton
dev = sys.argv[1]
g = torch.Generator(device="cpu").manual_seed(0)
q, k, v = (torch.randn(1, 2, 16, 16, generator=g, device="cpu").to(dev) for _ in range(3))
got = flash_attention_triton(q, k, v, causal=True, block_m=16, block_n=16)
want = reference_attention(q, k, v, causal=True)
print("TRITON_SMOKE " + json.dumps({"version": triton.__version__, "max_err": (got - want).abs().max().item()}))
"""


def start_triton_smoke(device: str, interpret: bool) -> subprocess.Popen:
    """The smoke subprocess, started (the doctor runs its other checks meanwhile)."""
    root = str(Path(__file__).resolve().parents[1])
    child_env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
    if interpret:
        child_env["TRITON_INTERPRET"] = "1"
    else:
        child_env.pop("TRITON_INTERPRET", None)
    return subprocess.Popen([sys.executable, "-c", TRITON_SMOKE, device], env=child_env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def finish_triton_smoke(proc: subprocess.Popen, timeout: float = TRITON_SMOKE_TIMEOUT_S) -> dict:
    """{"version", "max_err"} of a finished smoke; raises RuntimeError with a one-line cause otherwise."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise RuntimeError(f"the smoke test did not finish in {timeout:g} s") from None
    for line in out.splitlines():
        if line.startswith("TRITON_SMOKE "):
            return json.loads(line[len("TRITON_SMOKE "):])
    last = [ln for ln in err.strip().splitlines() if ln.strip()]
    raise RuntimeError(last[-1] if last else f"the smoke process exited with status {proc.returncode}")


def triton_plan() -> tuple[str, bool] | None:
    """Where the Triton smoke runs: ("cuda", False) on a GPU Triton supports, ("cpu", True) under the
    interpreter elsewhere; None when triton is not installed."""
    if not env.has_package("triton"):
        return None
    return ("cuda", False) if env.triton_gpu_supported() else ("cpu", True)


def triton_row(plan, result) -> Row:
    """``result``: the smoke's dict, or the exception it raised."""
    if plan is None:
        return ("triton", False, "not installed (optional): the course uses its PyTorch paths", False)
    cc = env.compute_capability()
    failed = isinstance(result, BaseException)
    smoke = (f"smoke test failed: {_cause(result)}" if failed else
             f"flash-attention kernel matches the PyTorch reference (max error {result['max_err']:.1e})")
    version = "" if failed else f" {result['version']}"
    if plan == ("cuda", False):
        if failed:
            return ("triton", False, f"installed; the GPU is supported but the {smoke}", False)
        return ("triton", True, f"triton{version}: the course's Triton kernels run on this GPU; {smoke}", False)
    need = "%d.%d" % tuple(env.TRITON_MIN_CAPABILITY)
    where = ("no CUDA GPU" if cc is None else
             f"Triton does not support this GPU (compute capability {cc[0]}.{cc[1]}; it needs {need} or newer)")
    return ("triton", False, f"triton{version} installed; {where}: the course's Triton kernels run here only "
            f"under the interpreter (for tests), the PyTorch paths are used; interpreter {smoke}", False)


def model_rows() -> list[Row]:
    rows = []
    for name in ("tiny", "tiny-draft"):
        try:
            import torch

            from course_lib.models import load   # here: a broken install is a failed row, not a traceback
            t0 = time.perf_counter()
            model, tok = load(name, device="cpu", verbose=False)
            ids = torch.tensor([tok("def main():")["input_ids"]], device=model.device)
            with torch.no_grad():
                logits = model(ids)
            ok = bool(torch.isfinite(logits).all())
            rows.append((f"model {name}", ok, f"{model.num_parameters():,} parameters, loaded and ran in "
                         f"{time.perf_counter() - t0:.2f} s" if ok else "logits are not finite", True))
        except Exception as e:  # report, never crash: this is the tool that explains broken installs
            rows.append((f"model {name}", False, _cause(e), True))
    return rows


def cpu_bf16_note() -> str:
    """What this CPU does with bf16 (torch's own CPU feature probe, when this torch has it)."""
    import torch
    probe = getattr(getattr(torch, "cpu", None), "_is_avx512_bf16_supported", None)
    try:
        has = probe() if probe is not None else None
    except Exception:
        has = None
    if has is None:
        return "no GPU bf16 here; whether this CPU has bf16 instructions is unknown (without them bf16 is slow)"
    if has:
        return "no GPU bf16 here; this CPU has AVX512-BF16 instructions (bitsandbytes' packed 4-bit path uses them)"
    return "no GPU bf16 here, and this CPU has no AVX512-BF16: bf16 runs emulated, slowly"


def checks() -> list[Row]:
    """(name, ok, detail, required) for each check."""
    plan = triton_plan()
    smoke = None
    if plan is not None:
        try:
            smoke = start_triton_smoke(*plan)      # runs while the other checks do
        except Exception as e:                     # no subprocess here: the row says why
            smoke = e
    caps = env.capabilities()
    rows: list[Row] = [("python", sys.version_info >= (3, 10), caps.python, True), ("torch", True, caps.torch, True)]
    dev = caps.device + (f" ({caps.device_name}, compute capability {caps.compute_capability})"
                         if caps.compute_capability else f" ({caps.device_name})")
    rows.append(("device", True, dev, False))
    rows.append(mode_row())
    bf16_note = ("hardware bf16 (compute capability >= 8.0)" if caps.real_bf16 else
                 "no hardware bf16: torch may claim support through emulation; use fp16" if caps.device == "cuda"
                 else cpu_bf16_note())
    rows.append(("real bf16", caps.real_bf16, bf16_note, False))
    rows.append(("flash-attn", caps.flash_attn, "usable" if caps.flash_attn else
                 "not usable (optional: needs the flash-attn package and an Ampere or newer GPU)", False))
    triton_at = len(rows)
    rows += bnb_rows()
    rows.append(("colab", caps.colab, "yes" if caps.colab else "no", False))
    rows.append(("offline mode", caps.offline, "on: bundled models only" if caps.offline else
                 "off: hub models load when the network is there", False))
    rows += model_rows()
    result = None
    if plan is not None:
        try:
            result = smoke if isinstance(smoke, BaseException) else finish_triton_smoke(smoke)
        except Exception as e:
            result = e
    rows.insert(triton_at, triton_row(plan, result))
    return rows


def summary(rows: list[Row]) -> str:
    """The last line: broken (which required rows), or that the course can run and which optional paths work."""
    broken = [r[0] for r in rows if r[3] and not r[1]]
    if broken:
        return (f"The install is broken: {', '.join(broken)}. Reinstall with `make setup` "
                f"(or `pip install -e .`) and run `course doctor` again.")
    mode = next((r[2].split()[0] for r in rows if r[0] == "notebook mode"), None)
    works = [r[0] for r in rows if r[0] in OPTIONAL_PATHS and r[1]]
    missing = [r[0] for r in rows if r[0] in OPTIONAL_PATHS and not r[1]]
    if not any(r[0].startswith("bitsandbytes ") for r in rows):
        missing.append("bitsandbytes")
    text = "The course can run here" + (f", notebooks in {mode} mode" if mode else "") + "."
    text += f" Optional paths working here: {', '.join(works) or 'none'}."
    if missing:
        text += f" Not here: {', '.join(missing)} (the course uses its PyTorch paths or skips those cells)."
    return text


def main(argv=None) -> int:
    rows = checks()
    width = max(len(r[0]) for r in rows)
    print("course doctor")
    for name, ok, detail, required in rows:
        mark = "ok " if ok else ("FAIL" if required else "-- ")
        print(f"  {mark:4} {name:<{width}}  {detail}")
    print("\n" + summary(rows))
    return 1 if any(r[3] and not r[1] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
