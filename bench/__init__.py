"""Benchmarks of infertune and of its test infrastructure; results live in results/."""
