"""``pip install .`` into a fresh virtual environment made of the lock's
distributions, as into an existing SGLang environment: flide's requirements and
extras resolve against what is there with no index, ``pip check`` names nothing
but what requirements/omitted.txt lists, the plugin loads from the installed
package, and both SGLang launchers answer ``/v1/decisions``.

The environment is a venv without pip of its own whose site-packages has a
``.pth`` line naming a folder of links to every distribution of this checkout's
``.venv`` (installed by scripts/setup.sh from requirements/lock.txt) except
flide's own editable install; the test checks that the venv sees exactly the
lock's distributions at the lock's versions (and pip), so it is the lock's
environment, without copying gigabytes.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sysconfig
import venv
from pathlib import Path

import pytest
import requests
from packaging.utils import canonicalize_name

from flide_ext import Engine

from .helpers.decisions import choice
from .helpers.processes import quiet_env, start_server

ROOT = Path(__file__).resolve().parents[1]
LOCK = ROOT / "requirements" / "lock.txt"
OMITTED = ROOT / "requirements" / "omitted.txt"
# flide's own editable install in .venv (scripts/setup.sh): left out of the fresh venv.
OWN = re.compile(r"^(flide-[^/]*\.dist-info|__editable__[._]+flide.*)$")


def _entries(path: Path) -> list:
    # The non-comment lines of a requirements file.
    return [line for line in (raw.split("#")[0].strip() for raw in path.read_text().splitlines()) if line]


def _pins() -> dict:
    return {canonicalize_name(name): version for name, version in (e.split("==") for e in _entries(LOCK))}


def _omitted() -> set:
    return {tuple(canonicalize_name(n) for n in e.split()) for e in _entries(OMITTED)}


@pytest.fixture(scope="module")
def fresh_venv(tmp_path_factory):
    """``(python, bin dir, working dir)`` of a venv with the lock's distributions
    and ``pip install .`` done in it."""
    base = tmp_path_factory.mktemp("install")
    view = base / "lock"
    view.mkdir()
    site = Path(sysconfig.get_paths()["purelib"])  # this interpreter's: .venv's
    for entry in site.iterdir():
        if not OWN.match(entry.name) and entry.name != "__pycache__":
            (view / entry.name).symlink_to(entry)
    env_dir = base / "venv"
    venv.create(env_dir, with_pip=False)
    python = env_dir / "bin" / "python"
    env_site = Path(subprocess.check_output(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], text=True).strip())
    (env_site / "lock.pth").write_text(f"{view}\n")
    # A copy of the sources: the build writes build/ and an egg-info beside them.
    source = base / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(ROOT / "flide_ext", source / "flide_ext", ignore=shutil.ignore_patterns("__pycache__"))
    # --no-deps: SGLang's own requirements include the GPU packages the lock
    # omits, which a resolver would look for; flide's are checked below.
    install = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-index", "--no-deps",
         "--no-build-isolation", str(source)],
        capture_output=True, text=True, cwd=base, env=quiet_env(), timeout=600)
    assert install.returncode == 0, install.stdout + install.stderr
    return python, env_dir / "bin", base


def _run(python, code: str, cwd) -> str:
    done = subprocess.run([str(python), "-c", code], capture_output=True, text=True, cwd=cwd, env=quiet_env(),
                          timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_venv_is_the_lock_and_flide_is_installed_from_source(fresh_venv):
    python, _, cwd = fresh_venv
    seen = json.loads(_run(python, "import json, importlib.metadata as m; print(json.dumps("
                                   "{d.metadata['Name']: d.version for d in m.distributions()}))", cwd))
    # The lock's distributions at its versions, and nothing else but flide and
    # the installer (pip, which the lock leaves to the environment).
    seen = {canonicalize_name(k): v for k, v in seen.items() if canonicalize_name(k) not in ("flide", "pip")}
    assert seen == _pins()
    where = _run(python, "import flide_ext, sys; print(flide_ext.__file__); print(sys.prefix)", cwd).split()
    assert where[0].startswith(where[1]) and "/src/" not in where[0]  # the venv's copy, not the sources
    # Package data too: fla-core's tuned configurations (flide_ext/kernels/fla_configs.py).
    installed = _run(python, "import flide_ext.kernels, pathlib; print(len(list(pathlib.Path("
                             "flide_ext.kernels.__file__).parent.glob('fla_configs/*/*.json'))))", cwd)
    assert int(installed) == len(list((ROOT / "flide_ext" / "kernels").glob("fla_configs/*/*.json"))) > 0


def test_flide_requirements_and_extras_hold(fresh_venv):
    """Each requirement of the installed flide, its server, checkpoints, bench and
    test extras too, is met by the lock's versions (fla-core, the gpu extra, is for
    GPU machines)."""
    python, _, cwd = fresh_venv
    unmet = json.loads(_run(python, """
