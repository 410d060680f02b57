"""course_lib.compile_tools: kernel counts of a decode step, fusion in inductor's code, graph breaks,
recompiles, and (GPU) launch overhead and CUDA graphs.

One inductor compile for the module (the bundled model's decode step with a 256-slot static cache: the step
``generate(compile=True)`` uses, so the notebook and this file share inductor's on-disk cache)."""
import pytest
import torch

from course_lib.compile_tools import (count_compiles, count_decode_kernels, explain_breaks, fused_kernels,
                                      kernel_calls, launch_overhead, rms_norm, silu_gate, time_decode_steps)
from course_lib.generation import generate
from course_lib.kvcache import StaticCache
from course_lib.models import LlamaForCausalLM, as_config, load


@pytest.fixture(scope="module")
def tiny(device):
    m, _ = load("tiny", device=device)
    return m.eval()


@pytest.fixture(scope="module")
def kc(tiny):
    return count_decode_kernels(tiny)


def test_compiled_step_has_far_fewer_kernels(kc, tiny):
    n_layers = tiny.config.num_hidden_layers
    # over 2x: on an H100 (torch 2.11) 291 eager CUDA launches against 105 compiled, the matmuls alike
    assert kc.eager > 2 * kc.compiled, kc.table()
    # 7 matmuls per layer + the head stay library calls; everything between them is fused
    mms = [c for c in kc.compiled_calls if c.startswith("extern_kernels.")]
    if not kc.compiled_kernels:          # CPU: counted from the generated code
        assert len(mms) >= 7 * n_layers, mms
        assert kc.eager_ops["aten::linear"] == 7 * n_layers + 1


def test_rmsnorm_and_silu_gate_are_fused(kc):
    norm = [k for k in kc.fused if all(op in k for op in ("mean", "pow", "rsqrt", "mul"))]
    gate = [k for k in kc.fused if "silu" in k and "mul" in k]
    assert norm and gate, kc.fused
    assert norm[0] in kc.code and gate[0] in kc.code


@torch.inference_mode()
def test_compiled_generation_equals_eager(tiny, kc):
    prompt = torch.randint(1, tiny.config.vocab_size, (9,)).tolist()
    a = generate(tiny, prompt, 12, compile=True).tokens.tolist()
    b = generate(tiny, prompt, 12, cache="static").tokens.tolist()
    assert a == b


def test_kernel_call_parser_on_a_known_snippet():
    code = ("cpp_fused_mul_silu_0 = async_compile.cpp_pybinding(['float*'], '''...''')\n"
            "def call(args):\n    buf0 = empty_strided_cpu((1, 4), (4, 1), torch.float32)\n"
            "    extern_kernels.mm(arg0_1, arg1_1, out=buf0)\n    cpp_fused_mul_silu_0(buf0, buf1)\n"
            "    triton_poi_fused_add_1.run(buf1, stream=stream0)\n    return (buf1, )\n")
    assert kernel_calls(code) == ["extern_kernels.mm", "cpp_fused_mul_silu_0", "triton_poi_fused_add_1"]
    assert fused_kernels(code) == ["cpp_fused_mul_silu_0"]


def _small_model():
    torch.manual_seed(0)
    cfg = as_config(dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=64))
    return LlamaForCausalLM(cfg).eval()


def test_explain_finds_the_graph_break_and_its_fix():
    m = _small_model()

    def broken(model, tok, cache):
        logits = model(tok, cache=cache)[:, -1]
        return torch.tensor([[int(logits.argmax())]])        # .item(): a graph break

    def fixed(model, tok, cache):
        return model(tok, cache=cache)[:, -1].argmax(-1, keepdim=True)

    for fn, breaks in ((broken, 1), (fixed, 0)):
        cache = StaticCache.for_model(m, 1, 32)
        with torch.inference_mode():
            m(torch.tensor([[1, 2, 3]]), cache=cache)
            ex = explain_breaks(fn, m, torch.tensor([[3]]), cache)
        assert ex["graph_break_count"] == breaks, ex
        assert ex["graph_count"] == breaks + 1
        if breaks:
            assert "item" in ex["break_reasons"][0].lower()


def test_recompiles_on_new_shapes():
    def norm(x, w):                  # a function of its own: dynamo's memory of shapes is per code object
        return rms_norm(x, w)

    def gate(a, b):
        return silu_gate(a, b)

    calls = [(torch.randn(1, n, 8), torch.ones(8)) for n in (3, 5, 7)]
    assert count_compiles(norm, calls) == 2              # static, then one dynamic graph
    assert count_compiles(gate, [(a, a) for a, _ in calls], dynamic=False) == 3


def test_launch_overhead_needs_cuda():
    with pytest.raises(ValueError, match="cuda"):
        launch_overhead("cpu")
    with pytest.raises(ValueError, match="mode"):
        time_decode_steps(_small_model(), modes=("fast",), steps=2, max_len=32)


@pytest.mark.gpu
def test_cuda_graphs_cut_launch_overhead():
    m, _ = load("tiny", device="cuda")
    per_launch = launch_overhead("cuda")
    assert 0 < per_launch < 1e-3
    t = time_decode_steps(m, modes=("eager", "compiled-no-graphs", "compiled"), steps=20)
    # a decode step of the tiny model is launch-bound: CUDA graphs (one replay) beat eager by a wide margin
    assert t["compiled"] < t["eager"] / 2, t
