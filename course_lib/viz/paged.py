"""The PagedAttention visualizer of Module 06: physical KV blocks, block tables, sharing, waste.

    from course_lib.viz.paged import PagedVisualizer
    PagedVisualizer(num_blocks=24, block_size=4)        # last line of a cell: displays it

The physical memory is drawn as a grid of blocks, each a row of ``block_size`` slots coloured by the
sequence that owns it (a block shared by several sequences shows the owners as stripes and its reference
count; a freed block still held by the prefix cache is grey). Beside it each sequence's block table
(logical -> physical) and counters: blocks used, shared, utilization, internal waste, and what reserving
``max_len`` contiguous slots per sequence would waste.

Controls (core ipywidgets present in 7.7.1 and 8: Button, Dropdown, IntSlider, Label, HTML, Output,
HBox, VBox): *Add sequence* (prompt length slider), *Generate* (tokens slider; the selected sequence or
all), *Finish*, *Fork (CoW)*, *Share prefix* (a new request whose prompt starts with the selected
sequence's prompt). All logic lives in ``course_lib.paged.PagedPlayground``; tests set ``.value`` and
call ``.click()``.
"""
from __future__ import annotations

from course_lib.paged.playground import PagedPlayground
from ._output import show_figure

ALL = "(all)"


def _colors():
    import matplotlib.pyplot as plt
    return [plt.get_cmap("tab10")(i) for i in range(10)]


