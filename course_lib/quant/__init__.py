"""Quantization (modules 02 and 03). This face holds what the notebooks and labs use; the rest is imported
from its submodule, one per technique: ``formats``, ``core``, ``metrics``, ``packing``, ``memory``, ``gguf``,
``nf4``, ``mx`` (module 02); ``linear``, ``calibration``, ``llm_int8``, ``smoothquant``, ``awq``, ``gptq``,
``transform`` (``quantize_model`` and the ``to_*`` swaps), ``fp8``, ``fast``, ``qat``, ``sensitivity`` (module 03).

    from course_lib.quant import absmax_quantize, zeropoint_quantize, sqnr_db
    q = absmax_quantize(w, bits=4, granularity="group", group_size=128)   # q.codes, q.scale
    w_hat = q.dequantize()
    print(sqnr_db(w, w_hat))
"""
# number formats: bit layouts and the values each can hold
from .formats import (FORMATS, decode_bits, encode_bits, formats_table_markdown, get_format,
                      representable_values)
# quantizing a tensor: absmax / zero-point at any granularity, clipping
from .core import (absmax_quantize, fake_quantize, percentile_clip_ratio, qrange, quantize, search_clip_ratio,
                   zeropoint_quantize)
# how much was lost
from .metrics import DB_PER_BIT, mse, sqnr_db
# int4 packing and the memory a model's weights take
from .packing import pack_int4, unpack_int4
from .memory import memory_table, memory_table_markdown, weight_bytes
# block formats: GGUF Q8_0 / Q4_0 and the k-quants, NF4
from .gguf import (describe_block, dequantize_q4_0, dequantize_q8_0, gguf_bits_per_weight, gguf_dequantize,
                   gguf_quantize, quantize_q4_0, quantize_q8_0)
from .nf4 import nf4_codebook, nf4_quantize
# microscaling FP4: MXFP4 (OCP MX v1.0) and NVFP4
from .mx import mxfp4_quantize, nvfp4_quantize
# module 03, quantized linears and their weight layout
from .linear import QuantLinear, W8A8Linear, group_index, rtn_quantize_weight, state_dict_bytes, weight_qparams
from .llm_int8 import LLMInt8Linear
# calibration: which linears, their inputs, outliers, the groups that share an input, Hessians
from course_lib.modules import named_linears   # the one walker (layer 1)
from .calibration import activation_absmax, capture_inputs, input_hessians, outlier_report, scaling_groups
# SmoothQuant, AWQ, GPTQ, and the whole-model transform
from .smoothquant import smooth_model, smooth_scales
from .awq import awq_scale_candidates, awq_search_group
from .gptq import gptq_quantize, hessian, hessian_error, layer_output_error
from .transform import quantize_model
# FP8 error, sensitivity and bit allocation, the fast weight-only matmuls' benchmark
from .fp8 import fp8_error_rows
from .sensitivity import allocate_bits, allocation_cost, layer_groups
from .fast import GPT_FAST_A100, decode_gemv_benchmark

__all__ = ["FORMATS", "get_format", "decode_bits", "encode_bits", "representable_values", "formats_table_markdown",
           "quantize", "absmax_quantize", "zeropoint_quantize", "fake_quantize", "qrange", "percentile_clip_ratio",
           "search_clip_ratio", "mse", "sqnr_db", "DB_PER_BIT", "pack_int4", "unpack_int4", "weight_bytes",
           "memory_table", "memory_table_markdown", "quantize_q8_0", "dequantize_q8_0", "quantize_q4_0",
           "dequantize_q4_0", "describe_block", "gguf_quantize", "gguf_dequantize", "gguf_bits_per_weight",
           "nf4_codebook", "nf4_quantize", "mxfp4_quantize", "nvfp4_quantize", "QuantLinear", "W8A8Linear",
           "LLMInt8Linear", "weight_qparams", "rtn_quantize_weight", "group_index", "state_dict_bytes",
           "capture_inputs", "activation_absmax", "outlier_report", "scaling_groups", "input_hessians",
           "smooth_scales", "smooth_model", "awq_scale_candidates", "awq_search_group", "hessian", "hessian_error",
           "gptq_quantize", "layer_output_error", "quantize_model", "fp8_error_rows", "layer_groups",
           "allocate_bits", "allocation_cost", "GPT_FAST_A100", "decode_gemv_benchmark"]
