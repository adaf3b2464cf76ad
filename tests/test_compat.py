"""One test per fix in fairseq_idpg_compat (fairseq 0.12.2 on Python 3.11 / torch >= 2.6)."""

import argparse
import dataclasses
import subprocess
import sys

import pytest
import torch


def run_python(code):
    """A brand-new interpreter, as fairseq-train or a torchrun worker would be."""
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)


def test_hook_is_loaded_at_interpreter_start():
    out = run_python("import sys; print('fairseq_idpg_compat' in sys.modules, 'fairseq' in sys.modules)")
    assert out.returncode == 0, out.stderr
    # the .pth hook is active in every new process, and it does not import fairseq itself
    assert out.stdout.split() == ["True", "False"]


def test_fairseq_imports_in_a_fresh_process():
    out = run_python("import fairseq, fairseq_cli.train, fairseq.models.roberta; print(fairseq.__version__)")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "0.12.2"


@pytest.mark.skipif(sys.version_info < (3, 11), reason="the dataclass check is new in 3.11")
def test_dataclass_fix_is_limited_to_fairseq():
    import fairseq.dataclass.configs as configs

    assert configs.CommonConfig.__hash__ is object.__hash__

    @dataclasses.dataclass
    class Inner:
        x: int = 0

    # outside fairseq the Python 3.11 rule still holds
    with pytest.raises(ValueError, match="mutable default"):

        @dataclasses.dataclass
        class Outer:
            inner: Inner = Inner()


def _torch_version():
    return tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2])


def test_checkpoint_with_namespace_loads(tmp_path):
    """An old-style checkpoint (argparse.Namespace + numpy scalars, as roberta.large.tar.gz holds)."""
    import numpy as np
    from fairseq import checkpoint_utils, options

    args = options.parse_args_and_arch(
        options.get_training_parser(),
        [
            "/tmp/data",
            "--task",
            "sentence_prediction",
            "--num-classes",
            "2",
            "--arch",
            "roberta_base",
            "--criterion",
            "sentence_prediction",
        ],
    )
    path = tmp_path / "checkpoint.pt"
    torch.save(
        {
            "args": args,
            "model": {"w": torch.ones(2)},
            "optimizer_history": [
                {
                    "criterion_name": "SentencePredictionCriterion",
                    "optimizer_name": "FairseqAdam",
                    "lr_scheduler_state": {"best": np.float64(0.5)},
                    "num_updates": 3,
                }
            ],
            "extra_state": {"train_iterator": {"epoch": 1}, "val_loss": np.float64(0.5)},
        },
        path,
    )
    # torch's own default is untouched: from torch 2.6 on (weights_only=True) it refuses the Namespace ...
    if _torch_version() >= (2, 6):
        with pytest.raises(Exception, match="(?i)weights.only"):
            torch.load(path)
    # ... but fairseq's checkpoint loading reads it
    state = checkpoint_utils.load_checkpoint_to_cpu(str(path))
    assert state["cfg"].model.arch == "roberta_base"
    assert state["extra_state"]["val_loss"] == 0.5
    assert torch.equal(state["model"]["w"], torch.ones(2))


@pytest.mark.parametrize("argv,tpu", [(["--bf16"], False), (["--bf16", "--tpu"], True), ([], False)])
def test_bf16_does_not_imply_tpu(argv, tpu):
    from fairseq import options

    parser = options.get_training_parser()
    base = ["/tmp/data", "--task", "sentence_prediction", "--num-classes", "2", "--arch", "roberta_base"]
    args = options.parse_args_and_arch(parser, base + argv)
    assert args.tpu is tpu
    assert args.bf16 is ("--bf16" in argv)


def _tiny_layer():
    from fairseq.models.roberta.model import base_architecture
    from fairseq.models.transformer import TransformerConfig
    from fairseq.modules.transformer_layer import TransformerEncoderLayerBase

    args = argparse.Namespace(
        encoder_embed_dim=16, encoder_ffn_embed_dim=32, encoder_attention_heads=4, encoder_layers=1
    )
    base_architecture(args)
    args.dropout = args.attention_dropout = args.activation_dropout = 0.0
    return TransformerEncoderLayerBase(TransformerConfig.from_namespace(args))


