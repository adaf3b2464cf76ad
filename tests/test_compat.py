"""One test per fix in fairseq_idpg_compat (fairseq 0.12.2 on Python 3.11 / torch >= 2.6)."""

import argparse
import dataclasses
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import tiny_sst2


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


# ---------------------------------------------------------------- 8, 9: checkpoint files complete or absent
def _training_state(updates, size=20000):
    return {
        "model": {"w": torch.arange(size, dtype=torch.float32) + updates},
        "optimizer_history": [{"num_updates": updates}],
        "extra_state": {"train_iterator": {"epoch": 1}},
    }


def _truncate(path, keep=0.3):
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


def test_checkpoint_copies_are_atomic(tmp_path, monkeypatch):
    """Fix 8: fairseq's copies (checkpoint_best.pt, checkpoint_last.pt) go through NAME.tmp and a rename;
    a copy cut short leaves the previous file whole."""
    import shutil

    from fairseq import checkpoint_utils

    src, dst = tmp_path / "checkpoint_1_4.pt", tmp_path / "checkpoint_last.pt"
    src.write_bytes(b"new" * 100000)
    dst.write_bytes(b"old" * 1000)
    real_copyfile = shutil.copyfile

    def cut_short(a, b):  # half of the bytes, then the process is stopped
        with open(b, "wb") as f:
            f.write(open(a, "rb").read()[:1000])
        raise KeyboardInterrupt

    monkeypatch.setattr(shutil, "copyfile", cut_short)
    with pytest.raises(KeyboardInterrupt):
        checkpoint_utils.PathManager.copy(str(src), str(dst), overwrite=True)
    assert dst.read_bytes() == b"old" * 1000 and sorted(p.name for p in tmp_path.iterdir()) == [src.name, dst.name]
    monkeypatch.setattr(shutil, "copyfile", real_copyfile)
    assert checkpoint_utils.PathManager.copy(str(src), str(dst), overwrite=True) is True
    assert dst.read_bytes() == src.read_bytes() and not (tmp_path / "checkpoint_last.pt.tmp").exists()


class _Trainer:
    """What fairseq's load_checkpoint asks of a trainer; records the file it is told to load."""

    checkpoint_suffix = ""

    def __init__(self):
        self.loaded = []

    def load_checkpoint(self, filename, *args, **kwargs):
        self.loaded.append(filename)
        return None

    def get_train_iterator(self, epoch, **kwargs):
        return argparse.Namespace(epoch=epoch)

    def lr_step(self, epoch):
        pass


