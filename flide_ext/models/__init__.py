"""Model families Flide runs, by Hugging Face architecture name."""

from .gemma4 import Gemma4ForCausalLM
from .llama import LlamaForCausalLM, Qwen3ForCausalLM
from .qwen3_5 import Qwen3_5ForCausalLM, Qwen3NextForCausalLM

MODEL_CLASSES = {
    "Gemma4ForCausalLM": Gemma4ForCausalLM,
    "Gemma4ForConditionalGeneration": Gemma4ForCausalLM,
    "LlamaForCausalLM": LlamaForCausalLM,
    "Qwen3ForCausalLM": Qwen3ForCausalLM,
    "Qwen3_5ForCausalLM": Qwen3_5ForCausalLM,
    "Qwen3_5ForConditionalGeneration": Qwen3_5ForCausalLM,
    "Qwen3NextForCausalLM": Qwen3NextForCausalLM,
}

__all__ = ["MODEL_CLASSES", "Gemma4ForCausalLM", "LlamaForCausalLM", "Qwen3ForCausalLM", "Qwen3_5ForCausalLM", "Qwen3NextForCausalLM"]
