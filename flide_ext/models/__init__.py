"""Model families Flide runs, by Hugging Face architecture name."""

from .llama import LlamaForCausalLM, Qwen3ForCausalLM
from .qwen3_5 import Qwen3_5ForCausalLM, Qwen3NextForCausalLM

MODEL_CLASSES = {
    "LlamaForCausalLM": LlamaForCausalLM,
    "Qwen3ForCausalLM": Qwen3ForCausalLM,
    "Qwen3_5ForCausalLM": Qwen3_5ForCausalLM,
    "Qwen3_5ForConditionalGeneration": Qwen3_5ForCausalLM,
    "Qwen3NextForCausalLM": Qwen3NextForCausalLM,
}

__all__ = ["MODEL_CLASSES", "LlamaForCausalLM", "Qwen3ForCausalLM", "Qwen3_5ForCausalLM", "Qwen3NextForCausalLM"]
