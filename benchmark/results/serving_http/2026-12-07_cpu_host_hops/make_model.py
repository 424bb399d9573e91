import sys; sys.path.insert(0, sys.argv[1] if len(sys.argv) > 1 else ".")
from pathlib import Path
from test.helpers.checkpoints import write_tiny_checkpoint, write_char_tokenizer
m = write_tiny_checkpoint(Path(sys.argv[2] if len(sys.argv) > 2 else "/tmp/hopsrun/llama"), "llama", seed=1, vocab_size=128)
write_char_tokenizer(m); print(m)
