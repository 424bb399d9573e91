"""Flide's version: the one place it is written (the package metadata reads it too)."""

__version__ = "0.1.0"
