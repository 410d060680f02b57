"""Measurement and performance models: timing (and timing claims), latency metrics, memory, quality, hardware,
roofline."""
from .claims import timing_claim
from .hardware import GPUS, DeviceSpec, bytes_per_element, get_gpu, gpu_names, hardware_table
from .intensity import intensity_table, prefill_decode_tables
from .notes_forms import NOTES_CLOSED_FORMS, notes_table
from .ops import NotesOp, OpCost, OpTable, matmul_cost
from .memory import format_bytes, model_weight_bytes, parameter_bytes, peak_memory
from .metrics import (Trace, TokenEvent, cost_per_million_tokens, e2e_latency, format_summary, goodput, makespan,
                      percentile, percentiles, request_metrics, summarize, tokens_per_second, tpot, ttft)
from .quality import LMScore, bits_per_byte, distinct_ngrams, perplexity, repeated_ngram_share, score_texts
from .roofline import (DecodeStep, analyze, attainable_flops, classify, critical_batch, decode_critical_batch,
                       decode_step, min_decode_latency, predict_time, ridge_point)
from .tables import format_records, format_table
from .timing import Comparison, Timing, benchmark, compare
