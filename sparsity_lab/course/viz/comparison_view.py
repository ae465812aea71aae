"""The pre-training comparison as tables and figures: a live run, and the runs recorded on a GPU.

A comparison folder is what ``sparsity-lab compare --out DIR`` (``lab.compare.run_comparison``) writes:
``DIR/results.json`` (provenance, ``table``, ``claims``, ``runs``), ``DIR/<variant>/log.jsonl`` and,
for the recorded runs under results/, a person's reading of it in ``DIR/NOTES.md``.

Which recorded comparison to show first (:func:`find_comparisons`) is decided from the JSON alone,
most complete first: the most of the five claims tested, then the most tokens per variant, then
the most variants, then the newest.
"""
from __future__ import annotations

import json
import textwrap
from dataclasses import dataclass
from pathlib import Path

from ...lab.figures import loss_figure
from ...lab.runlog import log_exists, read_log
from ...provenance import RESULTS_DIR
from ._optional import ipywidgets, plotly_go
from ._provenance import provenance_command, provenance_line

__all__ = ["RecordedComparison", "claims_figure", "claims_text", "comparison_explorer", "describe",
           "find_comparisons", "gap_figure", "load_comparison", "overview_figure", "results_table_figure",
           "setup_line"]

VERDICTS = {True: "HOLDS", False: "FAILS", None: "NOT TESTED"}
VERDICT_COLORS = {"HOLDS": "#d9f2d9", "FAILS": "#f9d6d5", "NOT TESTED": "#eeeeee", "TOO SMALL TO JUDGE": "#eeeeee"}


def verdict(claim: dict) -> str:
    """HOLDS / FAILS / NOT TESTED, or TOO SMALL TO JUDGE for a run below compare's size for a verdict."""
    return "TOO SMALL TO JUDGE" if claim.get("too_small") else VERDICTS[claim.get("holds")]

# (key in a table row, column title, format); a column is shown when any row has the key.
# val_at_switch: older runs evaluated at the switch step, where the fine-tuning run is already dense.
TABLE_COLUMNS = (
    ("variant", "variant", "{}"),
    ("status", "status", "{}"),
    ("tokens", "tokens", "{:,}"),
    ("final_val_loss", "final val loss", "{:.4f}"),
    ("gap_vs_dense_pct", "vs dense", "{:+.2f} %"),
    ("val_before_switch", "val loss before switch", "{:.4f}"),
    ("val_at_switch", "val loss at switch", "{:.4f}"),
    ("flip_early", "flip rate early", "{:.2e}"),
    ("flip_late", "flip rate late", "{:.2e}"),
    ("flip_trend", "late / early", "{:.2f}"),
    ("ffn_flops_fraction", "FFN FLOPs vs dense", "{:.2f}"),
    ("median_tokens_per_s", "tokens/s (median)", "{:,.0f}"),
)
COMPARISON_KEYS = ("provenance", "table", "claims")


def _cell(value, fmt: str) -> str:
    if value is None or (isinstance(value, float) and value != value):
        return "n/a"
    return fmt.format(value)


