"""Flide's server, in SGLang's process shape: the HTTP server and tokenizer
manager in the main process, the scheduler (rounds, model) in its own process,
talking over ZMQ."""
