"""The main screen's parts: an output pane per mode, the live stats pane, the history panel."""

from __future__ import annotations

import re

from rich.style import Style
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.geometry import Region, Size
from textual.scroll_view import ScrollView
from textual.selection import Selection
from textual.strip import Strip
from textual.css.query import NoMatches
from textual.widgets import DataTable, Static

from speclocal.engine.types import MemoryParts
from speclocal.formatting import fmt_bytes, fmt_count, fmt_num as fmt
from speclocal.options import default
from speclocal.tui.history import LiveMode, RunRecord, summarize_by_task

ACCEPTED_FALLBACK = "#4EBF71"
# auto mode colours each accepted draft token by its draft's source (the theme colour named, or this fallback);
# other modes colour every accepted draft token as "model" does, except the suffix drafter's from its store
SOURCE_COLOURS = {"model": ("success", ACCEPTED_FALLBACK), "lookup": ("primary", "#0178D4"),
                  "suffix": ("warning", "#FFA62B"), "store": ("error", "#BA3C5B")}


BARS = "▁▂▃▄▅▆▇█"
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f]")  # model output may hold any byte; never send it raw


def add_pieces(paras: list[Text], pieces: list[tuple[str, Style | None]]) -> None:
    """Append styled pieces to the last paragraph; each newline starts a new one. Carriage returns
    go, other control characters show as U+FFFD."""
    for piece, style in pieces:
        parts = _CONTROL.sub("\ufffd", piece.replace("\r\n", "\n").replace("\r", "")).split("\n")
        paras[-1].append(parts[0], style)
        paras.extend(Text(part, style=style or "") for part in parts[1:])


