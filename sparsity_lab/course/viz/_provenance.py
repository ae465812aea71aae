"""One line that says where a recorded result came from (the ``provenance`` block of results/*.json)."""
from __future__ import annotations


def provenance_line(prov: dict) -> str:
    """GPU (or CPU), date, commit and versions, from a ``provenance`` dict; absent fields are left out.

    >>> provenance_line({"gpu": "H100", "date": "2026-11-21T15:00:00+00:00", "git_commit": "0123456789abcdef",
    ...                  "torch": "2.11.0", "triton": "3.6.0"})
    'H100, 2026-11-21 15:00 UTC, commit 0123456789ab, torch 2.11.0, triton 3.6.0'
    """
    if not isinstance(prov, dict):
        raise TypeError(f"prov must be the 'provenance' dict of a recorded result, got {type(prov).__name__}")
    where = prov.get("gpu") or f"CPU ({prov.get('cpu') or 'unknown'}, no GPU)"
    parts = [where + (f" (compute capability {prov['compute_capability']})" if prov.get("compute_capability") else "")]
    date = prov.get("date")
    if date:
        parts.append(date[:16].replace("T", " ") + (" UTC" if date.endswith("+00:00") else ""))
    commit = prov.get("git_commit")
    if commit:
        head, _, tail = commit.partition("+")
        parts.append(f"commit {head[:12]}" + (f"+{tail}" if tail else ""))
    for key, label in (("torch", "torch"), ("triton", "triton"), ("cuda", "CUDA"), ("cusparselt", "cuSPARSELt")):
        if prov.get(key) is not None:
            parts.append(f"{label} {prov[key]}")
    return ", ".join(parts)
