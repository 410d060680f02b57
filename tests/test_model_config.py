"""Reading a Hugging Face config.json: every key the course model does not implement is refused (a loud
ValueError naming the key), never silently ignored; what it accepts, it computes as transformers does."""
import json
import os
import re

import pytest
import torch

from course_lib.models import PRESETS, LlamaConfig, LlamaForCausalLM, as_config, bundled_path, preset

BUNDLED = sorted(p.parent.name for p in bundled_path("tiny").parent.glob("*/config.json"))

# HuggingFaceTB/SmolLM2-135M's config.json (a nanotron export: is_llama_config, rope_interleaved).
SMOLLM2_135M = {
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 0, "eos_token_id": 0, "hidden_act": "silu", "hidden_size": 576,
    "initializer_range": 0.041666666666666664, "intermediate_size": 1536, "is_llama_config": True,
    "max_position_embeddings": 8192, "model_type": "llama", "num_attention_heads": 9,
    "num_hidden_layers": 30, "num_key_value_heads": 3, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
    "rope_interleaved": False, "rope_scaling": None, "rope_theta": 100000, "tie_word_embeddings": True,
    "torch_dtype": "bfloat16", "transformers_version": "4.40.1", "use_cache": True, "vocab_size": 49152,
}


def tiny_config() -> dict:
    return json.loads((bundled_path("tiny") / "config.json").read_text())


LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192, "rope_theta": 500000.0}

