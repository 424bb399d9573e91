"""Flide's runtime: the engine that runs rounds of requests as flat streams."""