def sparkline(values: list[float], width: int, top: float) -> str:
    """One character per value on a 0..top scale (shared by both modes, so bar heights compare);
    more values than `width` are averaged in groups so the whole run fits."""
    if not values or top <= 0:
        return ""
    if len(values) > width:
        groups = [values[i * len(values) // width:(i + 1) * len(values) // width] for i in range(width)]
        values = [sum(g) / len(g) for g in groups if g]
    return "".join(BARS[min(len(BARS) - 1, max(0, round(v / top * (len(BARS) - 1))))] for v in values)


class TokenView(ScrollView, can_focus=False):
    """Streamed text as wrapped lines (Textual's Line API). Appending re-wraps only the last
    paragraph and repaints only the lines that changed; the scrollbar is always shown, so the text
    outgrowing the pane mid-run does not lay the screen out again (three layouts, UI CPU taken from
    decoding), and drawing stays cheap while the model decodes.

    Text that outgrows the pane scrolls a quarter of the pane at a time, not line by line (xterm's
    "jump scroll"): the view keeps up to that many blank rows below the last line, so most new lines
    repaint one row instead of every row of the pane and its scrollbar."""

    ALLOW_SELECT = True
    DEFAULT_CSS = """
    TokenView { overflow-x: hidden; overflow-y: scroll; }
    """

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._paras: list[Text] = [Text()]
        self._starts: list[int] = [0]  # index in _lines of each paragraph's first line
        self._lines: list[Strip] = []
        self._plain: list[str] = []
        self._width = 0
        self._end_y = 0  # max_scroll_y after the last re-wrap: scrolled to it = following the stream

    def set_paragraphs(self, paras: list[Text]) -> None:
        """Replace everything (header, body, note)."""
        self._paras = paras or [Text()]
        self._rewrap(0)

    def extend_last(self, pieces: list[tuple[str, Style | None]]) -> None:
        """Append styled pieces to the last paragraph; a newline starts a new one."""
        first = len(self._paras) - 1
        add_pieces(self._paras, pieces)
        self._rewrap(first, appended=True)

    def _rewrap(self, first: int, at_end: bool | None = None, appended: bool = False) -> None:
        """Wrap paragraphs `first`.. again and repaint their lines; `appended`: only text was added at the
        end, so the lines that read as before are drawn as before and are not repainted."""
        width = self.scrollable_content_region.width if self.is_mounted else 0
        if width <= 0:
            self._lines, self._plain, self._starts = [], [], [0] * len(self._paras)
            return
        if width != self._width:
            self._width, first, appended = width, 0, False
        at_end = self.is_vertical_scroll_end if at_end is None else at_end
        cut = self._starts[first] if first < len(self._starts) else len(self._lines)
        before = self._plain[cut:] if appended else []
        del self._lines[cut:], self._plain[cut:], self._starts[first:]
        console = self.app.console
        for para in self._paras[first:]:
            self._starts.append(len(self._lines))
            for line in para.wrap(console, width, overflow="fold", no_wrap=False):
                line.rstrip_end(width)
                self._lines.append(Strip(line.render(console), line.cell_len))
                self._plain.append(line.plain)
        self._set_virtual_size(Size(width, self._scroll_height(len(self._lines))))
        same = 0  # leading lines of the re-wrapped part that read as before
        for old, new in zip(before, self._plain[cut:]):
            if old != new:
                break
            same += 1
        self.refresh_lines(cut + same, max(len(self._lines) - cut - same, 1))
        if at_end:
            self.scroll_end(animate=False, immediate=True, x_axis=False, force=True)
        self._end_y = self.max_scroll_y

    def refresh_lines(self, y_start: int, line_count: int = 1) -> None:
        """Repaint text lines, not the scrollbar beside them (ScrollView's spans the scrollbar's column)."""
        self.refresh(Region(0, y_start - self.scroll_offset.y, self.scrollable_content_region.width, line_count))

    def _scroll_height(self, n: int) -> int:
        """The virtual height for `n` lines: the pane's height while they fit (so the scrollbar does not
        change with every line), else `n` plus up to a quarter of the pane of blank rows, kept until the
        lines fill them (see the class docstring)."""
        view = self.scrollable_content_region.height
        if n <= view:
            return view
        slack = max(1, (view + 2) // 4)
        current = self.virtual_size.height
        return current if n <= current < n + slack else n + slack - 1

    def _set_virtual_size(self, size: Size) -> None:
        """A new line updates the scrollbar in place (Textual's `_scroll_update`, what a layout would
        do for this widget), not by laying the screen out again."""
        if size == self.virtual_size:
            return
        if not self.container_size:
            self.virtual_size = size
        else:
            self.set_reactive(TokenView.virtual_size, size)
            self._scroll_update(size)

    def on_resize(self) -> None:
        # decide "following" by the old geometry: after a shrink the old end is no longer the end
        self._rewrap(0, at_end=self.scroll_y >= self._end_y)

    def render_line(self, y: int) -> Strip:
        scroll_x, scroll_y = self.scroll_offset
        index = scroll_y + y
        width = self.size.width
        style = self.rich_style
        if index >= len(self._lines):
            return Strip.blank(width, style)
        strip = self._lines[index]
        selection = self.text_selection
        if selection is not None and (span := selection.get_span(index)) is not None:
            start, end = span
            text = Text(self._plain[index])
            text.stylize(self.screen.get_component_rich_style("screen--selection"), start,
                         len(text) if end == -1 else end)
            strip = Strip.join([strip.crop(0, start), Strip(text.render(self.app.console)).crop(
                start, len(text) if end == -1 else end), strip.crop(len(text) if end == -1 else end)])
        return strip.apply_style(style).crop_extend(scroll_x, scroll_x + width, style).apply_offsets(scroll_x, index)

    def runs_in_style(self, style: Style) -> list[str]:
        """The drawn texts of consecutive segments in `style` (runs continue across wrapped lines)."""
        runs, current = [], None
        for strip in self._lines:
            for seg in strip:
                if seg.style == style:
                    current = (current or "") + seg.text
                elif current is not None and seg.text.strip():
                    runs.append(current)
                    current = None
        return runs + ([current] if current is not None else [])

    def get_selection(self, selection: Selection) -> tuple[str, str] | None:
        return selection.extract("\n".join(self._plain)), "\n"

    def selection_updated(self, selection: Selection | None) -> None:
        self.refresh()


class OutputPane(Vertical):
    """Streaming text of one mode. Accepted draft tokens are coloured when `color_drafts` is on."""

    DEFAULT_CSS = """
    OutputPane { height: 1fr; }
    """

    def __init__(self, title: str, *, id: str, color_drafts: bool = True):
        super().__init__(id=id, classes="output-pane")
        self.border_title = title
        self.color_drafts = color_drafts
        self.accepted_style = Style(color=ACCEPTED_FALLBACK)
        self.source_styles: dict[str, Style] = {src: Style(color=c) for src, (_, c) in SOURCE_COLOURS.items()}
        self.by_source = False  # auto mode: a colour per draft source
        self.legend: list[tuple[str, str]] = []  # (label, source) pairs shown under the header of a run
        self._segments: list[tuple[str, str | None]] = []  # piece, its draft's source if accepted ("" unknown)
        self._header = ""
        self._note = ""
        self.n_tokens = 0
        self.n_from_draft = 0

    def compose(self) -> ComposeResult:
        yield TokenView(classes="output-text")

    @property
    def text(self) -> str:
        return "".join(s for s, _ in self._segments)

    @property
    def _view(self) -> TokenView:
        return self.query_one(TokenView)

    def begin(self, header: str = "") -> None:
        self._segments.clear()
        self._header = header
        self._note = ""
        self.n_tokens = self.n_from_draft = 0
        self._rebuild()

    def clear(self) -> None:
        self.begin("")
        self.border_subtitle = ""

    def append(self, pieces: list[str], from_draft: list[bool], sources: list[str | None] | None = None) -> None:
        """Stream pieces; `sources`: each accepted draft token's draft source (None: not known)."""
        sources = sources or [None] * len(pieces)
        keys = [(src or "") if f else None for f, src in zip(from_draft, sources)]
        self._segments.extend(zip(pieces, keys))
        self.n_tokens += len(pieces)
        self.n_from_draft += sum(from_draft)
        if self._note:
            self._rebuild()
        else:
            self._view.extend_last([(p, self._style(k)) for p, k in zip(pieces, keys)])

    def note(self, text: str) -> None:
        """A dim line after the output (e.g. what auto mode chose and why, or why the run failed)."""
        self._note = text
        self._rebuild()

    @property
    def note_text(self) -> str:
        return self._note

    def set_color_drafts(self, on: bool) -> None:
        if on != self.color_drafts:
            self.color_drafts = on
            self._rebuild()

    def _style(self, key: str | None) -> Style | None:
        """The style of a piece: None if not an accepted draft token (or colouring is off); by source in auto
        mode and for the suffix drafter's store; the accepted style otherwise."""
        if key is None or not self.color_drafts:
            return None
        if self.by_source and key in self.source_styles:
            return self.source_styles[key]
        return self.source_styles["store"] if key == "store" else self.accepted_style

    def _rebuild(self) -> None:
        paras = [Text(line, "dim italic") for line in self._header.split("\n")] if self._header else []
        if self._header and self.legend and self.color_drafts:
            key = Text("accepted drafts from ", "dim italic")
            for i, (label, src) in enumerate(self.legend):
                key.append(("· " if i else "") + label + " ", self._style(src) or "")
            paras.append(key)
        paras.append(Text())
        add_pieces(paras, [(p, self._style(f)) for p, f in self._segments])
        if self._note:
            paras += [Text()] + [Text(line, "dim italic") for line in self._note.split("\n")]
        try:
            self._view.set_paragraphs(paras)
        except NoMatches:  # not mounted yet: on_mount draws it
            pass

    def on_mount(self) -> None:
        self._rebuild()

    def coloured_spans(self, source: str | None = None) -> list[str]:
        """Texts drawn in the accepted-draft style, or in `source`'s colour, as the view holds them (tests)."""
        return self._view.runs_in_style(self.accepted_style if source is None else self.source_styles[source])


class StatsPane(Vertical):
    """Tokens/s now and average per mode with a sparkline, speculation numbers, RAM."""

    def compose(self) -> ComposeResult:
        yield Static(id="stats-head", markup=False)
        with Horizontal(classes="mode-row", id="row-plain"):
            yield Static(classes="mode-label", id="label-plain", markup=False)
            yield Static(id="spark-plain", classes="spark", markup=False)
        with Horizontal(classes="mode-row", id="row-spec"):
            yield Static(classes="mode-label", id="label-spec", markup=False)
            yield Static(id="spark-spec", classes="spark", markup=False)
        yield Static(id="stats-spec", markup=False)
        yield Static(id="stats-ram", markup=False)

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._shown: dict[str, str] = {}
        self._last: dict = {}

    def on_mount(self) -> None:
        self.border_title = "Live stats"
        self.show(**(self._last or dict(live={}, spec_mode="spec", lengths=f"k={default('draft_max')}", memory=None,
                                          rss=None, peak=None, available=None)))

    def on_resize(self) -> None:
        self.set_class(self.size.height >= 17, "-tall")
        if self._last:
            self.show(**self._last)

    def show(self, *, live: dict[str, LiveMode], spec_mode: str | None, lengths: str, memory, rss: int | None,
             peak: int | None, available: int | None, store: dict | None = None) -> None:
        """`store`: the suffix store's size after the latest generation that used it (shown for suffix, auto)."""
        self._last = dict(live=live, spec_mode=spec_mode, lengths=lengths, memory=memory, rss=rss, peak=peak,
                          available=available, store=store)
        try:
            self._show(live, spec_mode, lengths, memory, rss, peak, available, store)
        except NoMatches:  # children not mounted yet: on_mount shows the last numbers
            pass

    def _show(self, live, spec_mode, lengths, memory, rss, peak, available, store=None) -> None:
        tall = self.has_class("-tall")
        plain = live.get("plain")
        spec = live.get(spec_mode) if spec_mode else None
        self._show_rates(plain, spec, spec_mode, lengths)
        self._set("#stats-spec", "\n".join(_spec_lines(plain, spec, spec_mode, store, tall)))
        self._set("#stats-ram", "\n".join(_ram_lines(memory, rss, peak, available, tall)))

    def _show_rates(self, plain: LiveMode | None, spec: LiveMode | None, spec_mode: str | None, lengths: str) -> None:
        """The tokens/s rows: now, average, time to first token and the sparkline of each mode."""
        self._set("#stats-head", f"{'':14}{'now':>7}{'avg':>7}{'TTFT':>8}  tokens/s over the run (same scale)")
        spec_name = f"{spec_mode.capitalize()} {lengths}" if spec_mode else "Spec off"
        series = {"plain": plain.spark() if plain else [], "spec": spec.spark() if spec else []}
        top = max((max(v) for v in series.values() if v), default=0.0)
        for key, name, lm in (("plain", "Plain", plain), ("spec", spec_name, spec)):
            mark = "▶ " if lm is not None and lm.running else "  "
            if lm is None:
                line = f"{mark}{name:<12}{'-':>7}{'-':>7}{'-':>8}  "
            else:
                ttft = lm.ttft()
                line = (f"{mark}{name:<12}{fmt(lm.tps_now(), '.1f'):>7}{fmt(lm.tps_avg(), '.1f'):>7}"
                        f"{(fmt(ttft, '.2f') + 's') if ttft is not None else '-':>8}  ")
            self._set(f"#label-{key}", line)
            spark = self.query_one(f"#spark-{key}", Static)
            self._set(f"#spark-{key}", sparkline(series[key], max(spark.size.width, 1), top))

    def _set(self, selector: str, text: str) -> None:
        """Update a Static only when its text changes, and lay the screen out again only when its
        line count changes (no needless redraws while decoding)."""
        before = self._shown.get(selector)
        if before != text:
            self._shown[selector] = text
            same_lines = before is not None and before.count("\n") == text.count("\n")
            self.query_one(selector, Static).update(text, layout=not same_lines)


def _spec_lines(plain: LiveMode | None, spec: LiveMode | None, spec_mode: str | None, store: dict | None,
                tall: bool) -> list[str]:
    """The speculation numbers: speedup, acceptance, tokens per main pass, draft share, the suffix store's size."""
    p_avg = plain.tps_avg() if plain else None
    s_avg = spec.tps_avg() if spec else None
    speedup = s_avg / p_avg if p_avg and s_avg else None
    done = plain is not None and spec is not None and plain.result is not None and spec.result is not None
    e2e = spec.result.e2e_speedup_over(plain.result) if done else None
    acc = spec.acceptance() if spec else None
    counts = f" ({spec.accepted}/{spec.drafted})" if spec is not None and spec.drafted else ""
    if spec is not None and spec.result is not None:
        counts = f" ({spec.result.n_accepted}/{spec.result.n_drafted})" if spec.result.n_drafted else ""
    tpp = spec.tokens_per_pass() if spec else None
    share = spec.draft_share() if spec else None
    waited = {k: lm.result.t_total if lm is not None and lm.result is not None else None
              for k, lm in (("plain", plain), ("spec", spec))}
    auto = spec.result.auto if spec is not None and spec.result is not None else None
    if tall:
        lines = [
            # every line fits the pane's 42 columns on a 120-column screen (a wrapped one hides the last)
            f"speedup          {fmt(speedup, '.2f', 'x')}   end to end {fmt(e2e, '.2f', 'x')}",
            f"waited (e2e)     {fmt(waited['spec'], '.1f', 's')}   plain {fmt(waited['plain'], '.1f', 's')}",
            f"acceptance       {fmt(acc, '.0%')}{counts}",
            f"tokens/main pass {fmt(tpp, '.2f')}",
            f"draft time share {fmt(share, '.0%')}",
        ]
        if auto is not None and "draft_model_brought_in" in auto:  # auto with a draft model loaded
            lines.append("draft model      " + (
                f"in, read {fmt_count(spec.result.draft_prompt_tokens)} prompt tok"
                if auto["draft_model_brought_in"] else "not brought in"))
    else:
        lines = [f"speedup {fmt(speedup, '.2f')}{'x' if speedup else ''} (e2e {fmt(e2e, '.2f')}"
                 f"{'x' if e2e else ''})  accept {fmt(acc, '.0%')}{counts}  "
                 f"{fmt(tpp, '.1f')} tok/pass  draft {fmt(share, '.0%')}"]
    if store is not None and spec_mode in ("suffix", "auto"):
        size = f"{fmt_count(store['tokens'])} tokens · {fmt_bytes(store['bytes'])}"
        lines.append(f"suffix store     {size}" if tall else f"suffix store {size} ({store['generations']} runs)")
    return lines


def _ram_lines(memory: MemoryParts | None, rss: int | None, peak: int | None, available: int | None,
               tall: bool) -> list[str]:
    """The memory lines: speclocal's RSS and peak, each model's weights and KV cache, what the system has."""
    m = memory
    draft_cost = (m.draft_weights + m.draft_kv) if m is not None else None
    if tall:
        ram = [
            "RAM",
            f"process RSS      {fmt_bytes(rss):>9}   peak {fmt_bytes(peak)}",
            f"main weights     {fmt_bytes(m.main_weights if m else None):>9}",
            f"main KV cache    {fmt_bytes(m.main_kv if m else None):>9}",
            f"draft weights    {fmt_bytes(m.draft_weights if m else None):>9}",
            f"draft KV cache   {fmt_bytes(m.draft_kv if m else None):>9}",
            f"the draft costs  {fmt_bytes(draft_cost):>9}"
            + (f"   ({draft_cost / (m.main_weights + m.main_kv):.0%} of main)" if m and m.main_weights else ""),
            f"system available {fmt_bytes(available):>9}",
        ]
        # every buffer llama.cpp allocated (compute and output too) on each device: the host's RAM or a GPU's
        ram += [f"held on {where:<9}{fmt_bytes(main + draft):>9}" + (f"   draft {fmt_bytes(draft)}" if draft else "")
                for where, (main, draft) in (m.per_device().items() if m else ())]
    else:
        ram = [
            f"RAM  process {fmt_bytes(rss)} · peak {fmt_bytes(peak)} · available {fmt_bytes(available)}",
            f"     main {fmt_bytes(m.main_weights if m else None)} + KV {fmt_bytes(m.main_kv if m else None)} · "
            f"draft adds {fmt_bytes(draft_cost)} (KV {fmt_bytes(m.draft_kv if m else None)})",
        ]
        held = m.per_device() if m else {}
        if held:
            ram.append("     held " + " · ".join(f"{where} {fmt_bytes(a + b)}" for where, (a, b) in held.items()))
    return ram


# fixed widths: the table looks the same whatever order rows arrive in
HISTORY_COLUMNS = (("#", 3), ("task", 8), ("tokens", 6), ("plain t/s", 9), ("spec t/s", 8), ("speedup", 7),
                   ("accept", 6), ("prompt", 40))


class HistoryPanel(Vertical):
    """Every completed run, and a per-task-type summary (the seed's comparison table)."""

    def compose(self) -> ComposeResult:
        yield DataTable(id="history-table", zebra_stripes=True, cursor_type="row")
        yield Static(id="history-summary", markup=False)

    def on_mount(self) -> None:
        self.border_title = "History"
        table = self.query_one(DataTable)
        for label, width in HISTORY_COLUMNS:
            table.add_column(label, width=width)
        self.show([])

    def add(self, record: RunRecord, records: list[RunRecord]) -> None:
        table = self.query_one(DataTable)
        row = record.row()
        mode = {"spec": "", "": " (plain only)"}.get(record.spec_mode, f" ({record.spec_mode})")
        table.add_row(
            str(record.run), record.task,
            str(row["spec_tokens"] if row["spec_tokens"] is not None else row["plain_tokens"] or 0),
            fmt(row["plain_tps"], ".1f"), fmt(row["spec_tps"], ".1f"), fmt(record.speedup, ".2f", "x"),
            fmt(record.acceptance, ".0%"), record.prompt[:40] + mode,
            key=str(record.run),
        )
        table.move_cursor(row=table.row_count - 1)
        self.show(records)

    def show(self, records: list[RunRecord]) -> None:
        sums = summarize_by_task(records)
        if not sums:
            text = "No runs yet. Medians per task type (code, chat) will show here."
        else:
            text = "\n".join(
                f"{s.task:<8} {s.runs:>2} run{'s' if s.runs != 1 else ' '}  {fmt(s.plain_tps, '.1f')} → {fmt(s.spec_tps, '.1f')} t/s  "
                f"{fmt(s.speedup, '.2f')}x  accept {fmt(s.acceptance, '.0%')}  {s.verdict()}"
                for s in sums
            )
        self.query_one("#history-summary", Static).update(text)
