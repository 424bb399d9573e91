"""fla-core's tuned launch configurations, shipped per GPU, so a fresh machine's
first CUDA-graph capture compiles one configuration of each fla kernel instead
of autotuning them all (on the H200 that autotuning was most of a 185 s cold
start, against 27 s with a warm Triton cache).

fla-core reads ``$FLA_CONFIG_DIR/{kernel}.json`` when ``FLA_CACHE_MODE`` asks it to
(``fla.ops.utils.cache``: exact key, then fuzzy key, then the file's default
config; any kernel without a file autotunes as before). Both variables are read
when fla is imported, so :func:`use_shipped` runs before the first import, and
only sets what the user has not set. :func:`dump` writes the configurations the
running process's fla autotuners chose, in that format (``benchmark/profile_round.py
--dump-fla-configs DIR`` runs a capture and dumps; ``benchmark/results/decision/README.md``
names the run that made the shipped ones).
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

SHIPPED = Path(__file__).with_name("fla_configs")
# Per compute capability, the shipped folder another GPU of that architecture
# uses when none was tuned on it (the H100 runs the H200's configurations: the
# same Hopper multiprocessors; the tiles fit the same shared memory).
BY_CAPABILITY = {(9, 0): "NVIDIA_H200"}


def gpu_dir_name(name: str) -> str:
    """A GPU's directory name, as fla-core names its own (non-alphanumerics to ``_``)."""
    return re.sub(r"[^0-9A-Za-z]+", "_", name).strip("_") or "unknown_gpu"


def use_shipped() -> bool:
    """Point fla-core at the configurations shipped for this process's GPU (or,
    for a GPU with none, for its architecture: :data:`BY_CAPABILITY`), unless
    ``FLA_CONFIG_DIR`` or ``FLA_CACHE_MODE`` is set already, ``FLA_GPU_NAME``
    names a GPU with none, or fla was imported. True when the shipped ones are in use."""
    if "fla" in sys.modules or "FLA_CONFIG_DIR" in os.environ or "FLA_CACHE_MODE" in os.environ:
        return False
    import torch

    if not torch.cuda.is_available():
        return False
    # FLA_GPU_NAME is fla's own override of the GPU it picks configs for.
    named = os.environ.get("FLA_GPU_NAME")
    folder = SHIPPED / gpu_dir_name(named or torch.cuda.get_device_name(0))
    if not folder.is_dir() and not named:
        folder = SHIPPED / BY_CAPABILITY.get(tuple(torch.cuda.get_device_capability(0)), "")
    if folder == SHIPPED or not folder.is_dir():
        return False
    os.environ["FLA_CONFIG_DIR"] = str(folder)
    os.environ["FLA_CACHE_MODE"] = "full"
    return True


def chosen_configs() -> dict[str, dict]:
    """Per fla kernel name: the configurations its autotuner chose in this process,
    as fla-core's config file (``autotune_entries`` keyed by its key hash, and the
    first as ``default_config``)."""
    from triton.runtime.autotuner import Autotuner

    from fla.ops.utils.cache import AutotuneKey

    files: dict[str, dict] = {}
    seen = set()
    for name, module in list(sys.modules.items()):
        if not (name == "fla" or name.startswith("fla.")) or module is None:
            continue
        for tuner in vars(module).values():
            # A kernel's outer decorator may be triton.heuristics around the autotuner.
            for _ in range(3):
                if isinstance(tuner, Autotuner) or not hasattr(tuner, "fn"):
                    break
                tuner = tuner.fn
            if not isinstance(tuner, Autotuner) or id(tuner) in seen or not tuner.cache:
                continue
            seen.add(id(tuner))
            kernel = getattr(tuner, "kernel_name", None) or tuner.base_fn.__name__
            entry = files.setdefault(kernel, {"kernel_name": kernel, "autotune_entries": {}})
            for key, config in tuner.cache.items():
                as_dict = {"kwargs": dict(config.kwargs), "num_warps": config.num_warps,
                           "num_stages": config.num_stages, "num_ctas": getattr(config, "num_ctas", 1),
                           "maxnreg": getattr(config, "maxnreg", None)}
                entry["autotune_entries"][AutotuneKey.key_hash(list(key))] = {"autotune_key": list(key),
                                                                             "config": as_dict}
                entry.setdefault("default_config", as_dict)
    return files


def dump(out_dir: str) -> int:
    """Write :func:`chosen_configs` as ``out_dir/{kernel}.json``; the number of files."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    files = chosen_configs()
    for kernel, content in files.items():
        (out / f"{kernel}.json").write_text(json.dumps(content, indent=1, default=str) + "\n")
    return len(files)
