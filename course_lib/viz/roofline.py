"""Roofline plots and an interactive roofline explorer (core ipywidgets + matplotlib).

    from course_lib.viz import plot_roofline, RooflineExplorer
    plot_roofline(["T4", "A100-80GB", "H100-SXM"], "fp16", tables=[prefill, decode])
    RooflineExplorer("llama-2-7b")          # display it as the last line of a cell

The explorer's logic is plain Python: set `.gpu.value`, `.dtype.value`, `.batch.value`,
`.seq_len.value` and read `.result` (what the summary shows); tests drive it that way. It uses only
widgets and APIs that ipywidgets 7.7.1 (Colab) and 8 both have: Dropdown, IntSlider, HTML, Output,
HBox, VBox and observe().
"""
from __future__ import annotations

import html as _html

import numpy as np

from course_lib.perf.hardware import GPUS, DeviceSpec, bytes_per_element, canonical_dtype, get_gpu
from course_lib.models.config import as_config
from course_lib.perf.intensity import intensity_table
from course_lib.perf.ops import OpTable
from course_lib.perf.tables import si
from course_lib.validate import integer, one_of
from course_lib.perf.roofline import (COMPUTE_BOUND, MEMORY_BOUND, analyze, decode_critical_batch, decode_matmul_sums,
                                      ridge_point)
from ._output import show_figure

_PHASE_MARKERS = {"prefill": "o", "decode": "X"}


def _devices(devices) -> list[DeviceSpec]:
    if devices is None:
        return list(GPUS.values())
    if isinstance(devices, (str, DeviceSpec)):
        devices = [devices]
    return [get_gpu(d) for d in devices]


def _dtype_for(dev: DeviceSpec, dtype) -> str:
    key = canonical_dtype(dtype)
    return key if key in dev.peak_tflops else dev.default_dtype


def plot_roofline(devices=None, dtype="fp16", tables=(), ax=None, annotate: bool = True,
                  intensity_range=(1e-2, 1e4), title: str | None = None):
    """Log-log rooflines (attainable FLOP/s against FLOP/byte) of one or more devices, with the ops of
    `tables` (OpTables, e.g. a prefill and a decode table) placed on the first device's roofline.

    A device with no rate for `dtype` (a measured CPU has fp32 only) is drawn with its own default
    dtype, said in the legend. Returns the matplotlib Axes.
    """
    import matplotlib.pyplot as plt
    devs = _devices(devices)
    if not devs:
        raise ValueError("devices must name at least one device")
    if isinstance(tables, OpTable):
        tables = [tables]
    lo, hi = intensity_range
    if not (0 < lo < hi):
        raise ValueError(f"intensity_range must be (low, high) with 0 < low < high, got {intensity_range!r}")
    if ax is None:
        _, ax = plt.subplots(figsize=(8, 5.5))
    x = np.logspace(np.log10(lo), np.log10(hi), 400)
    colors = plt.rcParams["axes.prop_cycle"].by_key().get("color", ["C0"])
    for i, d in enumerate(devs):
        dt = _dtype_for(d, dtype)
        peak, bw = d.peak_flops(dt), d.bandwidth
        y = np.minimum(peak, x * bw)
        c = colors[i % len(colors)]
        ridge = peak / bw
        style = "--" if d.measured else "-"
        ax.loglog(x, y, style, color=c, lw=2 if i == 0 else 1.3,
                  label=f"{d.name} ({dt}): ridge {ridge:.3g} FLOP/B")
        if lo <= ridge <= hi:
            ax.plot([ridge], [peak], "o", color=c, ms=5)
    if tables:
        d0 = devs[0]
        dt0 = _dtype_for(d0, dtype)
        peak, bw = d0.peak_flops(dt0), d0.bandwidth
        for t in tables:
            if not isinstance(t, OpTable) or t.mode != "real":
                raise ValueError("tables must be OpTables from intensity_table(..., mode='real')")
            marker = _PHASE_MARKERS[t.phase]
            pts = [(r.name, r.intensity) for r in t.rows if r.intensity]
            xs = np.array([p[1] for p in pts])
            ys = np.minimum(peak, xs * bw)
            ax.scatter(xs, ys, marker=marker, s=40, zorder=5, edgecolor="k", linewidths=0.5,
                       label=f"{t.phase} ops (L={t.seq_len}, batch {t.batch}, {t.dtype}) on {d0.name}")
            if annotate:  # label the matmuls; ops at nearly the same intensity share one label
                groups: dict[int, list] = {}
                for (name, xi), yi in zip(pts, ys):
                    if t[name].kind in ("matmul", "attention"):
                        groups.setdefault(int(np.floor(np.log10(xi) * 3)), []).append((name, xi, yi))
                for j, (_, members) in enumerate(sorted(groups.items())):
                    names = [m[0] for m in members]
                    text = ", ".join(names) if len(names) <= 2 else ", ".join(names[:2]) + f" +{len(names) - 2}"
                    _, xi, yi = members[0]
                    # below and right of the point, where the roof leaves empty space, with a leader line;
                    # neighbouring groups alternate heights so their labels do not overlap
                    dy = (28 if t.phase == "decode" else 40) + 14 * (j % 2)
                    ax.annotate(text, (xi, yi), textcoords="offset points", fontsize=7, ha="left", va="top",
                                xytext=(10, -dy), arrowprops=dict(arrowstyle="-", lw=0.5, color="0.4"))
    ax.set_xlabel("arithmetic intensity (FLOP / byte)")
    ax.set_ylabel("attainable FLOP/s")
    ax.set_title(title or f"Roofline ({canonical_dtype(dtype)})")
    ax.grid(True, which="both", alpha=0.25)
    ax.legend(fontsize=7, loc="lower right")
    return ax


