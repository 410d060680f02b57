"""Plots and the interactive quantization explorer of module 02.

    from course_lib.viz.quant import QuantExplorer, plot_bit_layouts
    QuantExplorer.from_model(model)          # in a notebook: displays the controls and the plots

The explorer uses core ipywidgets only (Dropdown, IntSlider, FloatSlider, ToggleButtons, HTML, Output,
VBox/HBox, ``observe``), so it runs on ipywidgets 7.7.1 (Colab) and 8. Its logic is plain Python: set a
control's ``.value`` and read ``.stats`` (tests do exactly that, without a browser).
"""
from __future__ import annotations

import math

import torch

from course_lib.quant.core import qrange, quantize
from course_lib.quant.formats import decode_bits, encode_bits, get_format
from course_lib.quant.metrics import error_report
from course_lib.validate import one_of, optional

from ._output import show_figure

__all__ = ["plot_bit_layout", "plot_bit_layouts", "QuantExplorer", "linear_weights", "divisors"]

_COLORS = {"sign": "#e07070", "exponent": "#70a0e0", "mantissa": "#80c080"}


def plot_bit_layout(value: float, fmt, ax=None, show_value: bool = True):
    """Draw the bits of ``value`` in a float format as coloured boxes: sign | exponent | mantissa."""
    import matplotlib.pyplot as plt
    f = get_format(fmt)
    d = decode_bits(encode_bits(value, f), f)
    if ax is None:
        _, ax = plt.subplots(figsize=(max(4.0, 0.28 * f.bits + 2), 0.9))
    bits = format(d.bits, f"0{f.bits}b")
    for i, ch in enumerate(bits):
        part = "sign" if i == 0 else ("exponent" if i <= f.exponent_bits else "mantissa")
        ax.add_patch(plt.Rectangle((i, 0), 1, 1, facecolor=_COLORS[part], edgecolor="black", lw=0.6))
        ax.text(i + 0.5, 0.5, ch, ha="center", va="center", fontsize=8 if f.bits > 16 else 10,
                family="monospace")
    ax.set_xlim(-0.2, max(f.bits, 16) + 0.2)
    ax.set_ylim(-0.1, 1.1)
    ax.axis("off")
    label = f"{f.name}"
    if show_value:
        label += f": {value:g} -> {d.value:.8g}   ({d.formula()})"
    ax.set_title(label, loc="left", fontsize=9)
    return ax