def test_resume_from_damaged_last_takes_the_newest_intact_checkpoint(tmp_path, caplog):
    """Fix 9: a truncated checkpoint_last.pt is named and fairseq-train resumes from the newest intact
    checkpoint by its updates (not an older checkpoint_best.pt, not a damaged interval file, never an
    exported or temporary file); with none left, one line and exit status 2."""
    import logging

    from fairseq import checkpoint_utils
    from fairseq.dataclass.configs import CheckpointConfig

    from fairseq_idpg.errors import ConfigError
    from fairseq_idpg_compat import checkpoint_num_updates, resume_checkpoint

    for name, updates in [("checkpoint_best.pt", 2), ("checkpoint_1_4.pt", 4), ("checkpoint_1_5.pt", 5)]:
        torch.save(_training_state(updates), tmp_path / name)
    torch.save(_training_state(99), tmp_path / "checkpoint_last_exported.pt")  # not a resume point
    torch.save(_training_state(6), tmp_path / "checkpoint_last.pt")
    (tmp_path / "checkpoint_last.pt.tmp").write_bytes(b"partial")
    cfg, last = CheckpointConfig(save_dir=str(tmp_path)), tmp_path / "checkpoint_last.pt"

    trainer = _Trainer()
    checkpoint_utils.load_checkpoint(cfg, trainer)  # intact: fairseq's own choice
    assert trainer.loaded == [str(last)] and checkpoint_num_updates(last) == 6

    _truncate(last)
    _truncate(tmp_path / "checkpoint_1_5.pt")
    size = f"{last.stat().st_size:,} bytes"
    with pytest.raises(ValueError, match=rf"checkpoint_last\.pt is damaged \(truncated or unreadable: .*; {size}\)$"):
        checkpoint_num_updates(last)
    assert resume_checkpoint(last)[:2] == (str(tmp_path / "checkpoint_1_4.pt"), 4)
    trainer = _Trainer()
    with caplog.at_level(logging.WARNING):
        checkpoint_utils.load_checkpoint(cfg, trainer)
    assert trainer.loaded == [str(tmp_path / "checkpoint_1_4.pt")] and "load_checkpoint" not in vars(trainer)
    (warning,) = [r.getMessage() for r in caplog.records if "damaged" in r.getMessage()]
    assert warning.startswith(f"{last} is damaged (truncated or unreadable: ") and warning.endswith(
        f"; {size}); resuming from the newest intact checkpoint {tmp_path / 'checkpoint_1_4.pt'} (update 4); "
        "the next save replaces checkpoint_last.pt"
    )

    for name in ("checkpoint_best.pt", "checkpoint_1_4.pt"):
        _truncate(tmp_path / name)
    with pytest.raises(ConfigError) as refused:  # fairseq-train says it in one line (fix 10), exit status 2
        checkpoint_utils.load_checkpoint(cfg, _Trainer())
    err = str(refused.value)
    assert err.startswith(f"--save-dir {tmp_path}: checkpoint_last.pt is damaged (truncated ")
    assert err.endswith(f"; {size}) and no intact checkpoint is left to resume from; remove it to train from the start")


def test_resume_leaves_a_path_it_cannot_open_to_fairseq(tmp_path, monkeypatch):
    """Fix 9 reads checkpoint_last.pt only when it can open it; otherwise fairseq's own load_checkpoint runs
    untouched (fairseq's test_train.py mocks ``os.path.join``, and a MagicMock would open as file descriptor 1)."""
    from unittest.mock import MagicMock

    from fairseq import checkpoint_utils
    from fairseq.dataclass.configs import CheckpointConfig

    import fairseq_idpg_compat

    consulted = []
    monkeypatch.setattr(fairseq_idpg_compat, "resume_checkpoint", lambda *a, **k: consulted.append(a))
    joined = MagicMock()
    monkeypatch.setattr("os.path.join", MagicMock(return_value=joined))
    monkeypatch.setattr("os.path.isfile", MagicMock(return_value=True))
    trainer = _Trainer()
    checkpoint_utils.load_checkpoint(CheckpointConfig(save_dir=str(tmp_path)), trainer)
    assert consulted == [] and trainer.loaded == [joined]  # fairseq's own choice, as without the compat


def test_fp16_optimizer_builds_its_fp32_copy_on_the_cpu():
    """Fix 11: the flat fp32 master copy of fp16 parameters on the CPU, keyed by their device index (None)."""
    from fairseq.optim import FP16Optimizer

    params = [torch.nn.Parameter(torch.randn(3, 2).half()), torch.nn.Parameter(torch.randn(4).half())]
    fp32 = FP16Optimizer.build_fp32_params(argparse.Namespace(), params)
    assert list(fp32) == [None]  # what _sync_fp16_grads_to_fp32 looks up: p.device.index
    assert fp32[None].dtype == torch.float32 and fp32[None].device == params[0].device
    assert torch.equal(fp32[None].data, torch.cat([p.data.reshape(-1).float() for p in params]))
    assert torch.equal(fp32[None].grad, torch.zeros(10))
    per_param = FP16Optimizer.build_fp32_params(argparse.Namespace(), params, flatten=False)  # bf16's choice
    assert [p.dtype for p in per_param] == [torch.float32] * 2