def plot_decode_batch(model, devices=None, dtype="fp16", batches=None, ax=None, weight_dtype=None):
    """Intensity of one decode step's weight matmuls against the batch size, with each device's ridge
    point: where the curve crosses a ridge line, decode stops being memory-bound there."""
    import matplotlib.pyplot as plt
    shape = as_config(model)
    devs = _devices(devices)
    batches = np.unique(np.round(np.logspace(0, 4.5, 200))) if batches is None else np.asarray(batches, float)
    if np.any(batches < 1):
        raise ValueError("batches must be >= 1")
    # all the step's weight matmuls together: I(B) = 2 B W / (a B A + w W), W = sum k*n, A = sum (k + n)
    W, A, a, w = decode_matmul_sums(shape, dtype, weight_dtype)
    inten = 2 * batches * W / (a * batches * A + w * W)
    if ax is None:
        _, ax = plt.subplots(figsize=(8, 5))
    ax.loglog(batches, inten, "k-", lw=2,
              label=f"{shape.name or 'model'} decode weight matmuls ({canonical_dtype(dtype)})")
    colors = plt.rcParams["axes.prop_cycle"].by_key().get("color", ["C0"])
    for i, d in enumerate(devs):
        if canonical_dtype(dtype) not in d.peak_tflops:
            continue
        r = ridge_point(d, dtype)
        bstar = decode_critical_batch(shape, d, dtype, weight_dtype=weight_dtype)
        c = colors[i % len(colors)]
        lab = f"{d.name} ridge {r:.3g}" + (f" -> batch {bstar:.0f}" if np.isfinite(bstar) else " (never reached)")
        ax.axhline(r, color=c, ls="--", lw=1, label=lab)
        if np.isfinite(bstar):
            ax.plot([bstar], [r], "o", color=c)
    ax.set_xlabel("batch size (sequences decoded together)")
    ax.set_ylabel("FLOP / byte")
    ax.set_title("Decode: intensity grows with the batch until the ridge point")
    ax.grid(True, which="both", alpha=0.25)
    ax.legend(fontsize=7)
    return ax


