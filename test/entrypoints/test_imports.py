"""What importing Flide costs and registers: the CLI and the scheduler import
neither SGLang nor (for the CLI) torch, and ``sgl.decide`` is there in either
order a frontend program may import things in."""

from __future__ import annotations

import subprocess
import sys


def _run(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_the_cli_and_the_scheduler_import_no_sglang():
    loaded = _run("import sys, flide_ext.entrypoints.cli; print('sglang' in sys.modules, 'torch' in sys.modules); "
                  "import flide_ext.server.scheduler, flide_ext.runtime.engine; "
                  "print('sglang' in sys.modules, 'torch' in sys.modules)")
    assert loaded.split() == ["False", "False", "False", "True"], loaded


def test_sgl_decide_is_registered_in_either_import_order():
    from flide_ext.entrypoints.lang import decide

    name = f"{decide.__module__}.{decide.__qualname__}"
    after = _run("import sglang, flide_ext; print(sglang.decide.__module__ + '.' + sglang.decide.__qualname__, "
                 "flide_ext.Engine.__name__, flide_ext.RequestError.__name__)")
    assert after == f"{name} Engine RequestError"  # the package's names, imported on first use
    before = _run("import flide_ext, sglang; had = hasattr(sglang, 'decide'); "
                  "from flide_ext.entrypoints.lang import FlideEndpoint; print(had, sglang.decide.__qualname__)")
    assert before == f"False {decide.__qualname__}"
