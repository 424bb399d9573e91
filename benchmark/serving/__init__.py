"""bench_serving's parts: the HTTP client of SGLang's ``/v1/score`` API (``client``),
the seeded agent and fresh-state traffic (``traffic``), summaries, markdown and
plots (``report``), and ``compare.py`` (two engines' runs side by side)."""
