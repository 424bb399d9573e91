"""Model building blocks that run over a round's flat stream."""
