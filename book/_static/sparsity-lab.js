// The sparsity-lab course pages: long text outputs made readable inside the text column.
// A text output wider than its column is either prose (its lines wrap) or a table (two or more lines
// with columns separated by runs of spaces or " | "): a table keeps its layout, at a font up to a
// fifth smaller when that makes it fit, and otherwise scrolls at its own size (class sl-scroll), with
// a note under it saying that there are more columns to the right. Plotly tables get the height their
// rows need at the column's width.
(function () {
    "use strict";
    const MIN_SCALE = 0.8;

    function isTable(text) {
        const rows = text.split("\n").filter(line => /\S {2,}\S/.test(line.trim()) || / \| /.test(line));
        return rows.length >= 2;
    }

    function fit(pre) {
        if (pre.scrollWidth <= pre.clientWidth + 1) return;
        if (!isTable(pre.textContent)) {
            pre.classList.add("sl-wrap");
            return;
        }
        const style = getComputedStyle(pre);
        const size = parseFloat(style.fontSize);
        const padding = parseFloat(style.paddingLeft) + parseFloat(style.paddingRight);  // does not shrink
        const scale = 0.98 * (pre.clientWidth - padding) / (pre.scrollWidth - padding);
        if (scale >= MIN_SCALE) {
            pre.style.fontSize = (Math.floor(size * scale * 10) / 10) + "px";
            if (pre.scrollWidth <= pre.clientWidth + 1) return;
            pre.style.fontSize = "";
        }
        pre.classList.add("sl-scroll");
        const output = pre.closest("div.output");
        if (output) output.classList.add("sl-scroll-note");
    }

    function fitAll() {
        document.querySelectorAll("div.cell_output pre").forEach(fit);
        document.documentElement.dataset.slOutputsFitted = "1";
    }

    // A plotly table has a fixed height: in a column narrower than it was made for, its cells wrap
    // onto more lines and the last rows hide behind the table's own scrollbar. Set each table
    // figure's height to what its header and rows need (plotly measured them when it drew them).
    function tableOverflow(gd) {
        const view = gd.querySelector(".table-control-view");
        const state = view && view.__data__;
        if (!state || !state.rowBlocks) return 0;
        const rows = blocks => blocks.reduce((s, b) => s + b.rows.reduce((t, r) => t + r.rowHeight, 0), 0);
        return Math.ceil(rows(state.headerRowBlocks) + rows(state.rowBlocks) - state.groupHeight);
    }

    function fitTables() {
        const resized = [];
        document.querySelectorAll(".js-plotly-plot").forEach(gd => {
            const extra = window.Plotly && gd._fullLayout && tableOverflow(gd);
            if (!(extra > 1 || extra < -8)) return;
            const height = gd._fullLayout.height + extra + 2;
            gd.style.height = height + "px";  // the figure's boxes grow with it: nothing drawn over what follows
            if (gd.parentElement) gd.parentElement.style.height = "auto";
            resized.push(window.Plotly.relayout(gd, {height: height}));
        });
        return Promise.all(resized);
    }

    if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", fitAll);
    else fitAll();
    window.addEventListener("load", () => {
        fitTables().finally(() => { document.documentElement.dataset.slFiguresFitted = "1"; });
        const hub = window.MathJax && window.MathJax.Hub;  // MathJax 2, served with the book
        if (hub) hub.Queue(() => { document.documentElement.dataset.slMathTypeset = "1"; });
        else document.documentElement.dataset.slMathTypeset = "none";
    });
    let pending = null;
    window.addEventListener("resize", () => {  // responsive figures change width: refit after plotly
        clearTimeout(pending);
        pending = setTimeout(fitTables, 300);
    });
})();