def plot_bit_layouts(value: float, fmts=("fp32", "fp16", "bf16", "fp8_e4m3", "fp8_e5m2")):
    """One row per format: the bit pattern of ``value`` and what it decodes to. Returns the figure."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch
    fig, axes = plt.subplots(len(fmts), 1, figsize=(10, 0.95 * len(fmts) + 0.4))
    axes = [axes] if len(fmts) == 1 else list(axes)
    for ax, fmt in zip(axes, fmts):
        plot_bit_layout(value, fmt, ax=ax)
        f = get_format(fmt)
        ax.set_xlim(-0.2, 32.2)
        if f.bits < 32:
            ax.text(f.bits + 0.4, 0.5, f"{f.bits} bits", va="center", fontsize=9)
    fig.legend(handles=[Patch(color=c, label=k) for k, c in _COLORS.items()], loc="lower center", ncol=3,
               frameon=False)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    return fig


def divisors(n: int, low: int = 4, high: int = 1024) -> list[int]:
    """Divisors of n in [low, high] (the group sizes a dimension allows)."""
    return [d for d in range(low, min(n, high) + 1) if n % d == 0]


def linear_weights(model, layer: int | None = 0) -> dict:
    """{name: weight} of the 2-D weight matrices of one decoder layer (or all layers if ``layer`` is None),
    as float32 CPU tensors."""
    out = {}
    for name, p in model.named_parameters():
        if p.dim() != 2 or "embed" in name or "lm_head" in name:
            continue
        if layer is not None and f"layers.{layer}." not in name:
            continue
        out[name.replace("model.", "").replace(".weight", "")] = p.detach().float().cpu()
    if not out:
        raise ValueError(f"no 2-D weight matrices found for layer={layer}")
    return out


class QuantExplorer:
    """Interactive quantization of one weight matrix: bits, scheme, granularity, group size, clipping.

    Shows the weight histogram with the quantization grid of the group (or channel) holding the largest
    |w|, the quantized-vs-original staircase, and the error histogram; ``.stats`` holds the numbers
    (mse, sqnr_db, max_error, bits_per_weight, n_scales, saturated). Controls: ``matrix``, ``bits``,
    ``scheme``, ``granularity``, ``group_size``, ``clip``; ``matrix=`` picks the first matrix shown.
    """

    def __init__(self, weights, bits: int = 4, scheme: str = "absmax", granularity: str = "group",
                 group_size: int | None = 64, clip: float = 1.0, render: bool = True, sample: int = 4000,
                 seed: int = 0, matrix: str | None = None):
        import ipywidgets as W
        if isinstance(weights, torch.Tensor):
            weights = {"weight": weights}
        if not isinstance(weights, dict) or not weights:
            raise TypeError("weights must be a 2-D tensor or a non-empty {name: 2-D tensor} dict")
        for name, w in weights.items():
            if not isinstance(w, torch.Tensor) or w.dim() != 2:
                raise ValueError(f"weights[{name!r}] must be a 2-D tensor, got "
                                 f"{getattr(w, 'shape', type(w).__name__)}")
        self.weights = {k: v.detach().float().cpu() for k, v in weights.items()}
        self.render_enabled = render
        self.sample, self.seed = sample, seed
        self._busy = False
        self.stats: dict = {}
        self.figure_count = 0
        optional(one_of, matrix, "matrix", list(self.weights))
        first = matrix if matrix is not None else next(iter(self.weights))
        style = {"description_width": "90px"}
        self.matrix = W.Dropdown(options=list(self.weights), value=first, description="matrix", style=style)
        self.bits = W.IntSlider(value=bits, min=2, max=8, step=1, description="bits", style=style)
        self.scheme = W.ToggleButtons(options=[("absmax (symmetric)", "absmax"),
                                               ("zero-point (asymmetric)", "zeropoint")],
                                      value=scheme, description="scheme",
                                      style={**style, "button_width": "190px"})   # whole option labels
        self.granularity = W.Dropdown(options=["tensor", "channel", "group"], value=granularity,
                                      description="granularity", style=style)
        gs = divisors(self.weights[first].shape[1])
        self.group_size = W.Dropdown(options=gs, value=self._closest(gs, group_size or 64),
                                     description="group size", style=style)
        self.clip = W.FloatSlider(value=clip, min=0.3, max=1.0, step=0.01, description="clip ratio",
                                  readout_format=".2f", style=style)
        self.info = W.HTML()
        self.out = W.Output()
        self.controls = [self.matrix, self.bits, self.scheme, self.granularity, self.group_size, self.clip]
        for c in self.controls:
            c.observe(self._on_change, names="value")
        self.widget = W.VBox([W.HBox([W.VBox([self.matrix, self.granularity, self.group_size]),
                                      W.VBox([self.bits, self.clip])]),
                              self.scheme, self.info, self.out])
        self._sync_group_control()
        self.update()

    # --- logic (no widgets needed to test it) -------------------------------------------------------
    @staticmethod
    def _closest(options, target):
        return min(options, key=lambda v: (abs(math.log(v) - math.log(target)), v))

    def _sync_group_control(self):
        """Group sizes must divide the matrix's input dimension; the control is disabled unless 'group'."""
        w = self.weights[self.matrix.value]
        opts = divisors(w.shape[1])
        if list(self.group_size.options) != opts:
            keep = self.group_size.value
            was, self._busy = self._busy, True
            try:
                self.group_size.options = opts
                self.group_size.value = keep if keep in opts else self._closest(opts, keep or 64)
            finally:
                self._busy = was
        self.group_size.disabled = self.granularity.value != "group"

    def _on_change(self, change=None):
        if self._busy:
            return
        self._sync_group_control()
        self.update()

    def set(self, **values) -> dict:
        """Set several controls at once (``set(bits=3, granularity="group", group_size=32)``) with a single
        recompute and redraw; returns the new ``stats``. Keys: matrix, bits, scheme, granularity,
        group_size, clip."""
        controls = {"matrix": self.matrix, "bits": self.bits, "scheme": self.scheme,
                    "granularity": self.granularity, "group_size": self.group_size, "clip": self.clip}
        unknown = set(values) - set(controls)
        if unknown:
            raise ValueError(f"unknown control(s) {sorted(unknown)}; expected some of {sorted(controls)}")
        was, self._busy = self._busy, True
        try:
            if "matrix" in values:                  # first: it decides which group sizes are allowed
                self.matrix.value = values["matrix"]
                self._sync_group_control()
            for k, v in values.items():
                if k != "matrix":
                    controls[k].value = v
        finally:
            self._busy = was
        self._sync_group_control()
        return self.update()

    def params(self) -> dict:
        g = self.granularity.value
        return dict(bits=int(self.bits.value), scheme=self.scheme.value, granularity=g,
                    axis=0 if g == "channel" else (-1 if g == "group" else None),
                    group_size=int(self.group_size.value) if g == "group" else None,
                    clip_ratio=float(self.clip.value))

    def compute(self) -> dict:
        w = self.weights[self.matrix.value]
        p = self.params()
        q = quantize(w, **p)
        w_hat = q.dequantize()
        rep = error_report(w, w_hat)
        # the scale group holding the largest |w|: its grid is the one an outlier stretches
        flat_idx = int(w.abs().argmax())
        r, c = divmod(flat_idx, w.shape[1])
        si = tuple(0 if s == 1 else (r if d == 0 else c // (w.shape[1] // s)) for d, s in enumerate(q.scale.shape))
        scale = float(q.scale[si])
        zp = int(q.zero_point[si]) if q.zero_point is not None else 0
        qmin, qmax = qrange(p["bits"], symmetric=p["scheme"] == "absmax")
        grid = (torch.arange(qmin, qmax + 1, dtype=torch.float64, device="cpu") - zp) * scale   # for matplotlib
        saturated = float((q.codes == qmin).float().mean() + (q.codes == qmax).float().mean()) \
            if p["clip_ratio"] < 1 else 0.0
        rep.update(bits_per_weight=q.bits_per_value(scale_bits=16), n_scales=q.scale.numel(), grid=grid,
                   grid_scale=scale, saturated=saturated, shape=tuple(w.shape), w_hat=w_hat, params=p)
        return rep

    def update(self):
        self.stats = self.compute()
        s, p = self.stats, self.stats["params"]
        self.info.value = (f"<b>{self.matrix.value}</b> {s['shape'][0]}x{s['shape'][1]} &nbsp; "
                           f"{p['bits']}-bit {p['scheme']}, {p['granularity']}"
                           + (f" (group {p['group_size']})" if p['group_size'] else "")
                           + f", clip {p['clip_ratio']:.2f} &nbsp;|&nbsp; SQNR <b>{s['sqnr_db']:.2f} dB</b>, "
                           f"MSE {s['mse']:.3g}, max error {s['max_error']:.3g}, "
                           f"{s['n_scales']} scale(s), {s['bits_per_weight']:.3f} bits/weight (fp16 scales)")
        if self.render_enabled:
            self._render()
        return self.stats

    # --- drawing ------------------------------------------------------------------------------------
    def figure(self):
        import matplotlib.pyplot as plt
        s = self.stats
        w = self.weights[self.matrix.value].reshape(-1)
        w_hat = s["w_hat"].reshape(-1)
        fig, axes = plt.subplots(1, 3, figsize=(13, 3.4))
        ax = axes[0]
        counts, edges = torch.histogram(w, bins=200)           # one artist (stairs), not 200 bars: fast
        ax.stairs(counts.numpy(), edges.numpy(), fill=True, color="#5080c0", alpha=0.8)
        ax.set_yscale("log")
        grid = s["grid"].numpy()
        ax.vlines(grid, 0, 1, transform=ax.get_xaxis_transform(), color="#d04040", lw=0.5,
                  alpha=0.6 if len(grid) <= 64 else 0.25)
        ax.set_title(f"weights (log count) and the {len(grid)}-level grid\nof the group with the largest |w|",
                     fontsize=9)
        ax.set_xlabel("weight value")
        g = torch.Generator(device=w.device).manual_seed(self.seed)
        idx = torch.randperm(w.numel(), generator=g, device=w.device)[: self.sample]
        ax = axes[1]
        ax.scatter(w[idx].numpy(), w_hat[idx].numpy(), s=2, alpha=0.5, color="#5080c0")
        lo, hi = float(w.min()), float(w.max())
        ax.plot([lo, hi], [lo, hi], color="gray", lw=0.6)
        ax.set_title("dequantized vs original (sample)", fontsize=9)
        ax.set_xlabel("w")
        ax.set_ylabel("w_hat")
        ax = axes[2]
        counts, edges = torch.histogram(w_hat - w, bins=120)
        ax.stairs(counts.numpy(), edges.numpy(), fill=True, color="#c08040")
        ax.set_title(f"error w_hat - w: SQNR {s['sqnr_db']:.1f} dB, max |err| {s['max_error']:.3g}", fontsize=9)
        ax.set_xlabel("error")
        fig.tight_layout()
        return fig

    def _render(self):
        fig = self.figure()
        self.figure_count += 1
        show_figure(self.out, fig)

    def _ipython_display_(self):
        from IPython.display import display
        display(self.widget)

    @classmethod
    def from_model(cls, model, layer: int = 0, **kw) -> "QuantExplorer":
        """An explorer over the weight matrices of one decoder layer of a course model."""
        return cls(linear_weights(model, layer), **kw)