DELETE = object()
# name -> (keys to change (DELETE: remove the key), the key the error must name)
REFUSED = {
    "rope_parameters llama3 (transformers 5)": ({"rope_parameters": LLAMA3_ROPE, "rope_theta": DELETE},
                                                "rope_parameters"),
    "rope_parameters yarn": ({"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4}},
                             "rope_parameters"),
    "rope_parameters default + factor": ({"rope_parameters": {"rope_type": "default", "factor": 2.0}},
                                         "rope_parameters"),
    "rope_scaling llama3 (transformers 4)": ({"rope_scaling": LLAMA3_ROPE}, "rope_scaling"),
    "rope_scaling linear (type)": ({"rope_scaling": {"type": "linear", "factor": 2.0}}, "rope_scaling"),
    "rope_theta contradicted": ({"rope_parameters": {"rope_type": "default", "rope_theta": 5e5}},
                                "rope_theta"),
    "hidden_act gelu": ({"hidden_act": "gelu"}, "hidden_act"),
    "hidden_act relu": ({"hidden_act": "relu"}, "hidden_act"),
    "sliding_window": ({"sliding_window": 4096}, "sliding_window"),
    "mistral, sliding_window absent (transformers: 4096)": ({"model_type": "mistral"}, "sliding_window"),
    "use_sliding_window": ({"use_sliding_window": True}, "use_sliding_window"),
    "layer_types sliding": ({"layer_types": ["sliding_attention"]}, "layer_types"),
    "attention_bias": ({"attention_bias": True}, "attention_bias"),
    "mlp_bias": ({"mlp_bias": True}, "mlp_bias"),
    "attention_dropout": ({"attention_dropout": 0.1}, "attention_dropout"),
    "pretraining_tp": ({"pretraining_tp": 2}, "pretraining_tp"),
    "rope_interleaved": ({"rope_interleaved": True}, "rope_interleaved"),
    "partial_rotary_factor": ({"partial_rotary_factor": 0.5}, "partial_rotary_factor"),
    "quantization_config": ({"quantization_config": {"quant_method": "bitsandbytes"}}, "quantization_config"),
    "model_type qwen2 (q/k/v biases)": ({"model_type": "qwen2"}, "model_type"),
    "model_type gpt2": ({"model_type": "gpt2"}, "model_type"),
    "unknown key": ({"qk_layernorm": True}, "qk_layernorm"),
    "unknown key, falsy": ({"logit_softcapping": None}, "logit_softcapping"),
    "missing hidden_size": ({"hidden_size": DELETE}, "hidden_size"),
    "odd head_dim": ({"head_dim": 31, "hidden_size": 124}, "head_dim"),
}


@pytest.mark.parametrize("name", REFUSED)
def test_refuses_what_it_does_not_implement(name):
    change, key = REFUSED[name]
    d = tiny_config()
    for k, v in change.items():
        if v is DELETE:
            d.pop(k, None)
        else:
            d[k] = v
    with pytest.raises(ValueError, match=re.escape(key)):
        LlamaConfig.from_hf(d)


def test_refused_at_load_too(tmp_path):
    """from_pretrained reads config.json through the same check, before touching the weights."""
    d = tiny_config()
    d["rope_parameters"] = LLAMA3_ROPE
    (tmp_path / "config.json").write_text(json.dumps(d))
    with pytest.raises(ValueError, match="rope_parameters.rope_type='llama3'"):
        LlamaForCausalLM.from_pretrained(tmp_path)


@pytest.mark.parametrize("name", BUNDLED)
def test_bundled_configs_load(name):
    cfg = LlamaConfig.from_hf(json.loads((bundled_path(name) / "config.json").read_text()))
    assert cfg.head_dim * cfg.num_attention_heads == cfg.hidden_size and cfg.tie_word_embeddings


def test_smollm2_configs_load():
    cfg = LlamaConfig.from_hf(SMOLLM2_135M)
    assert (cfg.hidden_size, cfg.num_key_value_heads, cfg.head_dim, cfg.rope_theta) == (576, 3, 64, 1e5)
    # the same saved by transformers 5: head_dim and mlp_bias stated, rope_theta nested, dtype renamed
    v5 = {k: v for k, v in SMOLLM2_135M.items() if k not in ("rope_theta", "rope_scaling", "torch_dtype")}
    v5.update(head_dim=64, mlp_bias=False, dtype="bfloat16", pad_token_id=None, transformers_version="5.0.0",
              rope_parameters={"rope_theta": 100000.0, "rope_type": "default"}, _name_or_path="x")
    assert LlamaConfig.from_hf(v5) == cfg


def test_accepts_metadata_and_neutral_values():
    d = tiny_config()
    d.update(_name_or_path="somewhere", _attn_implementation="sdpa", output_hidden_states=False,
             return_dict=True, transformers_version="5.23.0", dtype="bfloat16", hidden_act="swish",
             attention_bias=0, layer_types=["full_attention"] * d["num_hidden_layers"],
             rope_parameters={"rope_type": "default", "rope_theta": d["rope_theta"]}, sliding_window=None)
    assert LlamaConfig.from_hf(d) == LlamaConfig.from_hf(tiny_config())


def test_missing_keys_mean_transformers_defaults():
    d = tiny_config()
    for k in ("rms_norm_eps", "tie_word_embeddings", "rope_theta", "num_key_value_heads", "head_dim"):
        del d[k]
    cfg = LlamaConfig.from_hf(d)
    assert (cfg.rms_norm_eps, cfg.tie_word_embeddings, cfg.rope_theta) == (1e-6, False, 10000.0)
    assert cfg.num_key_value_heads == cfg.num_attention_heads and cfg.head_dim == 32


def test_save_pretrained_writes_a_config_its_reader_accepts(tmp_path):
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=12, max_position_embeddings=32,
                      rope_theta=321.0, tie_word_embeddings=False)
    LlamaForCausalLM(cfg).save_pretrained(tmp_path, dtype=torch.bfloat16)
    assert LlamaConfig.from_hf(json.loads((tmp_path / "config.json").read_text())) == cfg
    assert LlamaForCausalLM.from_pretrained(tmp_path).config == cfg
    # safetensors creates 0600 files; the grading sandbox's unprivileged kernel must read a retrained model
    mode = (tmp_path / "model.safetensors").stat().st_mode & 0o777
    assert mode & 0o044 == 0o044 or os.umask(os.umask(0)) & 0o044, f"model.safetensors is {oct(mode)}"


# --- oracle: what is accepted is what transformers computes ----------------------------------------------
def _hf_random(transformers, kind, **kw):
    hf_cfg = getattr(transformers, f"{kind}Config")(
        vocab_size=320, hidden_size=64, intermediate_size=176, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=128, **kw)
    model = getattr(transformers, f"{kind}ForCausalLM")(hf_cfg).eval()
    for p in model.parameters():  # not just the init: norms and all
        p.data.add_(torch.randn_like(p) * 0.05)
    return model