@dataclass(frozen=True)
class RecordedComparison:
    """One comparison folder: its results.json (``payload``) and NOTES.md (``notes``, None if absent)."""

    folder: Path
    payload: dict
    notes: str | None

    @property
    def name(self) -> str:
        return self.folder.name

    @property
    def variants(self) -> list[str]:
        return [r["variant"] for r in self.payload["table"]]

    @property
    def tokens_per_variant(self) -> int:
        """The planned tokens of each variant (steps x tokens per step)."""
        p = self.payload
        if "steps" in p and "tokens_per_step" in p:
            return int(p["steps"]) * int(p["tokens_per_step"])
        return max((int(r.get("tokens") or 0) for r in p["table"]), default=0)

    @property
    def claims_tested(self) -> int:
        return sum(c.get("holds") is not None for c in self.payload["claims"])

    @property
    def claims_held(self) -> int:
        return sum(c.get("holds") is True for c in self.payload["claims"])

    @property
    def date(self) -> str:
        return str(self.payload["provenance"].get("date") or "")

    def rank_key(self) -> tuple:
        """Larger is more complete: (claims tested, tokens per variant, variants, date)."""
        return (self.claims_tested, self.tokens_per_variant, len(self.variants), self.date)

    def log_path(self, variant: str) -> Path:
        run = self.payload.get("runs", {}).get(variant, {})
        return self.folder / run.get("log", f"{variant}/log.jsonl")

    def logs(self) -> dict[str, list[dict]]:
        """{variant: logged rows}, for the variants in the table (other logs in the folder are ignored)."""
        missing = [v for v in self.variants if not log_exists(self.log_path(v))]
        if missing:
            raise FileNotFoundError(f"{self.folder}: no log for {missing} (expected {self.log_path(missing[0])})")
        return {v: read_log(self.log_path(v)) for v in self.variants}

    def summary(self) -> dict:
        return {"folder": self.name, "date": self.date[:10], "gpu": self.payload["provenance"].get("gpu") or "CPU",
                "variants": len(self.variants), "tokens_per_variant": self.tokens_per_variant,
                "claims": f"{self.claims_held} hold / {self.claims_tested} tested", "notes": self.notes is not None}


def load_comparison(folder: str | Path) -> RecordedComparison:
    """Read one comparison folder; a clear error when it is not one."""
    folder = Path(folder)
    path = folder / "results.json"
    if not path.is_file():
        raise FileNotFoundError(f"no results.json in {str(folder)!r}: is it a `sparsity-lab compare` output folder?")
    try:
        payload = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path} is not valid JSON ({err}); was it written completely?") from err
    missing = [k for k in COMPARISON_KEYS if k not in payload]
    if missing:
        raise ValueError(f"{path} lacks {missing}: not a comparison written by `sparsity-lab compare`")
    notes = folder / "NOTES.md"
    return RecordedComparison(folder, payload, notes.read_text() if notes.is_file() else None)


def find_comparisons(results_dir: str | Path = RESULTS_DIR) -> list[RecordedComparison]:
    """Every comparison folder directly under results_dir, most complete first (see the module docstring).

    Folders whose results.json is not a comparison (no table, claims and provenance) are not listed.
    """
    results_dir = Path(results_dir)
    if not results_dir.is_dir():
        raise FileNotFoundError(f"results_dir {str(results_dir)!r} is not a folder")
    found = []
    for path in sorted(results_dir.glob("*/results.json")):
        try:
            found.append(load_comparison(path.parent))
        except ValueError as err:
            if "not a comparison" not in str(err):
                raise  # broken JSON: say so rather than skip it
    return sorted(found, key=RecordedComparison.rank_key, reverse=True)


