"""Reading a Hugging Face config.json: every key the course model does not implement is refused (a loud
ValueError naming the key), never silently ignored; what it accepts, it computes as transformers does."""
import json
import re

import pytest
import torch

from course_lib.models import LlamaConfig, LlamaForCausalLM, bundled_path

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
