"""The kernel benchmark's table: memory-bound rows (fraction of the copy ceiling) and ratio rows
(speedup over a baseline measured in the same run), with the summary against the target."""
from __future__ import annotations

TARGET_FRACTION = 0.70


class Report:
    def __init__(self, copy_gbps: float) -> None:
        self.copy_gbps = copy_gbps
        self.rows: list[dict] = []

    def memory_bound(self, kernel: str, variant: str, shape, nbytes: int, ms: float, config: dict,
                     all_configs: list | None = None, counts_for_target: bool = True, note: str = "") -> dict:
        gbps = nbytes / ms / 1e6
        row = {"kernel": kernel, "variant": variant, "shape": list(shape), "bytes": nbytes, "ms": ms,
               "gbps": gbps, "fraction_of_copy": gbps / self.copy_gbps, "config": config,
               "all_configs": all_configs or [], "counts_for_target": counts_for_target, "note": note}
        self.rows.append(row)
        return row

    def ratio(self, kernel: str, variant: str, shape, ms: float, baseline: str, baseline_ms: float | None,
              target: float | None, nbytes: int | None = None, note: str = "") -> dict:
        row = {"kernel": kernel, "variant": variant, "shape": list(shape), "ms": ms, "baseline": baseline,
               "baseline_ms": baseline_ms, "speedup": (baseline_ms / ms) if baseline_ms else None,
               "target_speedup": target, "note": note}
        if nbytes is not None:
            row.update(bytes=nbytes, gbps=nbytes / ms / 1e6, fraction_of_copy=nbytes / ms / 1e6 / self.copy_gbps)
        self.rows.append(row)
        return row

    def summary(self) -> dict:
        counted = [r for r in self.rows if r.get("counts_for_target")]
        if not counted:
            return {"copy_gbps": self.copy_gbps, "worst_fraction": None, "worst_kernel": None,
                    "target_fraction": TARGET_FRACTION, "target_met": False}
        worst = min(counted, key=lambda r: r["fraction_of_copy"])
        return {"copy_gbps": self.copy_gbps, "worst_fraction": worst["fraction_of_copy"],
                "worst_kernel": f"{worst['kernel']} {worst['variant']}", "target_fraction": TARGET_FRACTION,
                "target_met": worst["fraction_of_copy"] >= TARGET_FRACTION}

    def print(self) -> None:
        print(f"\n{'kernel':<27}{'variant':<34}{'ms':>9}{'GB/s':>9}{'x copy':>8}   vs baseline")
        for r in self.rows:
            frac = f"{r['fraction_of_copy']:.2f}" if "fraction_of_copy" in r else ""
            gbps = f"{r['gbps']:.0f}" if "gbps" in r else ""
            extra = ""
            if r.get("baseline"):
                if r["speedup"] is None:
                    extra = f"{r['baseline']}: n/a ({r['note']})"
                else:
                    tgt = f" (target >= {r['target_speedup']:g}x)" if r.get("target_speedup") else ""
                    extra = f"{r['speedup']:.2f}x faster than {r['baseline']} {r['baseline_ms']:.3f} ms{tgt}"
            elif r.get("note"):
                extra = r["note"]
            print(f"{r['kernel']:<27}{r['variant']:<34}{r['ms']:>9.3f}{gbps:>9}{frac:>8}   {extra}")
        s = self.summary()
        if s["worst_fraction"] is None:
            print("worst fraction of the copy ceiling: no memory-bound kernel was timed")
            return
        print(f"worst fraction of the copy ceiling ({self.copy_gbps:.0f} GB/s) over the one-pass memory-bound "
              f"kernels: {s['worst_fraction']:.2f} ({s['worst_kernel']}); target {TARGET_FRACTION:.2f}: "
              f"{'met' if s['target_met'] else 'NOT met'}")
