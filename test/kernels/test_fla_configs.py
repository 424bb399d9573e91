"""fla-core's shipped launch configurations: picked for the right GPU only, never
over the user's own settings, and in the file format fla-core reads."""

import json
import sys

import pytest
import torch

from flide_ext.kernels import fla_configs


@pytest.fixture
def gpu(monkeypatch):
    """A process that sees an H200 and has not imported fla, with fla's variables unset."""
    for name in ("FLA_CONFIG_DIR", "FLA_CACHE_MODE", "FLA_GPU_NAME"):
        monkeypatch.delenv(name, raising=False)
    for name in [m for m in sys.modules if m == "fla" or m.startswith("fla.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=0: "NVIDIA H200")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=0: (9, 0))
    return monkeypatch


def test_shipped_configs_used_on_their_gpu(gpu):
    import os

    assert fla_configs.use_shipped()
    assert os.environ["FLA_CONFIG_DIR"] == str(fla_configs.SHIPPED / "NVIDIA_H200")
    assert os.environ["FLA_CACHE_MODE"] == "full"


def test_another_gpu_of_the_architecture_uses_its_configs(gpu):
    """An H100 (no folder of its own) runs the H200's, a Hopper GPU as it is; a
    GPU of another architecture autotunes as before."""
    import os

    gpu.setattr(torch.cuda, "get_device_name", lambda index=0: "NVIDIA H100 80GB HBM3")
    assert fla_configs.use_shipped()
    assert os.environ["FLA_CONFIG_DIR"] == str(fla_configs.SHIPPED / "NVIDIA_H200")
    for name in ("FLA_CONFIG_DIR", "FLA_CACHE_MODE"):
        gpu.delenv(name)
    gpu.setattr(torch.cuda, "get_device_name", lambda index=0: "NVIDIA A100-SXM4-80GB")
    gpu.setattr(torch.cuda, "get_device_capability", lambda index=0: (8, 0))
    assert not fla_configs.use_shipped()
    assert "FLA_CONFIG_DIR" not in os.environ


@pytest.mark.parametrize("setting", [("FLA_CONFIG_DIR", "/elsewhere"), ("FLA_CACHE_MODE", "disabled"),
                                     ("FLA_GPU_NAME", "NVIDIA A100-SXM4-80GB")])
def test_user_settings_and_other_gpus_left_alone(gpu, setting):
    import os

    gpu.setenv(*setting)
    before = {name: os.environ.get(name) for name in ("FLA_CONFIG_DIR", "FLA_CACHE_MODE")}
    assert not fla_configs.use_shipped()
    assert {name: os.environ.get(name) for name in before} == before


def test_not_used_without_cuda_or_after_fla_import(gpu):
    gpu.setitem(sys.modules, "fla", object())
    assert not fla_configs.use_shipped()
    gpu.delitem(sys.modules, "fla")
    gpu.setattr(torch.cuda, "is_available", lambda: False)
    assert not fla_configs.use_shipped()


def test_gpu_dir_names_follow_fla():
    assert fla_configs.gpu_dir_name("NVIDIA H200") == "NVIDIA_H200"
    assert fla_configs.gpu_dir_name("NVIDIA H100 80GB HBM3") == "NVIDIA_H100_80GB_HBM3"
    assert fla_configs.gpu_dir_name("--") == "unknown_gpu"


def test_shipped_files_are_fla_config_files():
    files = sorted((fla_configs.SHIPPED / "NVIDIA_H200").glob("*.json"))
    # The kernels the GDN tree pass runs through fla-core.
    names = {f.stem for f in files}
    assert {"chunk_fwd_kernel_o", "chunk_gated_delta_rule_fwd_kkt_solve_kernel", "recompute_w_u_fwd_kernel",
            "chunk_local_cumsum_scalar_kernel", "l2norm_fwd_kernel"} <= names
    for f in files:
        content = json.loads(f.read_text())
        assert content["kernel_name"] == f.stem
        for config in [content["default_config"]] + [e["config"] for e in content["autotune_entries"].values()]:
            assert isinstance(config["kwargs"], dict) and config["num_warps"] in (1, 2, 4, 8, 16, 32)
            assert config["num_stages"] >= 1 and config["num_ctas"] == 1