ORACLE = {
    # transformers 5's own config.json: nested rope_parameters, head_dim != hidden/heads, untied
    "llama, head_dim 24": ("Llama", dict(head_dim=24, rope_parameters={"rope_type": "default", "rope_theta": 500.0},
                                         tie_word_embeddings=False)),
    "llama, keys omitted": ("Llama", dict(tie_word_embeddings=False, rms_norm_eps=1e-5)),
    "mistral, no sliding window": ("Mistral", dict(sliding_window=None, rope_parameters={"rope_type": "default",
                                                                                          "rope_theta": 1e6})),
}


@pytest.mark.parametrize("name", ORACLE)
def test_accepted_configs_match_transformers(name, tmp_path):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    kind, kw = ORACLE[name]
    theirs = _hf_random(transformers, kind, **kw)
    theirs.save_pretrained(tmp_path)
    if "omitted" in name:  # both loaders then read transformers' defaults for what is missing
        d = json.loads((tmp_path / "config.json").read_text())
        for k in ("rms_norm_eps", "tie_word_embeddings", "head_dim"):
            d.pop(k)
        (tmp_path / "config.json").write_text(json.dumps(d))
        theirs = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path), dtype=torch.float32).eval()
    assert LlamaConfig.from_hf(theirs.config.to_dict()) == LlamaConfig.from_hf(
        json.loads((tmp_path / "config.json").read_text()))   # the full dict too: every key known
    ours = LlamaForCausalLM.from_pretrained(tmp_path)
    ids = torch.randint(0, 320, (2, 40))
    with torch.no_grad():
        diff = (ours(ids) - theirs(ids).logits).abs().max().item()
    assert diff <= 1e-4, f"{name}: max |logit difference| {diff:.2e}"


# --- the one shape description: presets, as_config, the KV formula ----------------------------------------
# Published parameter counts: those of the old perf/kvcache tables (HF model cards and hub metadata),
# else the size in the model's name. Falcon-7B's 7.22B counts its separately stored lm_head.
PUBLISHED_PARAMETERS = {
    "llama-2-7b": 6.738415616e9, "llama-2-13b": 13e9, "llama-2-70b": 69.0e9, "llama-3-8b": 8.030261248e9,
    "llama-3.1-8b": 8.03e9, "mistral-7b": 7.24e9, "falcon-7b": 7.22e9, "smollm2-135m": 135e6,
    "smollm2-360m": 360e6, "smollm2-1.7b": 1.7e9,
}


def test_every_preset_counts_its_published_parameters():
    assert set(PRESETS) == set(PUBLISHED_PARAMETERS), "give every new preset its published parameter count"
    for key, published in PUBLISHED_PARAMETERS.items():
        cfg = preset(key)
        assert abs(cfg.num_parameters() / published - 1) < 0.01, (key, cfg.num_parameters(), published)
    assert preset("llama-2-7b").num_parameters() == 6_738_415_616       # exact, from the checkpoint
    assert preset("Llama-3-8B").num_parameters() == 8_030_261_248
    kinds = {k: c.attention_kind for k, c in PRESETS.items()}
    assert kinds["llama-2-7b"] == "MHA" and kinds["llama-3-8b"] == "GQA" and kinds["falcon-7b"] == "MQA"


def test_smollm2_preset_is_its_config_json():
    assert preset("smollm2-135m") == LlamaConfig.from_hf(SMOLLM2_135M)


@pytest.mark.parametrize("name", ["tiny", "tiny-draft", "tiny-draft-scratch"])
def test_as_config_of_names_models_and_dicts(name):
    from_json = LlamaConfig.from_hf(json.loads((bundled_path(name) / "config.json").read_text()))
    assert as_config(name) == from_json and as_config(name).name == name
    model = LlamaForCausalLM(from_json)
    model.name = "mine"
    assert as_config(model) == from_json and as_config(model).name == "mine"
    assert as_config(from_json) is from_json
    assert as_config(from_json.to_hf()) == from_json
    with pytest.raises(ValueError, match="known"):
        as_config("gpt-5")
    with pytest.raises(TypeError, match="LlamaConfig"):
        as_config(3.5)
    with pytest.raises(ValueError, match="model_type"):
        as_config({**from_json.to_hf(), "model_type": "qwen2"})   # from_hf's refusals hold in as_config


