"""The Module 08 step-through widget: driven by clicks, it must do exactly what accept_step does."""
import matplotlib

matplotlib.use("Agg")

import ipywidgets as W  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from course_lib.models import load  # noqa: E402
from course_lib.speculative.acceptance import accept_step, probs_from_logits  # noqa: E402
from course_lib.viz.speculative import SpeculativeStepper, plot_step  # noqa: E402


@pytest.fixture(scope="module")
def pair():
    torch.manual_seed(0)
    target, tok = load("tiny", device="cpu")
    draft, _ = load("tiny-draft", device="cpu")
    return target, draft, tok


def test_core_widgets_only(pair):
    s = SpeculativeStepper(*pair, plot=False)
    assert type(s.next_button) is W.Button and type(s.reset_button) is W.Button
    assert type(s.draft_length) is W.IntSlider and type(s.temperature) is W.FloatSlider
    assert type(s.text) is W.HTML and type(s.out) is W.Output and type(s.ui) is W.VBox


def test_steps_match_accept_step_and_grow_the_text(pair):
    seed = torch.seed() % 2**31           # fresh each run; printed on failure
    s = SpeculativeStepper(*pair, prompt="def ", draft_length=3, temperature=1.0, seed=seed, plot=False)
    target, draft, tok = pair
    n0 = len(s.ids)
    for k in range(5):
        before = list(s.ids)
        s.next_button.click()
        rec = s.history[-1]
        r = rec.result
        assert len(s.ids) == len(before) + r.num_accepted + 1, seed
        assert s.ids[:len(before)] == before and s.ids[len(before):] == r.tokens
        assert r.tokens[:r.num_accepted] == rec.drafts[:r.num_accepted].tolist()
        # the same step, recomputed here: same p, q and, from the same generator state, the same decision
        with torch.no_grad():
            full = torch.tensor([before + rec.drafts.tolist()])
            p = probs_from_logits(target(full)[0, -4:], 1.0)
            q = probs_from_logits(draft(full)[0, len(before) - 1:-1], 1.0)
        torch.testing.assert_close(rec.p, p, rtol=1e-4, atol=1e-6)
        torch.testing.assert_close(rec.q, q, rtol=1e-4, atol=1e-6)
        gen = torch.Generator().set_state(rec.gen_state)
        mine = accept_step(rec.p, rec.q, rec.drafts, gen)
        assert (mine.tokens, mine.num_accepted, mine.draws, mine.bonus) == (r.tokens, r.num_accepted, r.draws, r.bonus)
        # the kinds line up with the result
        kinds = s.kinds[len(before):]
        assert kinds == ["accepted"] * r.num_accepted + ["bonus" if r.bonus else "corrected"]
    st = s.stats()
    assert st["passes"] == 5 and st["emitted"] == len(s.ids) - n0
    assert f"passes 5, emitted {st['emitted']}" in s.summary.value
    assert s.text.value.count("<span") >= len(s.ids)
    # reset: back to the prompt, same seed -> the same first step again
    first = s.history[0].result.tokens
    s.reset_button.click()
    assert s.ids == s.prompt_ids and s.history == []
    s.next_button.click()
    assert s.history[0].result.tokens == first


def test_sliders_change_the_next_step(pair):
    s = SpeculativeStepper(*pair, prompt="import ", plot=False)
    s.draft_length.value = 6
    s.temperature.value = 0.0                  # greedy verification: the output is the target's greedy text
    for _ in range(4):
        s.next_button.click()
        assert s.history[-1].drafts.numel() == 6 and s.history[-1].temperature == 0.0
    target = pair[0]
    ids = list(s.prompt_ids)
    with torch.no_grad():
        while len(ids) < len(s.ids):
            ids.append(int(target(torch.tensor([ids]))[0, -1].argmax()))
    assert ids == s.ids
    s.draft_length.value = 2
    s.next_button.click()
    assert s.history[-1].drafts.numel() == 2


def test_renders(pair):
    s = SpeculativeStepper(*pair, draft_length=4, plot=True, seed=1)
    for _ in range(3):
        s.next_button.click()
        assert s.figure is not None
        fig = plot_step(s.history[-1], pair[2])
        assert len(fig.axes) == 5                  # 4 drafted positions + the residual or bonus panel
        titles = " ".join(ax.get_title() for ax in fig.axes)
        assert ("bonus" in titles) == s.history[-1].result.bonus and "min(1,p/q)" in titles
        import matplotlib.pyplot as plt
        plt.close(fig)


def test_bad_input(pair):
    with pytest.raises(ValueError, match="both"):
        SpeculativeStepper(pair[0], None, pair[2], plot=False)
    with pytest.raises(ValueError, match="prompt"):
        SpeculativeStepper(pair[0], pair[1], pair[2], prompt=[], plot=False)


def test_run_is_passes_in_a_row_with_one_redraw(pair):
    """run(n) does what n clicks of Next step do (same seed: same tokens, same decisions), drawing once."""
    clicked = SpeculativeStepper(*pair, prompt="def ", seed=5, plot=False)
    for _ in range(4):
        clicked.next_button.click()
    ran = SpeculativeStepper(*pair, prompt="def ", seed=5, plot=True)
    draws = []
    ran.update = lambda: draws.append(len(ran.history)) or SpeculativeStepper.update(ran)
    records = ran.run(4)
    assert draws == [4], "run() must redraw once, after its last pass"
    assert records == ran.history and len(records) == 4 and ran.ids == clicked.ids
    assert [h.result.num_accepted for h in ran.history] == [h.result.num_accepted for h in clicked.history]
    assert ran.figure is not None and "passes 4" in ran.summary.value
    for bad in (0, -1, 2.0, True, "3"):
        with pytest.raises(ValueError, match="passes must be an int >= 1"):
            ran.run(bad)
    assert len(ran.history) == 4
