"""infertune: tunes the infrastructure under LLM inference servers."""

__version__ = "0.1.0"
