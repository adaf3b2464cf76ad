"""Run-like checkpoints for the multi-task tests (test_multitask.py, test_serve.py), built directly from tiny
models rather than trained (fast): what fairseq-train writes with --save-trainable-only (fairseq's Trainer
saves it: the trained tensors, the backbone's fingerprint, the cfg naming the backbone and the data), the trained
tensors moved by seeded noise so that every task computes its own function. No tests here.

    data = write_data(tmp / "data" / "MNLI", backbone, labels=["a", "b", "c"], pair=True)
    run = write_run(tmp / "runs" / "mnli-lora", "lora", data, backbone, seed=3)
"""

import shutil
from pathlib import Path

import torch

from fairseq_idpg.data.task_info import TaskInfo
from fairseq_idpg.methods import get_method

REPO = Path(__file__).resolve().parents[1]
# the tests' data sets: their label names (None: regression) and whether they read sentence pairs
LABELS = {
    "sst2": ["0", "1"],
    "rte": ["entailment", "not_entailment"],
    "mnli": ["contradiction", "entailment", "neutral"],
}
PAIR = {"sst2": False, "rte": True, "mnli": True, "stsb": True}


def write_runs(root, backbone, tasks):
    """{task: run folder} under ``root`` for ``tasks`` {name: (method record, data set)}, task i with seed i."""
    data = {d: write_data(root / "data" / d, backbone, LABELS.get(d), PAIR[d], name=d.upper()) for d in PAIR}
    return {
        name: write_run(root / "runs" / name, m, data[d], backbone, seed=i)
        for i, (name, (m, d)) in enumerate(tasks.items())
    }


def write_data(folder, backbone, labels=None, pair=False, name="SST-2"):
    """A prepared-data folder's three small files (input0/dict.txt, label/dict.txt, task.json) for the tiny
    ``backbone`` (a TinyBackbone); ``labels``: the label names (None: a regression task)."""
    folder = Path(folder)
    (folder / "input0").mkdir(parents=True)
    (folder / "label").mkdir()
    shutil.copy(backbone.folder / "dict.txt", folder / "input0" / "dict.txt")
    (folder / "label" / "dict.txt").write_text("".join(f"{label} 1\n" for label in labels or []))
    regression = labels is None
    info = TaskInfo(
        task=name, num_classes=1 if regression else len(labels), regression=regression, pair=pair,
        metric="pearson_spearman" if regression else "accuracy", splits={}, bpe="wordpiece", labels=labels,
    )  # fmt: skip
    info.write(folder)
    return folder


def write_run(save, method, data, backbone, seed, noise=0.1):
    """A run folder ``save`` with checkpoint_best.pt of method record ``method`` on ``data`` and the tiny
    ``backbone``, its trained tensors its initialisation plus ``noise`` x N(0, 1) (seeded)."""
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq.trainer import Trainer

    info = TaskInfo.read(data)
    sizes = [f"--{k.replace('_', '-')}={v}" for k, v in backbone.sizes.items()]
    argv = [str(data), "--user-dir", str(REPO / "fairseq_idpg"), *get_method(method).train_args(), *sizes]
    argv += ["--backbone", str(backbone.model_file)] if get_method(method).frozen_backbone else []
    argv += ["--criterion", "sentence_prediction_metrics", "--cpu"]
    argv += ["--num-classes", str(info.num_outputs), "--init-token", "0", "--separator-token", "2"]
    argv += ["--optimizer", "adam", "--lr", "1e-3", "--seed", str(seed), "--save-dir", str(save)]
    argv += ["--bpe", "wordpiece", "--wordpiece-vocab", str(backbone.folder / "vocab.txt")]
    argv += ["--regression-target"] if info.regression else []
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        cfg = convert_namespace_to_omegaconf(options.parse_args_and_arch(options.get_training_parser(), argv))
        task = tasks.setup_task(cfg.task)
        model = task.build_model(cfg.model)
        with torch.no_grad():
            for p in model.parameters():
                if p.requires_grad:
                    p.add_(noise * torch.randn_like(p))
    trainer = Trainer(cfg, task, model, task.build_criterion(cfg.criterion))
    trainer.optimizer  # noqa: B018 (built: its state is part of what fairseq saves)
    trainer._gathered_optim_state = None  # set by fairseq's training loop before its first save
    Path(save).mkdir(parents=True)
    trainer.save_checkpoint(str(Path(save) / "checkpoint_best.pt"), {})
    return Path(save)
