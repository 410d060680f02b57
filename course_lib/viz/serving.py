"""Plots and the widget of Module 09 (batching and serving).

    from course_lib.viz.serving import plot_timeline, plot_latency_cdf, plot_load_sweep, ServingExplorer
    plot_timeline(result)                      # Gantt: one row per request, coloured by state
    plot_latency_cdf({"static": r1, "continuous": r2}, "ttft")
    plot_load_sweep(sweep_load(...))           # throughput and p90 latency vs offered load, per policy
    ServingExplorer()                          # policy / offered load / KV blocks -> timeline + metrics

The widget uses core ipywidgets only (Dropdown, FloatSlider, IntSlider, HTML, Output, HBox, VBox: in
7.7.1 and 8); its logic is ``ServingPlayground``, plain Python the tests drive by setting ``.value``.
"""
from __future__ import annotations

import html

from course_lib.perf.metrics import format_summary
from course_lib.perf.workload import make_workload
from course_lib.serving.policies import POLICY_NAMES, make_policy
from course_lib.serving.simulator import StepCostModel, simulate
from course_lib.validate import one_of

from ._output import show_figure

STATE_COLORS = {"waiting": "#d9d9d9", "prefill": "#ff7f0e", "decode": "#1f77b4", "preempted": "#d62728",
                "transfer": "#9467bd", "padding": "#f2c4c4"}


