"""Quantization: number formats, absmax / zero-point quantization at any granularity, error metrics,
int4 packing, memory arithmetic, GGUF Q8_0/Q4_0 blocks and NF4 (module 02).

    from course_lib.quant import absmax_quantize, zeropoint_quantize, sqnr_db
    q = absmax_quantize(w, bits=4, granularity="group", group_size=128)   # q.codes, q.scale
    w_hat = q.dequantize()
    print(sqnr_db(w, w_hat))

Module 03 adds quantized linears and ``quantize_model(model, method, ...)`` (RTN W8A16/W4A16, W8A8,
LLM.int8, SmoothQuant, AWQ, GPTQ); see ``transform``.
"""
from .core import (QuantizedTensor, absmax_quantize, check_bits, check_tensor, dequantize, dequantize_codes,
                   expand_params, fake_quantize, group_sum, percentile_clip_ratio, qrange, quantize,
                   search_clip_ratio, zeropoint_quantize)
from .formats import (FORMATS, CodebookFormat, Decoded, FloatFormat, IntFormat, decode_bits, encode_bits,
                      formats_table_markdown, formats_table_rows, get_format, representable_values)
from .gguf import (describe_block, dequantize_q4_0, dequantize_q8_0, gguf_dequantize, gguf_quantize,
                   quantize_q4_0, quantize_q8_0)
from .memory import (GB, WEIGHT_FORMATS, GiB, WeightFormat, bits_per_weight, memory_table,
                     memory_table_markdown, weight_bytes)
from .metrics import DB_PER_BIT, error_report, max_error, mse, sqnr_db
from .nf4 import NF4Tensor, dynamic_map, nf4_codebook, nf4_dequantize, nf4_quantize
from .packing import pack_int4, unpack_int4

# --- module 03: quantizing LLMs (linears, calibration, LLM.int8, SmoothQuant, AWQ, GPTQ, the transform) ---
from course_lib.modules import named_linears, replace_module   # the one walker and swap (layer 1)

from .awq import AWQSearch, awq_apply, awq_scale_candidates, awq_search_group
from .calibration import (ScalingGroup, activation_absmax, capture_inputs, fold_scales, input_hessians,
                          outlier_report, scaling_groups)
from .gptq import GPTQResult, gptq_quantize, hessian, hessian_error, layer_output_error
from .linear import (QuantLinear, W8A8Linear, group_index, quantize_per_token, rtn_quantize_weight,
                     state_dict_bytes, weight_qparams)
from .llm_int8 import LLMInt8Linear, llm_int8_matmul, outlier_columns
from .smoothquant import smooth_model, smooth_scales
from .transform import (METHODS, gptq_model, group_rtn, quantize_model, to_fast_weight_only, to_fp8, to_gguf,
                        to_mixed)

_MODULE_03 = [
    "QuantLinear", "W8A8Linear", "group_index", "quantize_per_token", "rtn_quantize_weight", "state_dict_bytes",
    "weight_qparams", "ScalingGroup", "activation_absmax", "capture_inputs", "fold_scales", "input_hessians",
    "named_linears", "outlier_report", "scaling_groups", "LLMInt8Linear", "llm_int8_matmul", "outlier_columns",
    "smooth_model", "smooth_scales", "AWQSearch", "awq_apply", "awq_scale_candidates", "awq_search_group",
    "GPTQResult", "gptq_quantize", "hessian", "hessian_error", "layer_output_error", "METHODS", "gptq_model", "quantize_model",
    "replace_module", "group_rtn", "to_gguf", "to_fp8", "to_fast_weight_only", "to_mixed",
]
# module 03, part B: k-quants, FP8, QAT, sensitivity and bit allocation, fast weight-only matmuls
from .gguf import (GGUF_FORMATS, dequantize_q4_k, dequantize_q6_k, gguf_bits_per_weight, quantize_q4_k,
                   quantize_q6_k)
from .fast import (GPT_FAST_A100, Int4WeightOnlyLinear, Int8WeightOnlyLinear, decode_gemv_benchmark,
                   fast_kernels_available, int4_weight_only, int4_weight_only_mm, int8_weight_only, int8_weight_only_mm)
from .qat import QATLinear, convert_qat, fake_quantize_ste, prepare_qat, qat_finetune, rtn_quantize_linears
from .sensitivity import allocate_bits, allocation_cost, brute_force_allocation, layer_groups, sensitivity_scan
from .fp8 import FP8_MAX, FP8Linear, FP8Tensor, fp8_dequantize, fp8_error_rows, fp8_quantize, scaled_mm_available

__all__ = [
    # core
    "QuantizedTensor", "quantize", "absmax_quantize", "zeropoint_quantize", "dequantize", "dequantize_codes",
    "fake_quantize", "qrange", "check_tensor", "check_bits", "expand_params", "group_sum",
    "percentile_clip_ratio", "search_clip_ratio",
    # formats
    "FORMATS", "FloatFormat", "IntFormat", "CodebookFormat", "Decoded", "get_format", "decode_bits",
    "encode_bits", "representable_values", "formats_table_rows", "formats_table_markdown",
    # metrics
    "mse", "max_error", "sqnr_db", "error_report", "DB_PER_BIT",
    # packing and memory
    "pack_int4", "unpack_int4", "WeightFormat", "WEIGHT_FORMATS", "bits_per_weight", "weight_bytes",
    "memory_table", "memory_table_markdown", "GB", "GiB",
    # block formats
    "quantize_q8_0", "dequantize_q8_0", "quantize_q4_0", "dequantize_q4_0", "gguf_quantize",
    "gguf_dequantize", "describe_block",
    "NF4Tensor", "nf4_codebook", "dynamic_map", "nf4_quantize", "nf4_dequantize",
]
__all__ += _MODULE_03
__all__ += [  # module 03, part B
    "GGUF_FORMATS", "quantize_q4_k", "dequantize_q4_k", "quantize_q6_k", "dequantize_q6_k", "gguf_bits_per_weight",
    "FP8_MAX", "FP8Tensor", "fp8_quantize", "fp8_dequantize", "FP8Linear", "scaled_mm_available", "fp8_error_rows",
    "int8_weight_only", "int4_weight_only", "int8_weight_only_mm", "int4_weight_only_mm", "Int8WeightOnlyLinear",
    "Int4WeightOnlyLinear", "fast_kernels_available", "decode_gemv_benchmark", "GPT_FAST_A100",
    "fake_quantize_ste", "QATLinear", "prepare_qat", "convert_qat", "qat_finetune", "rtn_quantize_linears",
    "layer_groups", "sensitivity_scan", "allocate_bits", "allocation_cost", "brute_force_allocation",
]
