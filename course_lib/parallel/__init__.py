"""Module 11: tensor and pipeline parallelism on ``torch.distributed`` (gloo on a CPU, NCCL on GPUs).

    from course_lib.parallel import launch, shard_model, ModelSpec, tp_check
    launch(tp_check, world_size=2, args=(ModelSpec("tiny"),))   # TP=2 logits vs the single-process model

layers     ColumnParallelLinear, RowParallelLinear (bias added once, after the all-reduce),
           ShardedAttention (fused QKV split before sharding, GQA: K/p KV heads per rank), ShardedMLP,
           shard_fused_qkv, shard_range, parallel_mlp_reference
shard      shard_model (our Llama, sharded), parallelize_dtensor (torch.distributed.tensor.parallel),
           check_tp_degree, tp_degrees
launch     launch (spawn + gloo/NCCL + free port + timeouts; RankFailed names the rank), launch_source,
           init_from_env / main (the same workers under torchrun), free_port, loopback_ok
pipeline   gpipe_schedule, bubble_fraction, bubble_formula, split_layers, pipeline_run (a worker)
cost       ring_allreduce_bytes, allreduce_time, LINKS, tp_comm_per_token, per_gpu_memory, tp_step_time,
           time_model, notes_example (the notes' 175B on 16 GPUs, in bytes); expert parallelism:
           alltoall_bytes, alltoall_time, rank_loads, load_imbalance, ep_moe_layer_comm, ep_dispatch_rows,
           simulate_ep_dispatch; context parallelism: ring_attention_comm, ring_attention_overlap,
           simulate_ring_attention
workers    ModelSpec, tp_check, linear_pair_check, tp_timing, failing_worker, sequence (importable workers)
checks     run_on_ranks (lab 11: a student's function in a gloo group, several calls, its outputs and its
           collectives back), run_parallel_mlp, mlp_reference, attention_reference
"""
from .cost import (LINKS, Link, allreduce_time, alltoall_bytes, alltoall_time, ep_dispatch_rows, ep_moe_layer_comm,
                   gpt3_parameters, layer_parameters, load_imbalance, notes_example, per_gpu_memory, rank_loads,
                   ring_allreduce_bytes, ring_attention_comm, ring_attention_overlap, simulate_ep_dispatch,
                   simulate_ring_attention, time_model, tp_comm_per_token, tp_step_time)
from .launch import RankFailed, free_port, init_from_env, launch, launch_source, loopback_ok
from .layers import (ColumnParallelLinear, RowParallelLinear, ShardedAttention, ShardedMLP, parallel_mlp_reference,
                     shard_fused_qkv, shard_range)
from .pipeline import bubble_formula, bubble_fraction, gpipe_schedule, pipeline_run, split_layers
from .shard import check_tp_degree, parallelize_dtensor, shard_model, tp_degrees
from .workers import ModelSpec, failing_worker, linear_pair_check, sequence, torchrun_demo, tp_check, tp_timing