class RooflineExplorer:
    """GPU, dtype, batch and sequence length -> prefill and decode on that GPU's roofline.

    devices: extra DeviceSpecs (e.g. measure_device()) added to the GPU table in the dropdown.
    plot: draw the figure into the Output widget on every change (tests may turn it off).
    """

    DTYPES = ("fp32", "tf32", "fp16", "bf16", "fp8", "int8")

    def __init__(self, model="llama-2-7b", devices=None, gpu: str = "A100-80GB", dtype: str = "fp16",
                 batch: int = 1, seq_len: int = 1024, max_batch: int = 1024, max_seq_len: int = 32768,
                 plot: bool = True):
        import ipywidgets as W
        self.model = as_config(model)
        self.devices: dict[str, DeviceSpec] = dict(GPUS)
        for d in ([] if devices is None else ([devices] if isinstance(devices, DeviceSpec) else devices)):
            self.devices[d.name] = get_gpu(d)
        if isinstance(gpu, DeviceSpec):
            self.devices.setdefault(gpu.name, gpu)
            gpu_name = gpu.name
        else:
            gpu_name = gpu if gpu in self.devices else get_gpu(gpu).name  # ValueError names the known GPUs
        dtype = canonical_dtype(dtype)
        one_of(dtype, "dtype", self.DTYPES)
        batch, seq_len = integer(batch, "batch", low=1), integer(seq_len, "seq_len", low=1)
        max_batch, max_seq_len = integer(max_batch, "max_batch", low=1), integer(max_seq_len, "max_seq_len", low=1)
        self.plot = plot
        self.figure = None
        self.result: dict = {}
        self.gpu = W.Dropdown(options=list(self.devices), value=gpu_name, description="GPU")
        self.dtype = W.Dropdown(options=list(self.DTYPES), value=dtype, description="dtype")
        self.batch = W.IntSlider(value=min(batch, max_batch), min=1, max=max_batch, step=1, description="batch",
                                 continuous_update=False)
        self.seq_len = W.IntSlider(value=min(seq_len, max_seq_len), min=1, max=max_seq_len, step=1,
                                   description="seq len", continuous_update=False)
        self.summary = W.HTML()
        self.out = W.Output()
        for w in (self.gpu, self.dtype, self.batch, self.seq_len):
            w.observe(self._on_change, names="value")
        self.ui = W.VBox([W.HBox([self.gpu, self.dtype]), W.HBox([self.batch, self.seq_len]),
                          self.summary, self.out])
        self.update()

    # --- logic (no widgets needed) ---
    def compute(self) -> dict:
        """Everything the explorer shows, as plain numbers and strings."""
        dev = self.devices[self.gpu.value]
        dtype, B, L = self.dtype.value, int(self.batch.value), int(self.seq_len.value)
        res = {"gpu": dev.name, "dtype": dtype, "batch": B, "seq_len": L, "ok": dev.supports(dtype)}
        if not res["ok"]:
            res["message"] = (f"{dev.name} has no {dtype} rate (it has {', '.join(sorted(dev.peak_tflops))}); "
                              f"pick another dtype or GPU.")
            return res
        pre = analyze(intensity_table(self.model, "prefill", L, B, dtype), dev, dtype)
        dec = analyze(intensity_table(self.model, "decode", L, B, dtype), dev, dtype)
        w_bytes = self.model.num_parameters() * bytes_per_element(dtype)
        kv = self.model.kv_cache_bytes(L + 1, B, bytes_per_element(dtype))
        need = w_bytes + kv
        res.update(
            ridge=ridge_point(dev, dtype),
            prefill_time=pre.time, prefill_intensity=pre.table.intensity,
            prefill_bound=COMPUTE_BOUND if pre.share(COMPUTE_BOUND) >= 0.5 else MEMORY_BOUND,
            prefill_tokens_per_s=B * L / pre.time,
            decode_time=dec.time, decode_intensity=dec.table.intensity,
            decode_bound=COMPUTE_BOUND if dec.share(COMPUTE_BOUND) >= 0.5 else MEMORY_BOUND,
            decode_tokens_per_s=B / dec.time,
            critical_batch=decode_critical_batch(self.model, dev, dtype),
            memory_needed=need, memory_available=(dev.memory_gb or 0) * 1e9,
            fits=dev.memory_gb is None or need <= dev.memory_gb * 1e9,
            analyses=(pre, dec),
        )
        res["message"] = ""
        return res

    def summary_html(self, r: dict | None = None) -> str:
        r = self.result if r is None else r
        if not r.get("ok"):
            return f"<b style='color:#b00'>{_html.escape(r.get('message', ''))}</b>"
        fits = "fits" if r["fits"] else "<b style='color:#b00'>does not fit</b>"
        mem = (f"weights + KV cache {si(r['memory_needed'], 'B')} {fits} in {si(r['memory_available'], 'B')}"
               if r["memory_available"] else f"weights + KV cache {si(r['memory_needed'], 'B')}")
        cb = r["critical_batch"]
        cbs = f"{cb:.0f}" if np.isfinite(cb) else "never"
        name = _html.escape(self.model.name or "model")
        return (f"<b>{name}</b> on <b>{_html.escape(r['gpu'])}</b> ({r['dtype']}), ridge point "
                f"<b>{r['ridge']:.3g}</b> FLOP/byte<br>"
                f"prefill of {r['batch']} x {r['seq_len']} tokens: at least {si(r['prefill_time'], 's')} "
                f"({r['prefill_intensity']:.3g} FLOP/byte, mostly {r['prefill_bound']}; "
                f"{r['prefill_tokens_per_s']:.3g} tokens/s)<br>"
                f"decode step after {r['seq_len']} tokens: at least {si(r['decode_time'], 's')} "
                f"({r['decode_intensity']:.3g} FLOP/byte, mostly {r['decode_bound']}; "
                f"{r['decode_tokens_per_s']:.3g} tokens/s)<br>"
                f"decode weight matmuls turn compute-bound at batch {cbs}; {mem}")

    def draw(self, r: dict | None = None):
        """A new matplotlib Figure with the GPU's roofline and this setting's ops (None if unsupported)."""
        import matplotlib.pyplot as plt
        r = self.result if r is None else r
        if not r.get("ok"):
            return None
        pre, dec = r["analyses"]
        fig, ax = plt.subplots(figsize=(7.5, 4.8))
        plot_roofline([self.devices[r["gpu"]]], r["dtype"], tables=[pre.table, dec.table], ax=ax,
                      title=f"{self.model.name or 'model'} on {r['gpu']} ({r['dtype']})")
        return fig

    def update(self):
        self.result = self.compute()
        self.summary.value = self.summary_html()
        if self.plot:
            self.figure = self.draw()
            show_figure(self.out, self.figure)

    def _on_change(self, change):
        self.update()

    def _ipython_display_(self):
        from IPython.display import display
        display(self.ui)


__all__ = ["plot_roofline", "plot_decode_batch", "RooflineExplorer"]
