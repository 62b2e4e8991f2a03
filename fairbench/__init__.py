"""fairbench: an open-loop, multi-tenant benchmark for LLM request schedulers."""

__version__ = "0.1.0"
