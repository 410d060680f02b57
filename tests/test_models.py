"""The from-scratch model against Hugging Face, the bundled pair's quality, the registry, training."""
import json

import pytest
import torch

from course_lib.models import LlamaConfig, LlamaForCausalLM, bundled_path, flops_per_token, load
from course_lib.models.corpus import load_split
from course_lib.perf.quality import score_texts

transformers = pytest.importorskip("transformers")

CONFIGS = {
    "gqa-tied": dict(num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True),
    "mha-untied": dict(num_attention_heads=4, num_key_value_heads=4, tie_word_embeddings=False),
    "mqa-tied": dict(num_attention_heads=8, num_key_value_heads=1, tie_word_embeddings=True),
}


def hf_load(path):
    return transformers.AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()


@pytest.mark.parametrize("name", CONFIGS)
def test_parity_with_transformers_random_init(name, tmp_path):
    torch.manual_seed(hash(name) % 1000)
    cfg = LlamaConfig(vocab_size=320, hidden_size=64, intermediate_size=176, num_hidden_layers=3,
                      max_position_embeddings=128, rope_theta=500.0, **CONFIGS[name])
    ours = LlamaForCausalLM(cfg).eval()
    for p in ours.parameters():  # not just the init: norms and all
        p.data.add_(torch.randn_like(p) * 0.05)
    ours.save_pretrained(tmp_path)
    theirs = hf_load(tmp_path)
    ids = torch.randint(0, cfg.vocab_size, (3, 50))
    with torch.no_grad():
        diff = (ours(ids) - theirs(ids).logits).abs().max().item()
    assert diff <= 1e-4, f"{name}: max |logit difference| {diff:.2e} > 1e-4"
    # and back: our loader reads what we saved
    again = LlamaForCausalLM.from_pretrained(tmp_path)
    with torch.no_grad():
        assert torch.equal(again(ids), ours(ids))


@pytest.mark.parametrize("name", ["tiny", "tiny-draft", "tiny-draft-scratch"])
def test_parity_bundled_models(name):
    model, tok = load(name, device="cpu")
    theirs = hf_load(bundled_path(name))
    ids = torch.tensor([tok("import os\n\ndef walk(path):\n    for name in os.listdir(path):")["input_ids"]])
    with torch.no_grad():
        diff = (model(ids) - theirs(ids).logits).abs().max().item()
    assert diff <= 1e-4, f"{name}: max |logit difference| {diff:.2e}"


def test_bundled_loads_through_auto_classes_offline():
    tok = transformers.AutoTokenizer.from_pretrained(str(bundled_path("tiny")))
    text = "def f(x):\n    return {'a': [x, 1.5]}\n"
    assert tok.decode(tok(text)["input_ids"]) == text  # byte-level BPE round-trips exactly
    assert tok.eos_token_id == json.loads((bundled_path("tiny") / "config.json").read_text())["eos_token_id"]
    model = hf_load(bundled_path("tiny"))
    out = model.generate(torch.tensor([tok("import ")["input_ids"]]), max_new_tokens=5, do_sample=False)
    assert out.shape[1] > 1


def test_both_models_share_the_tokenizer():
    a = (bundled_path("tiny") / "tokenizer.json").read_bytes()
    b = (bundled_path("tiny-draft") / "tokenizer.json").read_bytes()
    assert a == b


def test_draft_costs_at_most_a_fifth_of_the_target():
    t, _ = load("tiny", device="cpu")
    d, _ = load("tiny-draft", device="cpu")
    ratio = flops_per_token(d.config) / flops_per_token(t.config)
    assert ratio <= 0.2, f"draft/target FLOPs per token = {ratio:.2f}"
    assert d.num_parameters() * 5 <= t.num_parameters()


@pytest.fixture(scope="module")
def heldout_scores():
    texts = load_split("heldout")
    out = {}
    for name in ("tiny", "tiny-draft"):
        model, tok = load(name, device="cpu")
        out[name] = score_texts(model, tok, texts, progress=False).bits_per_byte
    from course_lib.training.train import unigram_bits_per_byte
    _, tok = load("tiny", device="cpu")
    train = load_split("train", max_files=120)
    stream = torch.tensor([i for t in train for i in tok(t)["input_ids"]])
    ids = [tok(t)["input_ids"] for t in texts]
    out["unigram"] = unigram_bits_per_byte(stream, ids, len(tok), sum(len(t.encode()) for t in texts))
    return out


