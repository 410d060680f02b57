"""`course doctor`: what this machine can do for the course, and whether the install works.

Exit status 0 when the course can run (torch imports, the bundled models load and generate), 1 when
something the course needs is broken. Optional extras (flash-attn, triton, bitsandbytes, a GPU) are
reported, never required.
"""
from __future__ import annotations

import sys
import time

from course_lib import env


def checks() -> list[tuple[str, bool, str, bool]]:
    """(name, ok, detail, required) for each check."""
    rows: list[tuple[str, bool, str, bool]] = []
    caps = env.capabilities()
    rows.append(("python", sys.version_info >= (3, 10), caps.python, True))
    rows.append(("torch", True, caps.torch, True))
    dev = caps.device + (f" ({caps.device_name}, compute capability {caps.compute_capability})"
                         if caps.compute_capability else f" ({caps.device_name})")
    rows.append(("device", True, dev, False))
    bf16_note = ("hardware bf16 (compute capability >= 8.0)" if caps.real_bf16 else
                 "no hardware bf16" + (": torch may claim support through emulation; use fp16"
                                       if caps.device == "cuda" else " on this device (CPU emulates it slowly)"))
    rows.append(("real bf16", caps.real_bf16, bf16_note, False))
    rows.append(("flash-attn", caps.flash_attn, "usable" if caps.flash_attn else
                 "not usable (optional: needs the flash-attn package and an Ampere or newer GPU)", False))
    rows.append(("triton", caps.triton, "installed" if caps.triton else
                 "not installed (optional; kernels fall back to PyTorch)", False))
    rows.append(("bitsandbytes", caps.bitsandbytes, "installed" if caps.bitsandbytes else
                 "not installed (optional; pip install 'course_lib[quant]')", False))
    rows.append(("colab", caps.colab, "yes" if caps.colab else "no", False))
    rows.append(("offline mode", caps.offline, "on: bundled models only" if caps.offline else
                 "off: hub models load when the network is there", False))
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
            rows.append((f"model {name}", False, f"{type(e).__name__}: {e}", True))
    return rows


def main(argv=None) -> int:
    rows = checks()
    width = max(len(r[0]) for r in rows)
    print("course doctor")
    for name, ok, detail, required in rows:
        mark = "ok " if ok else ("FAIL" if required else "-- ")
        print(f"  {mark:4} {name:<{width}}  {detail}")
    broken = [r[0] for r in rows if r[3] and not r[1]]
    if broken:
        print(f"\nThe install is broken: {', '.join(broken)}. Reinstall with `make setup` "
              f"(or `pip install -e .`) and run `course doctor` again.")
        return 1
    print("\nEverything the course needs is here.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