def plot_timeline(result, ax=None, max_requests: int = 40, t_max: float | None = None, title: str | None = None):
    """Gantt chart of the first `max_requests` requests (by arrival): one row each, a bar per state
    (waiting / prefill / decode / preempted / transfer / padding); a tick at each arrival."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch
    from matplotlib.ticker import MaxNLocator
    recs = sorted(result.records, key=lambda r: (r.start, r.rid))[:max_requests]
    if ax is None:
        _, ax = plt.subplots(figsize=(9, 0.16 * len(recs) + 1.4))
    t0 = min(r.start for r in recs)
    for row, r in enumerate(recs):
        for state, a, b in result.segments[r.rid]:
            ax.barh(row, b - a, left=a - t0, height=0.8, color=STATE_COLORS.get(state, "black"), lw=0)
        ax.plot([r.start - t0], [row], marker="|", color="black", ms=5)
    ax.set_ylim(len(recs) - 0.5, -0.5)
    ax.set_xlim(0, (t_max if t_max is not None else max(r.finish_time for r in recs) - t0) * 1.01)
    ax.set_xlabel("time since the first arrival (s)")
    ax.set_ylabel("request (by arrival)")
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))          # request 2, not 2.5
    used = {s for r in recs for s, _, _ in result.segments[r.rid]}
    # the legend sits between the title and the bars (below the axis it collided with the x label)
    ax.legend(handles=[Patch(color=c, label=s) for s, c in STATE_COLORS.items() if s in used],
              loc="lower center", bbox_to_anchor=(0.5, 1.0), fontsize=7, ncol=6, frameon=False)
    ax.set_title(title or f"{result.policy}: what each request is doing", fontsize=10, pad=18)
    return ax


def plot_latency_cdf(results: dict, metric: str = "ttft", ax=None, log: bool = True):
    """Empirical CDF of a per-request metric ('ttft', 'tpot', 'e2e') for each labelled result."""
    import matplotlib.pyplot as plt
    import numpy as np
    one_of(metric, "metric", ("ttft", "tpot", "e2e"))
    if ax is None:
        _, ax = plt.subplots(figsize=(5, 3.4))
    for label, res in results.items():
        xs = np.sort([getattr(r, metric) for r in res.records if metric != "tpot" or r.tpot is not None])
        ax.step(xs, np.arange(1, len(xs) + 1) / len(xs), where="post", label=label)
    if log:
        ax.set_xscale("log")
    for q in (0.5, 0.9, 0.99):
        ax.axhline(q, color="#bbbbbb", lw=0.6, ls=":")
    ax.set_xlabel(f"{metric.upper()} (s)")
    ax.set_ylabel("share of requests")
    ax.legend(fontsize=8)
    ax.set_title(f"{metric.upper()} distribution", fontsize=10)
    return ax


def plot_load_sweep(rows, axes=None, latency: str = "e2e_p90"):
    """Two panels from sweep_load rows: throughput (tok/s) and a latency percentile vs offered load."""
    import matplotlib.pyplot as plt
    if axes is None:
        _, axes = plt.subplots(1, 2, figsize=(10, 3.4))
    labels = list(dict.fromkeys(r["label"] for r in rows))
    for lab in labels:
        rs = sorted((r for r in rows if r["label"] == lab), key=lambda r: r["rate"])
        x = [r["rate"] for r in rs]
        axes[0].plot(x, [r["throughput_tok_s"] for r in rs], marker="o", label=lab)
        axes[1].plot(x, [r[latency] for r in rs], marker="o", label=lab)
    axes[0].set_xlabel("offered load (requests/s)")
    axes[0].set_ylabel("throughput (output tokens/s)")
    axes[1].set_xlabel("offered load (requests/s)")
    axes[1].set_ylabel(f"{latency} (s)")
    axes[1].set_yscale("log")
    axes[0].legend(fontsize=8)
    axes[0].set_title("throughput vs load", fontsize=10)
    axes[1].set_title(f"{latency.replace('_', ' ')} vs load", fontsize=10)
    return axes


class ServingPlayground:
    """The widget's state: a seeded workload at a chosen offered load, a policy, a KV block budget.

    set(policy=..., rate=..., num_blocks=...) re-runs the simulation; `.result`, `.metrics` and
    `.metrics_text` hold the outcome. Policy names: POLICY_NAMES."""

    def __init__(self, num_requests: int = 60, rate: float = 8.0, num_blocks: int = 800, block_size: int = 16,
                 policy: str = "continuous", max_batch: int = 32, seed: int = 0, cost: StepCostModel | None = None,
                 ttft_slo: float = 1.0, tpot_slo: float = 0.05, **workload_kw):
        self.num_requests, self.block_size, self.max_batch, self.seed = num_requests, block_size, max_batch, seed
        self.cost = cost or StepCostModel()
        self.ttft_slo, self.tpot_slo = ttft_slo, tpot_slo
        self.workload_kw = {"prompt_median": 256, "output_median": 96, "max_context": 1024, **workload_kw}
        self.policy, self.rate, self.num_blocks = policy, rate, num_blocks
        self.message = ""
        self.run()

    def _policy(self):
        kw = {"max_batch": self.max_batch}
        if self.policy == "static":
            kw["timeout_s"] = 2.0
        if self.policy == "chunked":
            kw["token_budget"] = 256
        return make_policy(self.policy, **kw)

    def set(self, **kw):
        for k, v in kw.items():
            if k not in ("policy", "rate", "num_blocks"):
                raise ValueError(f"set() takes policy, rate, num_blocks; got {k!r}")
            setattr(self, k, v)
        return self.run()

    def run(self):
        one_of(self.policy, "policy", POLICY_NAMES)
        self.requests = make_workload(self.num_requests, self.rate, seed=self.seed, **self.workload_kw)
        try:
            self.result = simulate(self.requests, self._policy(), cost=self.cost, num_blocks=self.num_blocks,
                                   block_size=self.block_size)
        except ValueError as e:               # e.g. a request longer than the whole KV budget
            self.result, self.metrics, self.message = None, None, str(e)
            self.metrics_text = f"cannot run: {e}"
            return None
        self.metrics = self.result.summary(self.ttft_slo, self.tpot_slo)
        self.message = ""
        self.metrics_text = (f"offered load {self.rate:g} req/s, {self.num_blocks} KV blocks of {self.block_size}\n"
                             + format_summary(self.metrics))
        return self.result


class ServingExplorer:
    """Policy dropdown, offered-load slider, KV-block slider -> the batch timeline and the metrics."""

    def __init__(self, playground: ServingPlayground | None = None, plot: bool = True, **kw):
        import ipywidgets as W
        self.state = playground or ServingPlayground(**kw)
        self.plot = plot
        self.figure = None
        label = {"description_width": "initial"}      # whole labels
        self.policy = W.Dropdown(options=list(POLICY_NAMES), value=self.state.policy, description="policy",
                                 style=label)
        self.rate = W.FloatSlider(value=self.state.rate, min=1.0, max=40.0, step=1.0, description="load (req/s)",
                                  style=label)
        self.num_blocks = W.IntSlider(value=self.state.num_blocks, min=64, max=4096, step=32, description="KV blocks",
                                      style=label)
        self.metrics = W.HTML(value="")
        self.out = W.Output()
        for w in (self.policy, self.rate, self.num_blocks):
            w.observe(self._changed, names="value")
        self.ui = W.VBox([W.HBox([self.policy, self.rate, self.num_blocks]), self.metrics, self.out])
        self.update()

    def _changed(self, _change=None):
        self.state.set(policy=self.policy.value, rate=float(self.rate.value), num_blocks=int(self.num_blocks.value))
        self.update()

    def update(self):
        self.metrics.value = "<pre>" + html.escape(self.state.metrics_text) + "</pre>"
        if self.plot and self.state.result is not None:
            self.figure = plot_timeline(self.state.result).figure
            show_figure(self.out, self.figure)

    def _ipython_display_(self):
        from IPython.display import display
        display(self.ui)


__all__ = ["plot_timeline", "plot_latency_cdf", "plot_load_sweep", "ServingPlayground", "ServingExplorer",
           "STATE_COLORS"]