@pytest.mark.slow
def test_models_are_trained_not_random(heldout_scores):
    s = heldout_scores
    assert s["tiny"] <= 1.6, f"target: {s['tiny']:.3f} bits/byte on the held-out split (must be <= 1.6)"
    assert s["tiny"] < s["tiny-draft"] - 0.1, f"target {s['tiny']:.3f} must clearly beat draft {s['tiny-draft']:.3f}"
    assert s["tiny-draft"] < s["unigram"] - 0.5, f"draft {s['tiny-draft']:.3f} vs unigram {s['unigram']:.3f}"


@pytest.mark.parametrize("name", ["tiny", "tiny-draft"])
def test_models_were_trained_on_their_whole_context(name):
    """Both models declare 512 positions and were trained on 512-token windows, so a prediction late in
    the context (more text to see) is no worse than an early one. A model trained on 256-token windows
    fails this by far: on these windows the earlier bundled target scored 2.97 nats/token at positions
    64-255 and 3.73 at 256-511."""
    import torch.nn.functional as F
    model, tok = load(name, device="cpu")
    ctx = model.config.max_position_embeddings
    assert ctx == 512
    report = json.loads((bundled_path("tiny").parent / "training_report.json").read_text())
    entry = report["target" if name == "tiny" else "draft"]
    assert entry["stages"][-1]["seq_len"] == ctx, f"{name}'s last training stage used {entry['stages'][-1]} windows"
    docs = [tok(t, verbose=False)["input_ids"] for t in load_split("heldout")]
    x = torch.tensor([d[:ctx + 1] for d in docs if len(d) > ctx][:8])
    assert len(x) == 8
    with torch.no_grad():
        nll = F.cross_entropy(model(x[:, :-1]).transpose(1, 2), x[:, 1:], reduction="none")   # [8, 512]
    early, late = nll[:, 64:256].mean().item(), nll[:, 256:].mean().item()
    assert late <= early + 0.05, f"{name}: {late:.3f} nats/token at positions 256-511 vs {early:.3f} at 64-255"


def test_model_card_reports_measured_numbers():
    card = (bundled_path("tiny").parent / "MODEL_CARD.md").read_text()
    report = json.loads((bundled_path("tiny").parent / "training_report.json").read_text())
    assert f"{report['target']['bits_per_byte']:.3f}" in card
    assert f"{report['draft']['bits_per_byte']:.3f}" in card
    assert f"{report['unigram_bits_per_byte']:.3f}" in card
    assert "Context: 512 tokens" in card and "Greedy continuations of held-out prompts" in card
    for entry in (report["target"], report["draft"]):   # every greedy sample is shown in the card
        assert entry["greedy_samples"] and all(s["continuation"].rstrip() in card for s in entry["greedy_samples"])
    assert report["target"]["bits_per_byte"] <= 1.6
    # The default draft is the distilled one: its section quotes its own report, and it won on acceptance.
    distilled = json.loads((bundled_path("tiny").parent / "distill_report.json").read_text())
    for key in ("distilled", "bundled_scratch"):
        assert f"{distilled[key]['acceptance_t1']:.3f}" in card
        assert f"{distilled[key]['bits_per_byte']:.3f}" in card
    assert distilled["distilled"]["acceptance_t1"] > distilled["bundled_scratch"]["acceptance_t1"]


def _balanced(code: str) -> bool:
    pairs, stack = {")": "(", "]": "[", "}": "{"}, []
    for ch in code:
        if ch in "([{":
            stack.append(ch)
        elif ch in pairs:
            if not stack or stack.pop() != pairs[ch]:
                return False
    return not stack


def _plausible(generated: str) -> bool:
    """At least one completed, non-trivial line, and brackets balanced over the completed lines."""
    lines = generated.split("\n")[:-1]
    return any(l.strip() not in ("", "#") for l in lines) and _balanced("\n".join(lines))


@pytest.mark.slow
def test_generation_from_python_prompts_is_plausible_python():
    # Prompts: the first 40 lines of held-out files (brackets closed there). Seeded sampling at
    # temperature 0.8 / top-k 40: greedy decoding of a model this small falls into repetition loops
    # ("name, name, name, ..."), which the model card reports.
    from course_lib.generation import generate
    model, tok = load("tiny", device="cpu")
    gen = torch.Generator().manual_seed(0)
    ok = n = 0
    for text in load_split("heldout")[:12]:
        prompt = "\n".join(text.split("\n")[:40]) + "\n"
        ids = tok(prompt)["input_ids"][-200:]
        out, _ = generate(model, ids, 64, temperature=0.8, top_k=40, generator=gen)
        n += 1
        ok += _plausible(tok.decode(out))
    assert _plausible("x = f(a, [1, 2])\ny = 2\n") and not _plausible("x = f(a, [1, 2)\n")
    assert ok >= 7, f"only {ok}/{n} sampled completions are plausible Python"