def test_trainer_overflow_fix_changes_only_the_overflow_line():
    """Fix 11's stand-in for ``fairseq.trainer``'s ``torch`` (where torch has no CUDA) differs from torch in
    ``tensor`` only, and trainer.py calls ``torch.tensor`` once: the overflow branch's ``torch.tensor(0.0).cuda()``.
    A fairseq with another call fails here rather than getting host tensors there."""
    import inspect

    import fairseq.trainer as trainer

    assert re.findall(r"torch\.tensor\(.*", inspect.getsource(trainer)) == ["torch.tensor(0.0).cuda()"]
    if torch.cuda.is_available():
        assert trainer.torch is torch
        return
    for name in ("Tensor", "cuda", "no_grad", "float16", "distributed", "autograd", "isfinite"):
        assert getattr(trainer.torch, name) is getattr(torch, name)
    grad_norm = trainer.torch.tensor(0.0).cuda()
    assert type(grad_norm) is torch.Tensor and grad_norm.device.type == "cpu" and grad_norm.item() == 0.0


KILL_DURING_LAST_COPY = """
import os, shutil, sys
copyfile, calls = shutil.copyfile, []
def copy_then_die(src, dst):  # the second copy to checkpoint_last.pt (update 4): half of it, then kill -9
    calls.append(dst)
    if dst.endswith("checkpoint_last.pt.tmp") and sum(c.endswith("last.pt.tmp") for c in calls) == 2:
        with open(dst, "wb") as f:
            f.write(open(src, "rb").read()[: os.path.getsize(src) // 2])
        os._exit(137)
    return copyfile(src, dst)
shutil.copyfile = copy_then_die
from fairseq_cli.train import cli_main
sys.argv = ["fairseq-train", *sys.argv[1:]]
cli_main()
"""


@pytest.mark.slow
def test_killed_during_checkpoint_copy_then_resumed_from_intact_checkpoints(tmp_path, tiny, caplog):
    """fairseq-train (tiny backbone, 6 updates, saves at 2, 4, 6) is killed half-way through copying
    checkpoint_last.pt at update 4: checkpoint_last.pt is still the whole update-2 file. Truncated by hand
    (what stock fairseq's plain copy left), the same command names it, resumes from checkpoint_1_4.pt and
    ends at update 6 (resuming itself is bit-exact: tests/test_run.py). The killed run is a process of its own
    (it ends by ``os._exit``); the resumed one is fairseq-train's ``main`` in this process, its log read from the
    log records."""
    import logging

    from checkpoint_support import fairseq_train

    from fairseq_idpg_compat import checkpoint_num_updates

    data, dims = tiny_sst2(tmp_path, tiny)

    def train(save, code):
        # fmt: off
        args = [str(data), "--user-dir", str(Path(__file__).resolve().parents[1] / "fairseq_idpg"),
                "--task", "sentence_prediction", "--criterion", "sentence_prediction", "--num-classes", "2",
                "--arch", "roberta", *dims, "--finetune-from-model", str(tiny.model_file),
                "--init-token", "0", "--separator-token", "2", "--dropout", "0", "--attention-dropout", "0",
                "--optimizer", "adam", "--lr", "1e-3", "--batch-size", "4", "--max-update", "6", "--cpu",
                "--save-dir", str(save), "--no-epoch-checkpoints", "--save-interval-updates", "2",
                "--keep-interval-updates", "1", "--validate-interval-updates", "2", "--seed", "1",
                "--num-workers", "0", "--log-format", "simple", "--log-interval", "1"]
        # fmt: on
        if code is None:
            with caplog.at_level(logging.INFO):
                fairseq_train(args)
            return "\n".join(caplog.messages)
        return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=300)

    save = tmp_path / "killed"
    out = train(save, KILL_DURING_LAST_COPY)
    assert out.returncode == 137, out.stderr[-3000:]
    last = save / "checkpoint_last.pt"
    assert checkpoint_num_updates(last) == 2 and checkpoint_num_updates(save / "checkpoint_1_4.pt") == 4
    assert (save / "checkpoint_last.pt.tmp").is_file()  # the copy that was cut short: a temporary only

    _truncate(last, keep=0.5)
    size = last.stat().st_size
    log = train(save, None)
    assert f"{last} is damaged (truncated or unreadable: " in log
    fallback = save / "checkpoint_1_4.pt"
    assert f"; {size:,} bytes); resuming from the newest intact checkpoint {fallback} (update 4)" in log
    assert "num_updates=5" in log and "num_updates=3" not in log  # it went on from update 4
    assert sorted(p.name for p in save.iterdir()) == ["checkpoint_1_6.pt", "checkpoint_best.pt", "checkpoint_last.pt"]
    assert checkpoint_num_updates(last) == 6  # and the leftover temporary was replaced by the next copy


