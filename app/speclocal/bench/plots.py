"""PNG plots of a bench run (matplotlib, Agg canvas: no display, no global pyplot state)."""

from __future__ import annotations

from pathlib import Path

from speclocal.bench.metrics import ENABLE_AT, WINDOW


def _figure(width: float = 8.0, height: float = 4.5):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=110)
    FigureCanvasAgg(fig)
    return fig, fig.add_subplot(1, 1, 1)


def _save(fig, path: Path) -> None:
    fig.tight_layout()
    tmp = path.with_name(path.name + ".tmp.png")
    fig.savefig(tmp, format="png")
    tmp.replace(path)


def _colour(data: dict, method: str) -> str:
    """The same colour for a method in every plot: plain dark grey, the others from matplotlib's tab10."""
    names = [m for m in data["methods"] if m != "plain"]
    if method not in names:
        return "#444444"
    return f"C{names.index(method) % 10}"


def _grouped_bars(ax, cats: list[str], series: dict[str, list[float | None]], data: dict,
                  colours: list[str] | None = None) -> None:
    n = max(1, len(series))
    width = 0.8 / n
    for i, (name, values) in enumerate(series.items()):
        xs = [j + (i - (n - 1) / 2) * width for j in range(len(cats))]
        ax.bar([x for x, v in zip(xs, values) if v is not None], [v for v in values if v is not None], width,
               label=name, color=colours[i] if colours else _colour(data, name))
    ax.set_xticks(range(len(cats)))
    ax.set_xticklabels(cats, rotation=20, ha="right")
    if series:
        ax.legend(fontsize=8)


def speedup_by_category(path: Path, data: dict) -> None:
    cats_stats = data["summary"]["categories"]
    cats = list(cats_stats)
    methods = [m for m in data["methods"] if m != "plain"]
    series = {m: [(cats_stats[c][m]["speedup"] or {}).get("median") if m in cats_stats[c] else None for c in cats]
              for m in methods}
    fig, ax = _figure()
    _grouped_bars(ax, cats, series, data)
    ax.axhline(1.0, color="black", linewidth=1)
    ax.axhline(ENABLE_AT, color="grey", linewidth=0.8, linestyle="--")
    ax.set_ylabel("median speedup vs plain (x)")
    ax.set_title("Decode speedup by category (1.0 = plain)")
    _save(fig, path)


def acceptance_by_category(path: Path, data: dict) -> None:
    cats_stats = data["summary"]["categories"]
    cats = list(cats_stats)
    methods = [m for m in data["methods"] if m != "plain"]
    series = {m: [cats_stats[c][m]["acceptance"] if m in cats_stats[c] else None for c in cats] for m in methods}
    fig, ax = _figure()
    _grouped_bars(ax, cats, series, data)
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("acceptance (accepted / drafted)")
    ax.set_title("Draft acceptance by category")
    _save(fig, path)


def tps_over_position(path: Path, data: dict) -> None:
    fig, ax = _figure()
    stab = data["summary"]["stability"]
    if stab:
        for x in stab:
            if x["windows"]:
                ax.plot([w[0] for w in x["windows"]], [w[1] for w in x["windows"]], marker=".",
                        color=_colour(data, x["method"]),
                        linestyle="-" if x["question_id"].endswith("code") else "--",
                        label=f"{x['question_id']} {x['method']}")
        ax.set_title(f"Tokens/s over the generation, stability run ({WINDOW}-token windows)")
    else:
        for m, pts in data["summary"]["tps_by_position"].items():
            if pts:
                ax.plot([p["position"] for p in pts], [p["tps"] for p in pts], marker=".", label=m,
                        color=_colour(data, m))
        ax.set_title(f"Tokens/s over the generation, mean over runs ({WINDOW}-token windows)")
    ax.set_xlabel("generated tokens")
    ax.set_ylabel("decode tokens/s")
    ax.set_ylim(bottom=0)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)
    _save(fig, path)


def acceptance_vs_context(path: Path, data: dict) -> None:
    fig, ax = _figure()
    for m, bins in data["summary"]["acceptance_by_context"].items():
        if bins:
            ax.plot([(b["context_from"] + b["context_to"]) / 2 for b in bins], [b["acceptance"] for b in bins],
                    marker="o", label=m, color=_colour(data, m))
    ax.set_ylim(0, 1.05)
    ax.set_xlim(left=0)
    ax.set_xlabel("context position (prompt + generated tokens), bin centres")
    ax.set_ylabel("acceptance")
    ax.set_title("Acceptance vs context length")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    _save(fig, path)


def what_if(path: Path, data: dict) -> bool:
    """Measured best fixed-method speedup here, next to the cost model's best for the measured acceptance,
    here and on a memory-bound machine. False (no file) without a profile."""
    wi = data["summary"].get("what_if")
    if not wi:
        return False
    cats_stats = data["summary"]["categories"]
    cats = [w["category"] for w in wi]

    def measured(cat: str) -> float | None:
        meds = [s["speedup"]["median"] for m, s in cats_stats.get(cat, {}).items()
                if m != "plain" and m != "auto" and s.get("speedup")]
        return max(meds, default=None)

    def best(w: dict, where: str) -> float | None:
        xs = [w[src][where]["speedup"] for src in ("model", "lookup") if w.get(src)]
        return max(xs, default=None)

    series = {"measured here: best fixed draft method": [measured(c) for c in cats],
              "predicted here: best source and k (1.0 = plain)": [best(w, "here") for w in wi],
              "predicted memory-bound: best source and k": [best(w, "memory_bound") for w in wi]}
    fig, ax = _figure()
    _grouped_bars(ax, cats, series, data, colours=["#444444", "C0", "C2"])
    ax.axhline(1.0, color="black", linewidth=1)
    ax.set_ylabel("speedup vs plain (x)")
    ax.set_title("Same acceptance, another machine: best draft source and k")
    _save(fig, path)
    return True


def write_plots(out: Path, data: dict) -> list[str]:
    from speclocal.bench.report import PLOTS

    funcs = [speedup_by_category, acceptance_by_category, tps_over_position, acceptance_vs_context, what_if]
    written = []
    for (name, _title), fn in zip(PLOTS, funcs):
        if fn(out / name, data) is not False:
            written.append(name)
    return written