def test_hub_name_falls_back_offline_with_one_line_notice(monkeypatch, capsys):
    monkeypatch.setenv("COURSE_OFFLINE", "1")
    model, tok = load("smollm2-135m", device="cpu")
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and "bundled" in out[0]
    assert model.name == "tiny-draft"


def test_bad_inputs_get_clear_errors():
    with pytest.raises(ValueError, match="unknown model"):
        load("no-such-model")
    with pytest.raises(ValueError, match="must divide"):
        LlamaConfig(hidden_size=100, num_attention_heads=3)
    with pytest.raises(ValueError, match="num_key_value_heads"):
        LlamaConfig(num_attention_heads=8, num_key_value_heads=3)
    with pytest.raises(ValueError, match="positive"):
        LlamaConfig(num_hidden_layers=0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=64,
                                         num_hidden_layers=1, num_attention_heads=4,
                                         num_key_value_heads=2, max_position_embeddings=16))
    with pytest.raises(ValueError, match="context"):
        model(torch.zeros(1, 17, dtype=torch.long))
    with pytest.raises(TypeError, match="input_ids"):
        model(torch.zeros(1, 4))
    with pytest.raises(ValueError, match="seq >= 1"):
        model(torch.zeros(1, 0, dtype=torch.long))


def test_custom_mask_and_positions_match_causal_default():
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    m = LlamaForCausalLM(cfg).eval()
    ids = torch.randint(0, 64, (2, 10))
    causal = torch.tril(torch.ones(10, 10, dtype=torch.bool))
    with torch.no_grad():
        a = m(ids)
        b = m(ids, positions=torch.arange(10), attn_mask=causal)
    assert torch.allclose(a, b, atol=1e-6)


@pytest.fixture(scope="module")
def quick_training_run(tmp_path_factory):
    """One seeded quick run of the training script, shared by the tests below (each run is ~40 s on CPU)."""
    from course_lib.training import train
    out = tmp_path_factory.mktemp("train") / "a"
    train.main(["--quick", "--out", str(out), "--threads", "1"])
    return out


@pytest.mark.slow
def test_training_script_is_deterministic(quick_training_run, tmp_path):
    from course_lib.training import train
    train.main(["--quick", "--out", str(tmp_path / "b"), "--threads", "1"])
    a = (quick_training_run / "tiny" / "model.safetensors").read_bytes()
    assert a == (tmp_path / "b" / "tiny" / "model.safetensors").read_bytes(), \
        "two seeded quick runs gave different weights"
    assert (quick_training_run / "MODEL_CARD.md").is_file()


@pytest.mark.slow
def test_training_script_resumes_a_stage_and_rewrites_the_card(quick_training_run, tmp_path):
    """--resume-target runs only the later stages from saved weights (keeping the earlier stages' record),
    and --card-only rewrites the card from the report, keeping the distilled draft's section."""
    import shutil

    from course_lib.training import train
    from course_lib.training.train import CARD_SECTION
    a, b = quick_training_run, tmp_path / "b"
    first = json.loads((a / "training_report.json").read_text())
    b.mkdir()
    shutil.copy(a / "training_report.json", b / "training_report.json")
    shutil.copytree(a / "tiny-draft-scratch", b / "tiny-draft-scratch")
    train.main(["--quick", "--only", "target", "--resume-target", str(a / "tiny"), "--resume-stages", "1",
                "--out", str(b), "--threads", "1"])
    report = json.loads((b / "training_report.json").read_text())
    stages = report["target"]["stages"]
    assert len(stages) == 2 and report["target"]["resumed_from"] == str(a / "tiny")
    assert stages[0]["train_seconds"] == first["target"]["stages"][0]["train_seconds"]   # not rerun
    assert report["draft"]["parameters"] == first["draft"]["parameters"]                   # kept
    assert (b / "tiny" / "model.safetensors").read_bytes() != (a / "tiny" / "model.safetensors").read_bytes()
    card = b / "MODEL_CARD.md"
    assert "--resume-target" in card.read_text()
    card.write_text(card.read_text() + "\n" + CARD_SECTION + "\n\nthe distilled draft's numbers\n")
    train.main(["--card-only", "--quick", "--out", str(b), "--threads", "1"])
    text = card.read_text()
    assert text.count(CARD_SECTION) == 1 and text.endswith("the distilled draft's numbers\n")
    assert "repeated 4-grams, mean over" in text


