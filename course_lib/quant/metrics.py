"""How wrong is a quantized tensor: MSE, max error, SQNR (dB), and a one-call report.

SQNR (signal-to-quantization-noise ratio) = 10 log10( sum x^2 / sum (x - x_hat)^2 ) in dB. Each extra bit
halves the step size, quarters the noise power, and adds 20 log10(2) = 6.02 dB.
"""
from __future__ import annotations

import math

import torch

__all__ = ["mse", "max_error", "sqnr_db", "error_report", "DB_PER_BIT"]

DB_PER_BIT = 20 * math.log10(2)  # 6.0206 dB


def _pair(x, x_hat):
    for name, t in (("x", x), ("x_hat", x_hat)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.is_complex():
            raise TypeError(f"{name} must be real, got dtype {t.dtype}")
    if x.shape != x_hat.shape:
        raise ValueError(f"x and x_hat must have the same shape, got {tuple(x.shape)} and {tuple(x_hat.shape)}")
    if x.numel() == 0:
        raise ValueError("x is empty: no error to measure")
    return x.double(), x_hat.to(x.device).double()


def mse(x: torch.Tensor, x_hat: torch.Tensor) -> float:
    """Mean squared error."""
    a, b = _pair(x, x_hat)
    return float(((a - b) ** 2).mean())


def max_error(x: torch.Tensor, x_hat: torch.Tensor) -> float:
    """Largest absolute error."""
    a, b = _pair(x, x_hat)
    return float((a - b).abs().max())


def sqnr_db(x: torch.Tensor, x_hat: torch.Tensor) -> float:
    """Signal-to-quantization-noise ratio in dB. ``inf`` for a perfect reconstruction (no noise);
    ``-inf`` for a zero signal reconstructed with noise."""
    a, b = _pair(x, x_hat)
    signal = float((a ** 2).sum())
    noise = float(((a - b) ** 2).sum())
    if noise == 0.0:
        return math.inf
    if signal == 0.0:
        return -math.inf
    return 10 * math.log10(signal / noise)


def error_report(x: torch.Tensor, x_hat: torch.Tensor) -> dict:
    """{"mse", "rmse", "max_error", "sqnr_db", "rel_rmse"} in one call."""
    m = mse(x, x_hat)
    rms = float(x.double().pow(2).mean().sqrt())
    return {"mse": m, "rmse": math.sqrt(m), "max_error": max_error(x, x_hat), "sqnr_db": sqnr_db(x, x_hat),
            "rel_rmse": math.sqrt(m) / rms if rms > 0 else math.inf}