import json, importlib.metadata as m
from packaging.requirements import Requirement
unmet = []
for text in m.requires("flide"):
    req = Requirement(text)
    for extra in ("", "server", "checkpoints", "bench", "test"):
        if req.marker is None and extra or req.marker is not None and not req.marker.evaluate({"extra": extra}):
            continue
        try:
            version = m.version(req.name)
        except m.PackageNotFoundError:
            version = None
        if version is None or not req.specifier.contains(version, prereleases=True):
            unmet.append([text, version])
print(json.dumps(unmet))""", cwd))
    assert unmet == []


def test_pip_check_names_only_what_the_lock_omits(fresh_venv):
    python, _, cwd = fresh_venv
    check = subprocess.run([str(python), "-m", "pip", "check", "--disable-pip-version-check"], capture_output=True,
                           text=True, cwd=cwd, env=quiet_env(), timeout=300)
    lines = [line for line in check.stdout.splitlines() if line.strip()]
    missing, other = set(), []
    for line in lines:
        m = re.fullmatch(r"(\S+) \S+ requires (\S+), which is not installed\.", line)
        if m:
            missing.add((canonicalize_name(m.group(1)), canonicalize_name(m.group(2))))
        else:
            other.append(line)
    assert other == []  # no version conflict, nothing about flide
    assert not any(dist == "flide" for dist, _ in missing)
    assert missing == _omitted(), (sorted(missing - _omitted()), sorted(_omitted() - missing))


def test_the_plugin_loads_from_the_installed_package(fresh_venv):
    python, bin_dir, cwd = fresh_venv
    out = _run(python, "from importlib.metadata import entry_points\n"
                       "(ep,) = entry_points(group='sglang.srt.plugins', name='flide')\n"
                       "import sys; f = ep.load(); print(f.__module__, sys.modules[f.__module__].__file__, sys.prefix)",
               cwd).split()
    assert out[0] == "flide_ext.entrypoints.sglang_plugin" and out[1].startswith(out[2])
    run = subprocess.run([str(bin_dir / "flide"), "--help"], capture_output=True, text=True, cwd=cwd,
                         env=quiet_env(), timeout=120)
    assert run.returncode == 0 and "decide" in run.stdout


def _sglang_script(python, bin_dir, cwd) -> Path:
    # SGLang's console script as pip writes it from SGLang's entry point (SGLang is
    # one of the lock's distributions, not installed into this venv).
    target = _run(python, "from importlib.metadata import entry_points\n"
                          "(ep,) = entry_points(group='console_scripts', name='sglang'); print(ep.value)", cwd).strip()
    module, attr = target.split(":")
    script = bin_dir / "sglang"
    # (The guard: the server's processes start by spawn, which runs this file again.)
    script.write_text(f"#!{python}\nimport sys\nfrom {module} import {attr}\n"
                      f"if __name__ == '__main__':\n    sys.exit({attr}())\n")
    script.chmod(0o755)
    return script


@pytest.mark.parametrize("launcher", ["launch_server", "sglang serve"])
def test_both_launchers_answer_decisions(fresh_venv, char_model_dir, tmp_path, launcher):
    python, bin_dir, cwd = fresh_venv
    command = ([str(python), "-m", "sglang.launch_server"] if launcher == "launch_server"
               else [str(_sglang_script(python, bin_dir, cwd)), "serve"])
    proc, url, log = start_server([*command, "--decision-mode", "--model-path", str(char_model_dir)], tmp_path,
                                  cwd=cwd)
    try:
        request = {"input": "Rain is wet.", "questions": [choice("a", 2, "Pick")]}
        r = requests.post(f"{url}/v1/decisions", json=request, timeout=120)
        assert r.status_code == 200, r.text
        got = r.json()["answers"]["a"]["probabilities"]
        want = Engine(str(char_model_dir)).decide(request).answers["a"].probabilities
        assert got.keys() == want.keys() and all(abs(got[k] - want[k]) <= 1e-6 for k in want)
        assert requests.get(f"{url}/server_info", timeout=30).json()["decision_mode"] is True
    finally:
        proc.terminate()
        proc.wait(30)