def test_fp16_training_on_the_cpu_skips_overflowing_updates(tmp_path, tiny, caplog):
    """Fix 11 in fairseq-train: ``--cpu --fp16`` (M-IDPG-PHM, frozen tiny backbone) with a loss scale of 2^40
    overflows, skips those updates halving the scale, then makes its 3 updates (it crashed on ``.cuda()``).
    fairseq-train's ``main`` runs in this process (the fix patches fairseq's modules as they are imported, here
    as in a new process); its log is read from the log records."""
    import logging

    from checkpoint_support import fairseq_train

    data, dims = tiny_sst2(tmp_path, tiny)
    # fmt: off
    args = [str(data), "--user-dir", str(Path(__file__).resolve().parents[1] / "fairseq_idpg"),
            "--task", "sentence_prediction", "--criterion", "sentence_prediction", "--num-classes", "2",
            "--arch", "roberta_idpg", "--idpg-preset", "m-idpg-phm", "--idpg-cache", "memory", *dims,
            "--backbone", str(tiny.model_file), "--init-token", "0", "--separator-token", "2",
            "--optimizer", "adam", "--lr", "1e-3", "--batch-size", "4", "--max-update", "3", "--cpu",
            "--fp16", "--fp16-init-scale", str(2**40), "--no-save", "--disable-validation", "--seed", "1",
            "--num-workers", "0", "--log-format", "simple", "--log-interval", "1"]
    # fmt: on
    with caplog.at_level(logging.INFO):
        fairseq_train(args)
    log = "\n".join(caplog.messages)
    scales = [
        float(x)
        for x in re.findall(r"gradient overflow detected, ignoring gradient, setting loss scale to: (\S+)", log)
    ]
    assert scales and scales[0] == 2.0**39 and all(b == a / 2 for a, b in zip(scales, scales[1:], strict=False))
    assert "num_updates 3 " in log and f"loss_scale {scales[-1]:g} " in log


OPTIMIZER_WITHOUT_COMPILER = """
import sys

import torch
from fairseq.optim.adam import Adam

p = torch.nn.Parameter(torch.zeros(3))
adam = Adam([p], lr=0.1)  # fairseq's (compat fix 14's foreach update)
p.grad = torch.ones(3)
adam.step()
adam.zero_grad()
adam.load_state_dict(adam.state_dict())
print("torch._dynamo" in sys.modules, torch.allclose(p, torch.full((3,), -0.1)))  # one Adam step of lr 0.1
import torch._dynamo  # as torch.compile would: from now on torch's own disable wraps the methods

adam.zero_grad()
cached = getattr(torch.optim.Optimizer.zero_grad.__wrapped__, "__dynamo_disable")
print(getattr(cached, "_fairseq_idpg_compat", False))
"""


def test_an_optimizer_is_built_and_saved_without_importing_the_compiler():
    """Fix 16: building, stepping, zeroing, saving and loading fairseq's Adam in a fresh process never imports
    torch._dynamo (about 2 s of CPU per fairseq-train); once it is imported, torch's own disable takes over."""
    out = run_python(OPTIMIZER_WITHOUT_COMPILER)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "True", "False"]


