"""Plots and interactive widgets of the course (matplotlib + core ipywidgets, 7.7.1 and 8).

Each widget keeps its logic in a plain class that the tests drive by setting `.value` and calling
`.click()`; the widgets only display it.
"""
from .paged import PagedVisualizer, draw_blocks
from .quant import QuantExplorer, plot_bit_layout, plot_bit_layouts
from .roofline import RooflineExplorer, plot_decode_batch, plot_roofline
from .serving import ServingExplorer, plot_latency_cdf, plot_load_sweep, plot_timeline
from .speculative import SpeculativeStepper, plot_step

__all__ = ["plot_roofline", "plot_decode_batch", "RooflineExplorer", "QuantExplorer", "plot_bit_layout",
           "plot_bit_layouts", "PagedVisualizer", "draw_blocks",
           "ServingExplorer", "plot_timeline", "plot_latency_cdf", "plot_load_sweep", "SpeculativeStepper", "plot_step"]
