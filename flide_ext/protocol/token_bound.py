"""A lower bound on the tokens a text becomes, from its bytes alone, so a text
far over the context length is refused before it is tokenised.

A BPE tokenizer turns each byte of its input that it does not drop into part of
one token, and no token covers more bytes than the longest entry of its
vocabulary (added tokens included). So a text has at least ``kept bytes /
longest token`` tokens, where the kept bytes are those the tokenizer cannot
drop: every byte whose byte-level character is in the vocabulary, for a
byte-level BPE (GPT-2, Llama 3, Qwen, SmolLM2); the ASCII characters that are
vocabulary entries of their own, for any other BPE. The bound holds only where
nothing can swallow text: the pre-tokenizer removes nothing, the normalizer is
a Unicode normal form (applied first to non-ASCII text; every ASCII text is its
own normal form), and no added token strips the whitespace around it. Any
other tokenizer gets no bound (:attr:`TokenBound.enabled` is False) and every
text is tokenised.
"""

from __future__ import annotations

import json
from typing import Optional

from .errors import RequestError

# Normalizers that leave every ASCII text as it is.
_NORMAL_FORMS = {"NFC", "NFD", "NFKC", "NFKD"}
# Pre-tokenizers that only split (unless told to remove what they match).
_SPLITTERS = {"Split", "Punctuation", "Digits", "ByteLevel"}
# Bytes a normal form may move across a text's edges when the text is rendered
# into a prompt (a combining mark composing with the character before it).
SLACK_BYTES = 8


def _splits_only(pre: Optional[dict]) -> bool:
    if pre is None:
        return True
    if pre["type"] == "Sequence":
        return all(_splits_only(p) for p in pre["pretokenizers"])
    return pre["type"] in _SPLITTERS and pre.get("behavior") != "Removed"


def _byte_level(pre: Optional[dict]) -> bool:
    if pre is None:
        return False
    if pre["type"] == "Sequence":
        return any(_byte_level(p) for p in pre["pretokenizers"])
    return pre["type"] == "ByteLevel"


def _normal_forms_only(norm: Optional[dict]) -> bool:
    if norm is None:
        return True
    if norm["type"] == "Sequence":
        return all(_normal_forms_only(n) for n in norm["normalizers"])
    return norm["type"] in _NORMAL_FORMS


def _state(component) -> Optional[dict]:
    return None if component is None else json.loads(component.__getstate__())


class TokenBound:
    """The lower bound of one tokenizer (see the module's docstring).

    Args:
        tokenizer: a transformers tokenizer; a slow one (no ``backend_tokenizer``)
            gets no bound.

    Attributes:
        enabled: whether this tokenizer has a bound.
        longest: bytes the longest token can cover (0 when not enabled).
    """

    def __init__(self, tokenizer):
        self.enabled, self.longest = False, 0
        self.normalizer = None
        self._dropped: Optional[bytes] = None  # bytes the tokenizer may drop (None: none)
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is None or type(backend.model).__name__ != "BPE":
            return
        model = backend.model
        if model.continuing_subword_prefix or model.end_of_word_suffix:
            return  # a character inside a word is looked up under another name
        pre, norm = _state(backend.pre_tokenizer), _state(backend.normalizer)
        added = list(backend.get_added_tokens_decoder().values())
        if not _splits_only(pre) or not _normal_forms_only(norm) or any(a.lstrip or a.rstrip for a in added):
            return
        vocab = backend.get_vocab(with_added_tokens=False)
        if _byte_level(pre):
            from transformers.convert_slow_tokenizer import bytes_to_unicode

            # Each byte-level character stands for one byte, so a token covers len(token) bytes.
            chars = bytes_to_unicode()
            dropped = bytes(b for b in range(256) if chars[b] not in vocab)
        else:
            dropped = bytes(b for b in range(256) if b >= 128 or chr(b) not in vocab)
        self._dropped = dropped or None
        self.longest = max([len(t) for t in vocab] + [len(a.content.encode("utf-8")) for a in added] + [1])
        self.normalizer = backend.normalizer if norm is not None else None
        self.enabled = True

    def at_least(self, text: str) -> int:
        """Tokens any prompt holding ``text`` has at least (0 when not enabled, or
        for text UTF-8 cannot encode, which is refused where it is rendered)."""
        if not self.enabled:
            return 0
        if self.normalizer is not None and not text.isascii():  # isascii is O(1) on str
            text = self.normalizer.normalize_str(text)
        try:
            data = text.encode("utf-8")
        except UnicodeEncodeError:
            return 0
        kept = len(data) if self._dropped is None else len(data.translate(None, self._dropped))
        return max(0, kept - SLACK_BYTES) // self.longest

    def check(self, text: str, field: str, context_length: int, before: int = 0) -> int:
        """Refuse ``text`` when even its bound (plus ``before``, a bound on the
        prompt's other tokens) does not fit the context length.

        Returns:
            the bound of ``text`` alone, in tokens.

        Raises:
            RequestError: on ``field``.
        """
        bound = self.at_least(text)
        if before + bound >= context_length:
            raise RequestError(
                field,
                f"makes a prompt of at least {before + bound} tokens (no token covers more than {self.longest} "
                f"bytes), which does not fit the context length of {context_length} tokens",
            )
        return bound
