"""Plots and interactive widgets of the course (matplotlib + core ipywidgets, 7.7.1 and 8)."""
from .roofline import RooflineExplorer, plot_decode_batch, plot_roofline

__all__ = ["plot_roofline", "plot_decode_batch", "RooflineExplorer"]
