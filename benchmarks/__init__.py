"""Benchmarks that print ratios measured side by side and write results/*.json with provenance."""
