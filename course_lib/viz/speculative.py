"""The speculative-decoding step-through widget of Module 08: one draft-then-verify pass per click.

    from course_lib.viz.speculative import SpeculativeStepper
    SpeculativeStepper()                      # last line of a cell: the bundled tiny / tiny-draft pair

Each *Next step* runs one pass: the draft samples g tokens from q (its own probabilities), the target
scores them in one forward (p at every drafted position plus the bonus position), and
``course_lib.speculative.accept_step`` decides, with the widget's seeded generator, so the widget shows
exactly what the library does. The plot has one panel per drafted position: bars of p (target) and q
(draft) for the top tokens, the drafted token outlined, and the draw u against min(1, p/q); then the
residual normalize(max(0, p - q)) the correction was drawn from, or p[g] for the bonus token. The text
below marks accepted drafts (green), the corrected token (orange, after the rejected draft struck
through) and the bonus token (blue).

Notation: p = target probabilities, q = draft probabilities, g = draft length.

Controls (core ipywidgets of 7.7.1 and 8): *Next step*, *Reset*, draft length (IntSlider), temperature
(FloatSlider; 0 = greedy verification). The logic is plain Python (``step``, ``run`` for several passes
with one redraw, ``reset``, ``history``); tests set ``.value`` and call ``.click()``.
"""
from __future__ import annotations

import html
from dataclasses import dataclass

import torch

from course_lib.models import load
from course_lib.speculative.acceptance import StepResult, accept_step, probs_from_logits
from ._output import show_figure

__all__ = ["SpeculativeStepper", "StepRecord", "plot_step"]

KIND_COLORS = {"prompt": "#000000", "accepted": "#1a7f37", "corrected": "#d9730d", "bonus": "#1f5fbf",
               "rejected": "#cf222e"}


@dataclass
class StepRecord:
    """One pass as the widget ran it.

    start: length of the sequence before the pass; drafts: [g] drafted tokens; q: [g, V] draft
    probabilities they were sampled from; p: [g+1, V] target probabilities; gen_state: the generator
    state just before ``accept_step`` (rerun it with this state to get the same result); result: what
    ``accept_step`` returned; temperature: the temperature used for p and q.
    """
    start: int
    drafts: torch.Tensor
    q: torch.Tensor
    p: torch.Tensor
    gen_state: torch.Tensor
    result: StepResult
    temperature: float


def _label(tokenizer, t: int) -> str:
    if tokenizer is None:
        return str(t)
    s = tokenizer.decode([int(t)])
    return repr(s)[1:-1] if s.strip() == "" or "\n" in s else s


def _bars(ax, p_row, q_row, highlight: int, tokenizer, top: int, title: str, show_q: bool = True):
    """Bars of p (and q) for the top tokens of either plus the highlighted one."""
    order = set(torch.topk(p_row, min(top, p_row.numel())).indices.tolist())
    if q_row is not None and show_q:
        order |= set(torch.topk(q_row, min(top, q_row.numel())).indices.tolist())
    order.add(int(highlight))
    toks = sorted(order, key=lambda t: -float(p_row[t]))
    x = torch.arange(len(toks), dtype=torch.float64, device="cpu")   # bar positions for matplotlib
    w = 0.4 if show_q and q_row is not None else 0.8
    pb = ax.bar((x - w / 2 if w < 0.8 else x).tolist(), [float(p_row[t]) for t in toks], width=w,
                color="#1f5fbf", label="p (target)")
    if show_q and q_row is not None:
        qb = ax.bar((x + w / 2).tolist(), [float(q_row[t]) for t in toks], width=w, color="#a0a0a0",
                    label="q (draft)")
    k = toks.index(int(highlight))
    pb[k].set_edgecolor("black")
    pb[k].set_linewidth(2)
    if show_q and q_row is not None:
        qb[k].set_edgecolor("black")
        qb[k].set_linewidth(2)
    ax.set_xticks(x.tolist())
    ax.set_xticklabels([_label(tokenizer, t) for t in toks], rotation=45, ha="right", fontsize=7)
    ax.set_ylim(0, 1.05)
    ax.set_title(title, fontsize=8)
    ax.tick_params(axis="y", labelsize=7)
    return ax


