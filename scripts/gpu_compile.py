"""Compile recorded Triton launches for the H200 (sm_90) without a GPU.

Run as a script (``python scripts/gpu_compile.py < launches.json``) in a process
without ``TRITON_INTERPRET``: under the interpreter ``triton.jit`` returns
interpreted functions and the compiler's frontend is not the one the GPU runs.
Input: a JSON list of ``{"module", "kernel", "signature", "constexprs",
"options"}``. Prints one line per launch; exits 1 naming the first launch that
does not compile.
"""

from __future__ import annotations

import importlib
import json
import os
import sys


def main() -> int:
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        print("gpu_compile.py: unset TRITON_INTERPRET", file=sys.stderr)
        return 2
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    target = GPUTarget("cuda", 90, 32)
    for launch in json.load(sys.stdin):
        kernel = getattr(importlib.import_module(launch["module"]), launch["kernel"])
        try:
            compiled = triton.compile(ASTSource(kernel, launch["signature"], launch["constexprs"]), target=target,
                                      options=launch["options"])
        except Exception as e:
            print(f"{launch['kernel']} {launch['constexprs']}: does not compile for sm_90: {e}", file=sys.stderr)
            return 1
        print(f"{launch['kernel']}: {len(compiled.asm['cubin'])} bytes of cubin", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