def test_distill_draft_installs_only_a_winning_draft_and_its_card_section(tmp_path):
    """--install-from copies the run's draft and report and rewrites the card's last section from the report,
    keeping the rest; the bundled card's section is exactly what the report gives. A losing draft: nothing."""
    import shutil

    from course_lib.training.distill_draft import card_section, install_draft
    from course_lib.training.train import CARD_SECTION
    bundled = bundled_path("tiny").parent
    report = json.loads((bundled / "distill_report.json").read_text())
    card = (bundled / "MODEL_CARD.md").read_text()
    assert card.count(CARD_SECTION) == 1 and card.endswith(card_section(report))
    root, run = tmp_path / "bundled", tmp_path / "run"
    (run / "tiny-draft").mkdir(parents=True)
    (run / "tiny-draft" / "config.json").write_text("{}")
    root.mkdir()
    (root / "MODEL_CARD.md").write_text(card.split(CARD_SECTION)[0] + CARD_SECTION + "\n\nan older draft\n")
    lose = json.loads(json.dumps(report))
    lose["distilled"]["acceptance_t1"] = lose["bundled_scratch"]["acceptance_t1"]
    (run / "distill_report.json").write_text(json.dumps(lose))
    with pytest.raises(ValueError, match="does not win"):
        install_draft(run, root=root)
    assert not (root / "tiny-draft").exists() and "an older draft" in (root / "MODEL_CARD.md").read_text()
    (run / "distill_report.json").write_text(json.dumps(report))
    install_draft(run, root=root)
    assert (root / "MODEL_CARD.md").read_text() == card
    assert (root / "tiny-draft" / "config.json").read_text() == "{}"
    assert json.loads((root / "distill_report.json").read_text()) == report
    shutil.rmtree(run)


@pytest.mark.slow
def test_distill_draft_quick_run(tmp_path):
    """python -m course_lib.training.distill_draft --quick: a distilled and a scratch student of the draft's shape,
    saved loadable, and a report with their held-out numbers next to the bundled scratch draft's."""
    from course_lib.training import distill_draft
    report = distill_draft.main(["--quick", "--out", str(tmp_path), "--threads", "1"])
    assert (report["steps"], report["batch"], report["seq_len"]) == (20, 4, 64)
    assert json.loads((tmp_path / "distill_report.json").read_text()) == json.loads(json.dumps(report))
    scratch_cfg = load("tiny-draft-scratch", device="cpu")[0].config
    for name, folder in (("distilled", "tiny-draft"), ("scratch", "tiny-draft-scratch")):
        r = report[name]
        assert 0 < r["acceptance_greedy"] <= 1 and 0 < r["acceptance_t1"] <= 1 and r["bits_per_byte"] > 0
        model, _ = load(str(tmp_path / folder), device="cpu")
        assert model.num_parameters() == r["parameters"]
        assert model.config.hidden_size == scratch_cfg.hidden_size
        assert model.config.num_hidden_layers == scratch_cfg.num_hidden_layers
    assert "bits_per_byte" in report["bundled_scratch"] and report["teacher_bits_per_byte"] > 0


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["tiny", "tiny-draft"])
def test_batched_full_forward_on_cuda_equals_cpu(name):
    """Windows of 256 tokens, 8 at a time, no cache (what medusa_accuracy and the training loops run): the
    logits on CUDA are the CPU's. An H100 run (torch 2.11) scored the bundled target's next-token accuracy
    on such windows 0.44 against 0.55 on a CPU; this test tells a kernel difference from a harness one."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    cpu, tok = load(name, device="cpu", verbose=False)
    gpu, _ = load(name, device="cuda", verbose=False)
    text = "\n".join(load_split("heldout", max_files=1))
    ids = torch.tensor(tok(text)["input_ids"][:8 * 256]).view(8, 256)
    with torch.no_grad():
        want, got = cpu(ids), gpu(ids.cuda()).cpu()
    agree = (got.argmax(-1) == want.argmax(-1)).float().mean().item()
    assert agree > 0.99, f"CUDA and CPU argmax agree on {agree:.3f} of the positions"
    torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-3)