def plot_step(record: StepRecord, tokenizer=None, top: int = 5):
    """Draw one pass: a panel per drafted position, then the residual or the bonus distribution."""
    import matplotlib.pyplot as plt
    res = record.result
    g = int(record.drafts.numel())
    n = g + 1
    fig, axes = plt.subplots(1, n, figsize=(2.3 * n + 0.5, 2.6), squeeze=False)
    axes = axes[0]
    for i in range(g):
        t = int(record.drafts[i])
        name = _label(tokenizer, t)
        if i < len(res.draws):
            u, r = res.draws[i], res.ratios[i]
            verdict = "accept" if i < res.num_accepted else "REJECT"
            title = f"draft {i}: '{name}'\nu={u:.2f} {'<' if u < r else '>='} min(1,p/q)={r:.2f}: {verdict}"
        else:
            title = f"draft {i}: '{name}'\nnot tested (after a rejection)"
        _bars(axes[i], record.p[i], record.q[i], t, tokenizer, top, title)
        if i >= len(res.draws):
            axes[i].set_alpha(0.4)
            for patch in axes[i].patches:
                patch.set_alpha(0.3)
    last = res.tokens[-1]
    if res.bonus:
        _bars(axes[g], record.p[g], None, last, tokenizer, top,
              f"bonus from p[{g}]: '{_label(tokenizer, last)}'", show_q=False)
    else:
        _bars(axes[g], res.residual, None, last, tokenizer, top,
              f"residual max(0,p-q), normalized:\n'{_label(tokenizer, last)}'", show_q=False)
    axes[0].legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    return fig


