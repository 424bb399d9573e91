"""Model families Flide runs, by Hugging Face architecture name."""

from .llama import LlamaForCausalLM, Qwen3ForCausalLM

MODEL_CLASSES = {
    "LlamaForCausalLM": LlamaForCausalLM,
    "Qwen3ForCausalLM": Qwen3ForCausalLM,
}

__all__ = ["MODEL_CLASSES", "LlamaForCausalLM", "Qwen3ForCausalLM"]
