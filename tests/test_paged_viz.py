"""The Module 06 visualizer: its state class, and the widget driven by setting values and clicking."""
import matplotlib

matplotlib.use("Agg")

import ipywidgets as W  # noqa: E402
import pytest  # noqa: E402

from course_lib.paged import PagedPlayground, PagingError  # noqa: E402
from course_lib.viz.paged import ALL, PagedVisualizer, draw_blocks  # noqa: E402


def test_playground_actions_and_counters():
    p = PagedPlayground(num_blocks=10, block_size=4, max_len=40, seed=1)
    a = p.add_sequence(6)
    assert p.tables()[a] == [0, 1] and p.stats()["utilization"] == 6 / 8
    b = p.fork(a)
    assert p.stats()["blocks_shared"] == 2 and p.block_owners()[0] == [a, b]
    assert p.generate(b, 1) == 1 and p.manager.cow_copies == 1
    c = p.share_prefix(a, 3)                          # prompt = a's 6 tokens + 3: one full block cached
    assert p.manager.prefix_hits == 1 and p.tables()[c][0] == p.tables()[a][0]
    p.finish(a)
    assert a not in p.sequences and p.manager.refcount(0) == 2
    p.manager.check_invariants()
    assert p.generate(None, 50) < 50 and "out of blocks" in p.last_message   # memory runs out: a message
    st = p.stats()
    assert st["contiguous_slots"] == len(p.sequences) * 40
    with pytest.raises(PagingError):
        p.finish("nope")
    assert p.add_sequence(41) is None and "max_len" in p.last_message
    p.manager.check_invariants()


def test_widget_uses_core_widgets_only():
    v = PagedVisualizer(num_blocks=8, block_size=4, plot=False)
    for w in (v.add_button, v.generate_button, v.finish_button, v.fork_button, v.share_button):
        assert type(w) is W.Button
    assert type(v.seq) is W.Dropdown and type(v.prompt_len) is W.IntSlider and type(v.num_tokens) is W.IntSlider
    assert type(v.out) is W.Output and type(v.counters) is W.HTML and type(v.message) is W.Label
    assert type(v.ui) is W.VBox


def test_widget_buttons_drive_the_state():
    v = PagedVisualizer(num_blocks=12, block_size=4, max_len=24, plot=False, seed=3)
    v.prompt_len.value = 6
    v.add_button.click()
    assert v.state.sequences == ["s0"] and v.seq.value == "s0" and "added s0" in v.message.value
    assert list(v.seq.options) == [ALL, "s0"]
    v.fork_button.click()
    assert v.seq.value == "s1" and v.state.stats()["blocks_shared"] == 2
    v.num_tokens.value = 3
    v.generate_button.click()                          # s1 writes into the shared partial block
    assert v.state.manager.num_tokens("s1") == 9 and v.state.manager.cow_copies == 1
    v.seq.value = "s0"
    v.share_button.click()
    assert v.seq.value == "s2" and v.state.manager.prefix_hits == 1
    assert "prefix-cache hits 1" in v.counters.value and "copy-on-write copies 1" in v.counters.value
    assert "s2 (8 tokens)" in v.tables.value and "<b>" in v.tables.value
    v.seq.value = ALL
    v.num_tokens.value = 2
    v.generate_button.click()                          # every sequence grows by 2
    assert [v.state.manager.num_tokens(s) for s in ("s0", "s1", "s2")] == [8, 11, 10]
    v.finish_button.click()                            # nothing selected: a message, no change
    assert "select a sequence" in v.message.value and len(v.state.sequences) == 3
    for s in ("s0", "s1", "s2"):
        v.seq.value = s
        v.finish_button.click()
    assert v.state.sequences == [] and v.state.manager.num_free_blocks == 12
    assert "utilization - (no block in use)" in v.counters.value     # not "100%" of 0 slots
    v.state.manager.check_invariants()


def test_widget_draws_blocks():
    v = PagedVisualizer(num_blocks=8, block_size=4, plot=True)
    v.add_button.click()
    assert v.figure is not None
    ax = draw_blocks(v.state)
    assert len(ax.patches) >= 8 * 4 and "physical KV blocks" in ax.get_title()
