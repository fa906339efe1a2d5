"""Benchmarks and quality gates against a running OpenAI-compatible server: the recipe's method."""