def test_name_is_a_label_not_part_of_the_shape():
    a, b = LlamaConfig(name="a"), LlamaConfig(name="b")
    assert a == b and "name" not in a.to_hf()
    assert LlamaConfig.from_hf({**a.to_hf(), "_name_or_path": "org/m"}).name == "org/m"
    with pytest.raises(ValueError, match="unknown key 'name'"):
        LlamaConfig.from_hf({**a.to_hf(), "name": "x"})
    with pytest.raises(TypeError, match="name"):
        LlamaConfig(name=3)


@pytest.mark.parametrize("batch,T", [(1, 1), (3, 17)])
def test_kv_formula_equals_the_real_cache(batch, T):
    """The one KV formula (LlamaConfig.kv_cache_bytes) against an outside count: the bytes of the K and V
    tensors the course model actually stores in a cache after a forward of T tokens, in two dtypes."""
    from course_lib.kvcache import ContiguousCache, kv_table
    cfg = LlamaConfig(vocab_size=100, hidden_size=48, intermediate_size=64, num_hidden_layers=3,
                      num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=64)
    for dtype in (torch.float32, torch.bfloat16):
        model = LlamaForCausalLM(cfg).to(dtype).eval()
        cache = ContiguousCache()
        with torch.no_grad():
            model(torch.randint(0, cfg.vocab_size, (batch, T)), cache=cache)
        stored = sum(t.numel() * t.element_size() for t in cache.k + cache.v)
        elem = torch.finfo(dtype).bits // 8
        assert stored == cache.nbytes() == cfg.kv_cache_bytes(T, batch, elem)
        assert cfg.kv_bytes_per_token(elem) * T * batch == stored
    row = kv_table([cfg], tokens=T, batch=batch, bytes_per_element=4)[0]
    assert row["cache GiB"] * 2**30 == cfg.kv_cache_bytes(T, batch, 4)


@pytest.mark.parametrize("tie", [True, False])
def test_decode_reads_counts_what_a_decode_step_touches(tie):
    """decode_reads against an outside count: every parameter a real decode step of the course model hands to
    a torch function other than the embedding lookup (read in full), the rows that lookup gathers (left out by
    the formula: one row of D), and the keys and values its cache holds; and against Module 01's op-by-op
    table (intensity_table), which counts the same weights and the same cache reads."""
    from torch.overrides import TorchFunctionMode

    from course_lib.kvcache import ContiguousCache
    from course_lib.models.config import decode_reads
    from course_lib.perf.intensity import intensity_table

    class Reads(TorchFunctionMode):
        def __init__(self, params):
            super().__init__()
            self.params, self.full, self.rows = {id(p): p for p in params}, set(), 0

        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            touched = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor) and id(a) in self.params]
            if touched and func in (torch.nn.functional.embedding, torch.embedding):
                self.rows += args[0].numel()
            elif touched and getattr(func, "__name__", "") != "__get__":      # __get__: .dtype, .device
                self.full.update(id(t) for t in touched)
            return func(*args, **kwargs)

    cfg = LlamaConfig(vocab_size=100, hidden_size=48, intermediate_size=64, num_hidden_layers=3,
                      num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=tie)
    model = LlamaForCausalLM(cfg).eval()
    context, cache = 9, ContiguousCache()
    with torch.no_grad():
        model(torch.randint(0, cfg.vocab_size, (1, context)), cache=cache)
        reads = Reads(model.parameters())
        with reads:
            model(torch.randint(0, cfg.vocab_size, (1, 1)), cache=cache)
    full = sum(reads.params[i].numel() for i in reads.full)
    new = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim           # the new token's K and V
    cached = sum(t.numel() for t in cache.k + cache.v) - new
    assert reads.rows == 1 and decode_reads(cfg, context) == full + cached
    assert decode_reads(cfg) == cfg.num_parameters() - (0 if tie else cfg.vocab_size * cfg.hidden_size)
    for n in (1, 7, 100):
        table = intensity_table(cfg, "decode", n, dtype="fp32")                       # 4 bytes a number
        assert table.weight_bytes() / 4 - cfg.hidden_size == decode_reads(cfg)      # less the one embedding row
        assert table.kv_bytes() / 4 == decode_reads(cfg, n + 2) - decode_reads(cfg)  # + the new token, written, read
    with pytest.raises(TypeError, match="LlamaConfig"):
        decode_reads("tiny")
    with pytest.raises(ValueError, match="context"):
        decode_reads(cfg, -1)
