"""Shared by the benchmark scripts: the device's name and where results go."""
import json
import os
import platform
import sys
from pathlib import Path

import torch

RESULTS = Path(os.environ.get("COURSE_BENCH_RESULTS", Path(__file__).parent / "results"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def device_name() -> str:
    if torch.cuda.is_available():
        return torch.cuda.get_device_name()
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return f"CPU {line.split(':', 1)[1].strip()} ({torch.get_num_threads()} threads)"
    except OSError:
        pass
    return f"CPU {platform.processor() or platform.machine()} ({torch.get_num_threads()} threads)"


def device_slug() -> str:
    """The device the benchmarks run on, as their result files name it: <name>-<slug>.json."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def result_path(name: str) -> Path:
    """Where `save(name, ...)` writes on this machine."""
    return RESULTS / f"{name}-{device_slug()}.json"


def save(name: str, rows: list[dict], **meta) -> Path:
    RESULTS.mkdir(exist_ok=True)
    dev = device_name()
    path = result_path(name)
    path.write_text(json.dumps({"device": dev, "torch": torch.__version__, **meta, "rows": rows}, indent=2) + "\n")
    return path


def memory_bandwidth() -> tuple[float, str]:
    """(bytes/s, where the number comes from) of this device's main memory: the hardware table for a
    known GPU (its HBM datasheet figure), else a measured copy (what a roofline should be drawn against)."""
    from course_lib.device_bench import measure_copy_bandwidth
    from course_lib.perf.hardware import get_gpu
    if torch.cuda.is_available():
        try:
            spec = get_gpu(torch.cuda.get_device_name())
            return spec.bandwidth, f"{spec.name} datasheet, {spec.bandwidth_gbs:,.0f} GB/s"
        except ValueError:
            pass
        dev, nbytes = torch.device("cuda"), 2**30
    else:
        dev, nbytes = torch.device("cpu"), 256 * 2**20
    gbs = measure_copy_bandwidth(dev, nbytes, repeats=5)
    return gbs * 1e9, f"measured copy bandwidth, {gbs:,.1f} GB/s"


def default_dtype() -> str:
    """The dtype a benchmark runs in by default here: the 16-bit type this GPU computes in hardware
    (``course_lib.env.half_dtype``: bf16 from compute capability 8.0, fp16 on a T4), fp32 on a CPU."""
    from course_lib.env import half_dtype
    if not torch.cuda.is_available():
        return "fp32"
    return {torch.bfloat16: "bf16", torch.float16: "fp16"}[half_dtype("cuda")]


def triton_skip_reason(test_file: str) -> str | None:
    """None when the course's Triton kernels run here (``course_lib.env.triton_gpu_supported``), else why
    their rows are skipped; ``test_file`` checks them under the interpreter instead."""
    from course_lib.env import triton_unsupported_reason
    reason = triton_unsupported_reason()
    if reason is None:
        return None
    if not torch.cuda.is_available() and "not installed" not in reason:
        return (f"no CUDA device: the Triton kernel runs on CPU only in the interpreter, which checks "
                f"correctness ({test_file}), not speed")
    return reason


def print_table(rows: list[dict], cols: list[str]):
    widths = [max(len(c), *(len(f"{r[c]}") for r in rows)) for c in cols]
    print("  ".join(c.ljust(w) for c, w in zip(cols, widths)))
    for r in rows:
        print("  ".join(f"{r[c]}".ljust(w) for c, w in zip(cols, widths)))