# --- tables ---------------------------------------------------------------------------------------
def _text_widths(header: list[str], columns: list[list[str]]) -> list[int]:
    """Relative column widths, in characters: each column's longest cell on one line, its title on three
    at most (plotly wraps at spaces only and cuts a longer word, e.g. masked_decay_weights), plus 3 for
    the cell's padding."""
    return [3 + max(4, -(-len(title) // 3), *(len(w) for w in title.split()), *(len(str(c)) for c in column))
            for title, column in zip(header, columns)]


def _table(header: list[str], columns: list[list[str]], fill=None, widths=None, title: str = ""):
    """A plotly Table; ``widths`` (relative) default to :func:`_text_widths`."""
    go = plotly_go()
    widths = _text_widths(header, columns) if widths is None else widths
    cells = {"values": columns, "align": "left", "height": 24}
    if fill is not None:
        cells["fill_color"] = fill
    fig = go.Figure(go.Table(header={"values": header, "align": "left", "fill_color": "#dde6f0"},
                             cells=cells, columnwidth=widths))
    fig.update_layout(title=title, margin={"l": 10, "r": 10, "t": 40 if title else 10, "b": 10},
                      height=70 + 28 * (len(columns[0]) + 1))
    return fig


def results_table_figure(payload: dict, title: str = ""):
    """The comparison's table (one row per variant) as a plotly Table, with the columns it has."""
    rows = payload["table"]
    shown = [(k, t, f) for k, t, f in TABLE_COLUMNS if any(k in r for r in rows)]
    columns = [[_cell(r.get(k), f) for r in rows] for k, _, f in shown]
    return _table([t for _, t, _ in shown], columns, title=title)


def claims_figure(payload: dict, title: str = "The claims, as judged when the run was recorded"):
    """Claim, verdict (HOLDS / FAILS / NOT TESTED), the rule and the evidence, as recorded in the JSON."""
    claims = payload["claims"]
    verdicts = [verdict(c) for c in claims]
    columns = [[c["claim"] for c in claims], verdicts, [c["rule"] for c in claims], [c["evidence"] for c in claims]]
    fill = [["white"] * len(claims), [VERDICT_COLORS[v] for v in verdicts], ["white"] * len(claims),
            ["white"] * len(claims)]
    fig = _table(["claim", "verdict", "rule (ours)", "evidence"], columns, fill=fill, widths=[3, 1, 4, 5],
                 title=title)
    fig.update_layout(height=120 + 90 * len(claims))
    return fig


TEXT_WIDTH = 96  # the book's column, with room for a notebook's margin


def _fill(text: str, width: int, indent: str = "", more: str = "    ") -> str:
    return textwrap.fill(text, width, initial_indent=indent, subsequent_indent=indent + more,
                         break_on_hyphens=False, break_long_words=False)


def claims_text(payload: dict, width: int = TEXT_WIDTH) -> str:
    """The claims as lines of text no wider than ``width``: ``[VERDICT] claim`` and the evidence under it."""
    return "\n".join(_fill(f"[{verdict(c)}] {c['claim']}", width) + "\n" + _fill(c["evidence"], width, "    ")
                     for c in payload["claims"])


def overview_figure(comparisons: list[RecordedComparison]):
    """One row per recorded comparison (in the given order: the first is the one shown in detail)."""
    if not comparisons:
        raise ValueError("comparisons is empty: no comparison folder was found")
    rows = [c.summary() for c in comparisons]
    keys = ("folder", "date", "gpu", "variants", "tokens_per_variant", "claims", "notes")
    columns = [[f"{r[k]:,}" if k == "tokens_per_variant" else str(r[k]) for r in rows] for k in keys]
    return _table(["folder", "date", "GPU", "variants", "tokens per variant", "claims", "NOTES.md"], columns,
                  widths=[3, 1.2, 2.2, 1, 1.5, 1.8, 1.2], title="Recorded comparisons, most complete first")


def gap_figure(logs: dict[str, list[dict]], reference: str = "dense"):
    """Validation loss relative to the reference run at every evaluation both have: 100 (v / ref - 1) %.

    The loss curves of all methods nearly coincide; their differences are what the claims are about.
    """
    go = plotly_go()
    if reference not in logs:
        raise ValueError(f"reference {reference!r} is not among the logged variants {sorted(logs)}")
    ref = {r["step"]: r["val_loss"] for r in logs[reference] if r["val_loss"] is not None}
    fig = go.Figure()
    for variant, rows in logs.items():
        if variant == reference:
            continue
        pts = [(r["tokens"], 100 * (r["val_loss"] / ref[r["step"]] - 1)) for r in rows
               if r["val_loss"] is not None and r["step"] in ref]
        fig.add_trace(go.Scatter(x=[t for t, _ in pts], y=[g for _, g in pts], mode="lines+markers", name=variant))
    # the reference's name under the line at its left end: runs are evaluated from the first interval
    # on, so no curve is there (at the right end, the curves close to the reference ran over it)
    fig.add_hline(y=0.0, line_dash="dot", annotation_text=reference, annotation_position="bottom left")
    fig.update_layout(title=f"Validation loss relative to {reference} (same step, same validation windows)",
                      xaxis_title="tokens", yaxis_title=f"% above {reference}", template="plotly_white")
    return fig


# --- the explorer -------------------------------------------------------------------------------
def setup_line(payload: dict) -> str:
    """The model, batch, schedule, backend and decays of a comparison, from its first run's config."""
    runs = payload.get("runs") or {}
    if not runs:
        return "set-up not recorded"
    cfg = next(iter(runs.values()))["config"]
    m = cfg["model"]
    corpus = payload.get("corpus") or {}
    parts = [f"GPT {m['n_layer']} layers, width {m['d_model']}, {m['n_head']} heads, context {m['context']}, "
             f"{m.get('ffn_kind', 'gelu')} FFN",
             f"batch {cfg['batch_size'] * cfg.get('grad_accum', 1)} x {m['context']} = "
             f"{payload.get('tokens_per_step', 0):,} tokens per step",
             f"lr {cfg['lr']:g}, {payload.get('warmup_steps', cfg['warmup_steps'])} warm-up steps, seed {cfg['seed']}",
             f"backend {(payload.get('common_options') or {}).get('backend', 'torch')}"]
    if payload.get("decay") is not None or payload.get("srste_decay") is not None:
        parts.append(f"masked decay {payload.get('decay')}, SR-STE decay {payload.get('srste_decay')}")
    if corpus.get("train_bytes"):
        # the source names the recording machine's folder after the kind ("python-stdlib:/usr/lib/..."): the kind only
        source = str(corpus.get("source", "?")).split(":", 1)[0]
        parts.append(f"corpus {source} ({corpus['train_bytes']:,} training bytes)")
    return "; ".join(parts)


def describe(comparison: RecordedComparison, html: bool = True, width: int = TEXT_WIDTH) -> str:
    """Folder, size, claims, set-up and provenance of one comparison, in a few lines (as text: each
    wrapped to ``width`` characters)."""
    p = comparison.payload
    tested = comparison.claims_tested
    held = comparison.claims_held
    claims = (f"{held} of the {tested} claims it tests hold{'s' if held == 1 else ''}" if tested
              else "it tests none of the five claims (a variant each claim needs was not run)")
    lines = [f"{comparison.name}: {len(comparison.variants)} variants ({', '.join(comparison.variants)}), "
             f"{comparison.tokens_per_variant:,} tokens each ({p.get('steps', '?')} steps); {claims}",
             f"set-up: {setup_line(p)}",
             f"recorded on: {provenance_line(p['provenance'])}",
             f"command: {provenance_command(p['provenance'])}"]
    return "<br>".join(lines) if html else "\n".join(_fill(line, width) for line in lines)


def comparison_explorer(comparisons: list[RecordedComparison], start: int = 0):
    """A dropdown over the recorded comparisons; the loss curves and the claims follow the choice.
    ``start``: the index of the comparison shown first (a page that already showed the first one in
    detail starts on another)."""
    if not comparisons:
        raise ValueError("comparisons is empty: no comparison folder was found")
    if isinstance(start, bool) or not isinstance(start, int) or not 0 <= start < len(comparisons):
        raise ValueError(f"start must be an index into the {len(comparisons)} comparisons, got {start!r}")
    widgets, go = ipywidgets(), plotly_go()
    by_name = {c.name: c for c in comparisons}
    choice = widgets.Dropdown(options=list(by_name), value=comparisons[start].name, description="run")
    info = widgets.HTML()
    claims = widgets.HTML()
    fig = go.FigureWidget(loss_figure(comparisons[start].logs()))

    def show(_change=None) -> None:
        comparison = by_name[choice.value]
        new = loss_figure(comparison.logs())
        with fig.batch_update():
            fig.data = []
            fig.add_traces(list(new.data))  # each trace keeps its subplot (xaxis/yaxis x, y or x2, y2)
        info.value = describe(comparison)
        claims.value = "<br>".join(f"<b>{verdict(c)}</b> {c['claim']}"
                                   for c in comparison.payload["claims"])

    show()
    choice.observe(show, names="value")
    return widgets.VBox([choice, info, fig, claims])