def test_fast_path_duplicates_are_gone_and_old_checkpoints_load():
    torch.manual_seed(0)
    layer = _tiny_layer()
    names = {n for n, _ in layer.named_parameters()}
    assert not names & {"in_proj_weight", "fc1_weight", "out_proj_bias"}
    d, f = 16, 32
    expected = 4 * (d * d + d) + (d * f + f) + (f * d + d) + 2 * (2 * d)  # attn, fc1, fc2, 2 LayerNorms
    assert sum(p.numel() for p in layer.parameters()) == expected

    # a state dict written by stock fairseq 0.12.2 carries the copies: they are dropped on load
    state = {k: v.clone() for k, v in layer.state_dict().items()}
    state["in_proj_weight"] = torch.zeros(3 * d, d)
    state["fc1_weight"] = torch.zeros(f, d)
    other = _tiny_layer()
    other.load_state_dict(state, strict=True)
    other.eval()
    layer.eval()
    x = torch.randn(5, 2, d)  # T x B x C
    mask = torch.tensor([[False] * 5, [False] * 3 + [True] * 2])
    # after a load, eval mode runs the ordinary (patchable) path: same result as the original
    assert torch.allclose(other(x, mask), layer(x, mask), atol=1e-6)

    # and it really is the ordinary path: changing q_proj changes the output
    with torch.no_grad():
        other.self_attn.q_proj.weight.mul_(2.0)
    assert not torch.allclose(other(x, mask), layer(x, mask), atol=1e-4)


def _gather_worker(rank, init_file, out_dir):
    import torch.distributed as dist
    from fairseq.distributed import utils as distributed_utils

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    gathered = distributed_utils.all_gather_list({"rank": rank, "rows": torch.full((3, 2), float(rank))})
    torch.save(gathered, f"{out_dir}/rank{rank}.pt")
    dist.destroy_process_group()


def test_all_gather_list_works_on_gloo_cpu(tmp_path):
    """fairseq's all_gather_list allocated CUDA buffers: CPU multi-worker gathering crashed."""
    import torch.multiprocessing as mp

    mp.spawn(_gather_worker, args=(str(tmp_path / "init"), str(tmp_path)), nprocs=2, join=True)
    for rank in range(2):
        gathered = torch.load(tmp_path / f"rank{rank}.pt", weights_only=False)
        assert [g["rank"] for g in gathered] == [0, 1]
        assert torch.equal(gathered[1]["rows"], torch.ones(3, 2))


HYDRA_SCAN = """
import importlib.machinery
import sys
if hasattr(importlib.machinery.FileFinder, "find_module"):
    del importlib.machinery.FileFinder.find_module  # as Python 3.12 removed it
ours = [f for f in sys.meta_path if type(f).__name__ == "_PostImportFinder"]
sys.meta_path[:] = [f for f in sys.meta_path if f not in ours]
import hydra.core.plugins  # loaded past the hook, as pytest's hydra plugin does
if not {without_fix}:
    sys.meta_path[:0] = ours
    import fairseq.dataclass.utils  # noqa: F401  (fairseq's config code: the second chance)
from hydra.core.plugins import Plugins
from hydra.plugins.config_source import ConfigSource
print(sorted(s.__name__ for s in Plugins.instance().discover(ConfigSource)))
"""


@pytest.mark.parametrize("without_fix", [False, True])
def test_hydra_plugin_scan_without_find_module(without_fix):
    """Fix 7: hydra-core 1.0.7 scans plugins with ``find_module``, gone in Python 3.12 (simulated here
    on any Python by deleting it); with the fix the scan finds hydra's config sources, also when
    hydra was imported before the hook could see it (pytest's hydra plugin does that)."""
    out = subprocess.run(
        [sys.executable, "-c", HYDRA_SCAN.format(without_fix=without_fix)], capture_output=True, text=True
    )
    if without_fix:
        assert out.returncode != 0 and "find_module" in out.stderr
    else:
        assert out.returncode == 0, out.stderr[-2000:]
        assert "FileConfigSource" in out.stdout and "StructuredConfigSource" in out.stdout
