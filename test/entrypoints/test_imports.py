"""What importing Flide costs and registers: the CLI and the scheduler import
neither SGLang nor (for the CLI) torch, ``flide --help`` and a bad path are
answered before either loads, and ``sgl.decide`` is there in either order a
frontend program may import things in."""

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


def test_help_and_bad_paths_answer_without_the_heavy_imports(tmp_path):
    """``flide --help``, a model path that cannot load and an input that cannot be
    read are answered before torch, transformers or SGLang is imported."""
    no_config = tmp_path / "empty"
    no_config.mkdir()
    requests = tmp_path / "in.jsonl"
    requests.write_text('{"input": "x", "questions": []}\n')
    absent = str(tmp_path / "absent")
    cases = [(["--help"], 0, "usage: flide"),
             (["serve", "--help"], 0, "--model-path"),
             (["decide", "--model", str(no_config), "--input", absent], 2, "No such file or directory"),
             (["decide", "--model", absent, "--input", str(requests)], 2,
              "is neither a checkpoint directory nor a built-in model"),
             (["decide", "--model", str(no_config), "--input", str(requests)], 2, "has no config.json")]
    code = ("import sys, contextlib, io\n"
            "from flide_ext.entrypoints.cli import main\n"
            "err = io.StringIO()\n"
            "with contextlib.redirect_stderr(err), contextlib.redirect_stdout(err):\n"
            "    try:\n"
            "        rc = main(sys.argv[1:])\n"
            "    except SystemExit as e:\n"
            "        rc = e.code\n"
            "print(rc, [m for m in ('torch', 'transformers', 'sglang') if m in sys.modules], repr(err.getvalue()))\n")
    for argv, want_rc, want_text in cases:
        out = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr
        rc, rest = out.stdout.split(" ", 1)
        assert int(rc) == want_rc and rest.startswith("[] "), (argv, out.stdout)
        assert want_text in rest, (argv, out.stdout)
