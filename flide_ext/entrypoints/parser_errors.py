"""Command-line parse errors in one line.

argparse prints a parser's usage before its error; SGLang's parser's usage runs
to several hundred lines, with the error last. Flide's launchers print the error
alone, naming where the flags are listed; the exit status stays argparse's 2.
"""

from __future__ import annotations

import argparse


def one_line(prog: str, message: str) -> str:
    """The error line of ``prog`` for an argparse ``message``, newline included."""
    return f"{prog}: error: {message} (--help lists the flags)\n"


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose parse errors, and its subparsers', are one line
    on stderr with exit status 2 (``--help`` unchanged)."""

    def error(self, message: str):
        self.exit(2, one_line(self.prog, message))


def one_line_errors(parser: argparse.ArgumentParser) -> None:
    """Make a parser built elsewhere (SGLang's) report parse errors as
    :class:`OneLineParser` does."""

    def error(message: str):
        parser.exit(2, one_line(parser.prog, message))

    parser.error = error