# ---------------------------------------------------------------------------------------- 20. tensorboard when asked
TENSORBOARD_WHEN_ASKED = """
import os, sys, tempfile

import fairseq_cli.train, fairseq_cli.validate  # every fairseq module a run imports, its tasks among them
from fairseq.logging import progress_bar

print("tensorboardX" in sys.modules)
logdir = tempfile.mkdtemp()
bar = progress_bar.progress_bar(iter([1]), log_format="json", tensorboard_logdir=logdir)
bar.log({"loss": 1.5}, tag="train", step=1)  # --tensorboard-logdir: fairseq's writer, tensorboardX's own
print("tensorboardX" in sys.modules, any(f.startswith("events.") for f in os.listdir(os.path.join(logdir, "train"))))
import tensorboardX

print(type(progress_bar._tensorboard_writers["train"]) is tensorboardX.SummaryWriter)
"""


def test_fairseq_imports_tensorboardx_only_for_a_run_that_logs_to_tensorboard():
    """Fix 20: a fresh process that imports fairseq-train's and fairseq-validate's modules has not imported
    tensorboardX (about 0.5 s of CPU); a progress bar with a TensorBoard folder writes its events through
    tensorboardX's own writer."""
    out = run_python(TENSORBOARD_WHEN_ASKED)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "True", "True", "True"], out.stdout


# ---------------------------------------------------------------------------------------- 17. compose without hydra
def _train_args(capsys, tmp_path, method, *flags):
    """The fairseq-train arguments run.sh gives ``method`` on RTE at roberta.base's shape (a dry run: no files)."""
    from fairseq_idpg.run import main

    assert main(["RTE", "--method", method, "--model", "roberta.base", *flags, "--dry-run",
                 "--work-dir", str(tmp_path)]) == 0  # fmt: skip
    line = next(s for s in capsys.readouterr().out.splitlines() if s.startswith("+ ") and "fairseq_idpg.launch" in s)
    words = shlex.split(line[2:])
    return words[words.index("--") + 1 :] + ["--cpu"]


def _both_ways(monkeypatch, args, hydra_compose):
    """fairseq's configuration of ``args`` composed by fix 17 and by ``hydra_compose``, as containers."""
    from fairseq.dataclass import utils
    from omegaconf import OmegaConf

    fast = OmegaConf.to_container(utils.convert_namespace_to_omegaconf(args))
    with monkeypatch.context() as m:
        m.setattr(utils, "compose", hydra_compose)
        slow = OmegaConf.to_container(utils.convert_namespace_to_omegaconf(args))
    return fast, slow


def test_fairseqs_config_of_every_method_is_hydras_without_its_compose(capsys, tmp_path, monkeypatch):
    """Fix 17: every method's fairseq-train configuration (and fp16's, bf16's, an IDPG run's with extra flags) and
    fairseq-validate's are equal, value for value and type for type, to hydra's compose, and hydra's compose is
    not called for them."""
    from fairseq import options
    from fairseq.dataclass import utils

    from fairseq_idpg.methods import METHODS

    commands = [_train_args(capsys, tmp_path, name) for name in sorted(METHODS)]
    commands.append(_train_args(capsys, tmp_path, "lora", "--fp16"))
    commands.append(_train_args(capsys, tmp_path, "m-idpg-phm", "--bf16", "--idpg-hidden", "256", "--no-save"))
    called = []
    hydra_compose = utils.compose.hydra_compose
    monkeypatch.setattr(utils.compose, "hydra_compose", lambda *a, **k: called.append(a) or hydra_compose(*a, **k))
    distinct = {}  # one command per choice of config groups (hydra's compose takes ~2 s each)
    for argv in commands:
        args = options.parse_args_and_arch(options.get_training_parser(), input_args=argv)
        groups = (args.task, args.arch, args.criterion, args.optimizer, args.lr_scheduler, args.fp16, args.bf16)
        distinct.setdefault(groups, (argv, args))
    assert len(distinct) >= 6
    for argv, args in distinct.values():
        fast, slow = _both_ways(monkeypatch, args, hydra_compose)
        assert called == [] and repr(fast) == repr(slow) and fast == slow, argv  # repr: 1 and 1.0 differ
    validate = ["data", "--path", "checkpoint_best.pt", "--task", "sentence_prediction", "--num-classes", "2",
                "--criterion", "sentence_prediction", "--valid-subset", "valid,test", "--batch-size", "8"]  # fmt: skip
    for suppress in (False, True):  # fairseq-validate composes its arguments and, apart, those given
        args = options.parse_args_and_arch(options.get_validation_parser(), input_args=validate,
                                           suppress_defaults=suppress)  # fmt: skip
        fast, slow = _both_ways(monkeypatch, args, hydra_compose)
        assert called == [] and repr(fast) == repr(slow), suppress