class SpeculativeStepper:
    """Step through speculative decoding one pass at a time (see the module docstring).

    target, draft, tokenizer: course models sharing a tokenizer (default: load("tiny"), load("tiny-draft"));
    prompt: text (or a list of token ids); draft_length: g; temperature: for both p and q;
    seed: of the generator that draws the drafts and the acceptance coins; plot: draw the matplotlib panels.
    """

    def __init__(self, target=None, draft=None, tokenizer=None, prompt="def ", draft_length: int = 4,
                 temperature: float = 1.0, seed: int = 0, top: int = 5, plot: bool = True):
        import ipywidgets as W
        if (target is None) != (draft is None):
            raise ValueError("give both target and draft, or neither (the bundled pair)")
        if target is None:
            target, tokenizer = load("tiny", device="cpu")
            draft, _ = load("tiny-draft", device="cpu")
        if isinstance(prompt, str):
            if tokenizer is None:
                raise ValueError("prompt is text but no tokenizer was given: pass token ids or a tokenizer")
            prompt_ids = list(tokenizer.encode(prompt))
        else:
            prompt_ids = [int(t) for t in prompt]
        if not prompt_ids:
            raise ValueError("prompt must hold at least one token")
        self.target, self.draft, self.tokenizer = target, draft, tokenizer
        self.device = next(target.parameters()).device     # ids, draws and coins live where the models are
        self.prompt_ids = prompt_ids
        self.seed, self.top, self.plot = int(seed), int(top), plot
        self.figure = None
        label = {"description_width": "initial"}      # the whole label, not "draft leng..."
        self.draft_length = W.IntSlider(value=int(draft_length), min=1, max=8, description="draft length g",
                                        style=label)
        self.temperature = W.FloatSlider(value=float(temperature), min=0.0, max=1.5, step=0.1,
                                         description="temperature", style=label)
        self.next_button = W.Button(description="Next step")
        self.reset_button = W.Button(description="Reset")
        self.summary = W.HTML(value="")
        self.text = W.HTML(value="")
        self.out = W.Output()
        self.next_button.on_click(lambda _: self.step())
        self.reset_button.on_click(lambda _: self.reset())
        self.ui = W.VBox([W.HBox([self.next_button, self.reset_button, self.draft_length, self.temperature]),
                          self.summary, self.out, self.text])
        self.reset()

    # --- logic -------------------------------------------------------------------------------------
    def reset(self):
        """Back to the prompt, with the generator reseeded."""
        self.ids: list[int] = list(self.prompt_ids)
        self.kinds: list[str] = ["prompt"] * len(self.prompt_ids)
        self.rejected_before: dict[int, int] = {}   # position of a corrected token -> the draft it replaced
        self.history: list[StepRecord] = []
        self.generator = torch.Generator(device=self.device).manual_seed(self.seed)
        self.update()

    def step(self) -> StepRecord:
        """One pass: draft g tokens from q, score them with the target, run accept_step (*Next step*)."""
        rec = self._pass()
        self.update()
        return rec

    def run(self, passes: int) -> list[StepRecord]:
        """`passes` passes in a row, as that many clicks of *Next step*, drawn once at the end: a cell
        can show the stepper partway through a generation rather than at its empty start."""
        if isinstance(passes, bool) or not isinstance(passes, int) or passes < 1:
            raise ValueError(f"passes must be an int >= 1, got {passes!r}")
        records = [self._pass() for _ in range(passes)]
        self.update()
        return records

    @torch.no_grad()
    def _pass(self) -> StepRecord:
        g, temp = int(self.draft_length.value), float(self.temperature.value)
        ids = list(self.ids)
        drafts, q_rows = [], []
        for _ in range(g):      # recompute without a cache: the sequences here are short
            logits = self.draft(torch.tensor([ids + drafts], device=self.device))[0, -1]
            q = probs_from_logits(logits, temp)
            drafts.append(int(torch.multinomial(q, 1, generator=self.generator)))
            q_rows.append(q)
        logits = self.target(torch.tensor([ids + drafts], device=self.device))[0, -(g + 1):]
        p = probs_from_logits(logits, temp)                           # [g+1, V]
        q = torch.stack(q_rows)                                       # [g, V]
        drafts_t = torch.tensor(drafts, dtype=torch.long, device=self.device)
        state = self.generator.get_state()
        result = accept_step(p, q, drafts_t, self.generator)
        rec = StepRecord(len(self.ids), drafts_t, q, p, state, result, temp)
        self.history.append(rec)
        self.ids += result.tokens
        self.kinds += ["accepted"] * result.num_accepted + ["bonus" if result.bonus else "corrected"]
        if not result.bonus:
            self.rejected_before[len(self.ids) - 1] = drafts[result.num_accepted]
        return rec

    def stats(self) -> dict:
        passes = len(self.history)
        drafted = sum(len(h.result.draws) for h in self.history)
        accepted = sum(h.result.num_accepted for h in self.history)
        emitted = len(self.ids) - len(self.prompt_ids)
        return {"passes": passes, "tested": drafted, "accepted": accepted, "emitted": emitted,
                "acceptance_rate": accepted / drafted if drafted else float("nan"),
                "tokens_per_pass": emitted / passes if passes else float("nan")}

    # --- display -----------------------------------------------------------------------------------
    def text_html(self) -> str:
        parts = []
        for pos, (t, kind) in enumerate(zip(self.ids, self.kinds)):
            if pos in self.rejected_before:
                r = html.escape(_label(self.tokenizer, self.rejected_before[pos]))
                parts.append(f"<s style='color:{KIND_COLORS['rejected']}'>{r}</s>")
            s = self.tokenizer.decode([t]) if self.tokenizer is not None else f"[{t}]"
            s = html.escape(s)
            style = f"color:{KIND_COLORS[kind]}" + (";font-weight:bold" if kind in ("corrected", "bonus") else "")
            parts.append(f"<span style='{style}'>{s}</span>")
        legend = " ".join(f"<span style='color:{c}'>{k}</span>" for k, c in KIND_COLORS.items())
        return (f"<div style='font-family:monospace;white-space:pre-wrap'>{''.join(parts)}</div>"
                f"<small>{legend}</small>")

    def summary_html(self) -> str:
        st = self.stats()
        if not self.history:
            return "press <b>Next step</b>: the draft proposes g tokens, the target checks them in one pass"
        r = self.history[-1].result
        last = (f"last pass: {r.num_accepted} of {self.history[-1].drafts.numel()} drafts accepted + 1 "
                f"{'bonus' if r.bonus else 'corrected'} token = {len(r.tokens)} "
                f"token{'s' if len(r.tokens) != 1 else ''}")
        return (f"{last}<br>passes {st['passes']}, emitted {st['emitted']} tokens, tokens per pass "
                f"{st['tokens_per_pass']:.2f}, acceptance rate {st['acceptance_rate']:.2f} "
                f"({st['accepted']} of {st['tested']} tested drafts)")

    def update(self):
        self.text.value = self.text_html()
        self.summary.value = self.summary_html()
        if self.plot:
            if self.history:
                self.figure = plot_step(self.history[-1], self.tokenizer, self.top)
                show_figure(self.out, self.figure)
            else:
                show_figure(self.out, None)

    def _ipython_display_(self):
        from IPython.display import display
        display(self.ui)