def draw_blocks(state: PagedPlayground, ax=None, columns: int = 6):
    """Draw the physical blocks of a playground on a matplotlib axis; returns the axis."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle
    mgr = state.manager
    bs, n = mgr.block_size, mgr.num_blocks
    rows = -(-n // columns)
    if ax is None:
        _, ax = plt.subplots(figsize=(0.3 * columns * (bs + 1) + 0.4, 0.3 * 1.8 * rows + 0.8))
    colors = _colors()
    owners, fill = state.block_owners(), state.block_fill()
    for b in range(n):
        r, c = divmod(b, columns)
        x0, y0 = c * (bs + 1), -r * 1.8
        own = owners[b]
        for s in range(bs):
            face = "white"
            if s < fill[b] and own:
                face = colors[state.color_index(own[0]) % 10]
            elif state.is_cached_free(b) and s < len(mgr.block_tokens[b]):
                face = "#d9d9d9"
            ax.add_patch(Rectangle((x0 + s, y0), 1, 1, facecolor=face, edgecolor="#888888", lw=0.6))
            if s < fill[b] and len(own) > 1:     # shared: stripes in the other owners' colours
                for k, o in enumerate(own[1:], start=1):
                    ax.add_patch(Rectangle((x0 + s, y0 + k / len(own)), 1, 1 / len(own),
                                           facecolor=colors[state.color_index(o) % 10], lw=0))
        label = f"#{b}" + (f" x{len(own)}" if len(own) > 1 else "") + (" cached" if state.is_cached_free(b) else "")
        ax.text(x0, y0 + 1.08, label, fontsize=7, va="bottom")
        ax.add_patch(Rectangle((x0, y0), bs, 1, fill=False, edgecolor="black", lw=1.2 if own else 0.6))
    ax.set_xlim(-0.5, columns * (bs + 1))
    ax.set_ylim(-(rows - 1) * 1.8 - 0.3, 1.8)
    ax.set_aspect("equal")
    ax.axis("off")
    ax.set_title(f"physical KV blocks ({n} x {bs} slots)", fontsize=9)
    return ax


class PagedVisualizer:
    def __init__(self, playground: PagedPlayground | None = None, plot: bool = True, **playground_kwargs):
        import ipywidgets as W
        self.state = playground or PagedPlayground(**playground_kwargs)
        self.plot = plot
        self.figure = None
        mx = self.state.max_len
        self.prompt_len = W.IntSlider(value=min(6, mx), min=1, max=mx, description="prompt len")
        self.num_tokens = W.IntSlider(value=1, min=1, max=mx, description="tokens")
        self.seq = W.Dropdown(options=[ALL], value=ALL, description="sequence")
        self.add_button = W.Button(description="Add sequence")
        self.generate_button = W.Button(description="Generate")
        self.finish_button = W.Button(description="Finish")
        self.fork_button = W.Button(description="Fork (CoW)")
        self.share_button = W.Button(description="Share prefix")
        self.message = W.Label(value="")
        self.counters = W.HTML(value="")
        self.tables = W.HTML(value="")
        self.out = W.Output()
        self.add_button.on_click(lambda _: self._act(self._add))
        self.generate_button.on_click(lambda _: self._act(self._generate))
        self.finish_button.on_click(lambda _: self._act(self._finish))
        self.fork_button.on_click(lambda _: self._act(self._fork))
        self.share_button.on_click(lambda _: self._act(self._share))
        self.ui = W.VBox([
            W.HBox([self.prompt_len, self.add_button, self.share_button]),
            W.HBox([self.seq, self.num_tokens, self.generate_button]),
            W.HBox([self.finish_button, self.fork_button, self.message]),
            W.HBox([self.out, W.VBox([self.counters, self.tables])]),
        ])
        self.update()

    # --- actions (each reads the controls, acts on the state, refreshes) ---------------------------
    def _selected(self):
        return None if self.seq.value in (ALL, None) else self.seq.value

    def _need_one(self, what):
        if self._selected() is None:
            self.state.last_message = f"select a sequence to {what}"
            return None
        return self._selected()

    def _add(self):
        sid = self.state.add_sequence(int(self.prompt_len.value))
        return sid

    def _generate(self):
        self.state.generate(self._selected(), int(self.num_tokens.value))

    def _finish(self):
        s = self._need_one("finish")
        if s is not None:
            self.state.finish(s)
            return ALL

    def _fork(self):
        s = self._need_one("fork")
        return self.state.fork(s) if s is not None else None

    def _share(self):
        s = self._need_one("share its prompt prefix with a new request")
        return self.state.share_prefix(s, 2) if s is not None else None

    def _act(self, fn):
        select = fn()
        self.update(select)

    # --- display -----------------------------------------------------------------------------------
    def counters_html(self) -> str:
        st = self.state.stats()
        return ("<b>blocks</b> used {blocks_used} / {total}, free {blocks_free}, shared {blocks_shared}, "
                "cached (free) {cached}<br><b>slots</b> {slots_filled} filled of {slots_allocated} allocated: "
                "<b>utilization {util}</b>, internal waste {waste:.0%}; {logical_tokens} tokens in the sequences<br>"
                "sharing saves {sharing_saves_blocks} "
                "blocks, prefix-cache hits {prefix_hits}, copy-on-write copies {cow_copies}<br>"
                "contiguous (max_len={max_len} per sequence) would reserve {contiguous_slots} slots: waste "
                "{cwaste:.0%}").format(total=self.state.manager.num_blocks,
                                        # 0 of 0 slots is no utilization at all, not 100%
                                        util=(f"{st['utilization']:.0%}" if st["slots_allocated"]
                                              else "- (no block in use)"),
                                        waste=st["internal_waste"], max_len=self.state.max_len,
                                        cwaste=st["contiguous_waste"], cached=sum(
                                            1 for b in range(self.state.manager.num_blocks)
                                            if self.state.is_cached_free(b)), **st)

    def tables_html(self) -> str:
        import matplotlib.colors as mc
        colors = _colors()
        rows = []
        for s, table in self.state.tables().items():
            col = mc.to_hex(colors[self.state.color_index(s) % 10])
            cells = " ".join(f"<b>{b}</b>" if self.state.manager.refcount(b) > 1 else str(b) for b in table)
            rows.append(f"<span style='color:{col}'>&#9632;</span> {s} ({self.state.manager.num_tokens(s)} "
                        f"tokens): [{cells}]")
        return "<b>block tables</b> (logical -> physical; bold = shared)<br>" + ("<br>".join(rows) or "none")

    def update(self, select=None):
        seqs = self.state.sequences
        self.seq.options = [ALL] + seqs
        if select is not None and select in self.seq.options:
            self.seq.value = select
        elif self.seq.value not in self.seq.options:
            self.seq.value = ALL
        self.message.value = self.state.last_message
        self.counters.value = self.counters_html()
        self.tables.value = self.tables_html()
        if self.plot:
            self.figure = draw_blocks(self.state).figure
            show_figure(self.out, self.figure)

    def _ipython_display_(self):
        from IPython.display import display
        display(self.ui)


__all__ = ["PagedVisualizer", "draw_blocks"]