def test_what_the_direct_compose_leaves_to_hydra_gets_hydras_error():
    """Fix 17: a configuration it refuses (polynomial_decay without --total-num-update) is composed by hydra, whose
    error names the field, as before; an override that adds a key goes to hydra too."""
    from fairseq import options
    from fairseq.dataclass import utils

    import fairseq_idpg_compat

    argv = ["data", "--task", "sentence_prediction", "--arch", "roberta_base", "--num-classes", "2", "--criterion",
            "sentence_prediction", "--optimizer", "adam", "--lr-scheduler", "polynomial_decay"]  # fmt: skip
    args = options.parse_args_and_arch(options.get_training_parser(), input_args=argv)
    with pytest.raises(Exception, match="total_num_update"):
        utils.convert_namespace_to_omegaconf(args)
    assert fairseq_idpg_compat.composed_config(["+common.new_key=1"]) is None


def test_fairseqs_per_run_state_is_each_runs_own():
    """Fix 18: the metrics' aggregators, save_checkpoint.best and should_stop_early's best and patience are the
    current run's: two runs (contexts given ``new_run``) and the process's own run never see each other's; a
    process that starts no run sees fairseq's behaviour (the functions' attributes as attributes)."""
    import contextvars

    import fairseq_cli.train as train
    from fairseq import checkpoint_utils
    from fairseq.logging import metrics

    import fairseq_idpg_compat

    def a_run(loss, best):
        fairseq_idpg_compat.new_run()
        metrics.reset()
        with metrics.aggregate("train"):
            metrics.log_scalar("loss", loss)
        checkpoint_utils.save_checkpoint.best = best
        train.should_stop_early.best, train.should_stop_early.num_runs = best, 1
        return lambda: (
            metrics.get_smoothed_values("train")["loss"],
            checkpoint_utils.save_checkpoint.best,
            (train.should_stop_early.best, train.should_stop_early.num_runs),
        )

    process = (list(metrics._aggregators), hasattr(checkpoint_utils.save_checkpoint, "best"))
    first, second = contextvars.Context(), contextvars.Context()
    read_first, read_second = first.run(a_run, 1.5, 70.0), second.run(a_run, 2.5, 80.0)
    assert first.run(read_first) == (1.5, 70.0, (70.0, 1))
    assert second.run(read_second) == (2.5, 80.0, (80.0, 1))
    assert (list(metrics._aggregators), hasattr(checkpoint_utils.save_checkpoint, "best")) == process
    assert not hasattr(train.should_stop_early, "num_runs")
    # the process's run: fairseq's own patience logic, on attributes kept in the process's state
    cfg = argparse.Namespace(checkpoint=argparse.Namespace(patience=1, maximize_best_checkpoint_metric=True))
    try:
        assert [train.should_stop_early(cfg, v) for v in (0.5, 0.6, 0.4)] == [False, False, True]
        assert train.should_stop_early.best == 0.6
        assert first.run(read_first)[2] == (70.0, 1)  # the first run's untouched
    finally:
        del train.should_stop_early.best, train.should_stop_early.num_runs
