"""Run-like checkpoints of untrained methods, for the multi-task tests and scripts/bench_serving.py: what
fairseq-train writes with --save-trainable-only (fairseq's Trainer saves it: the trained tensors, the backbone's
fingerprint, the cfg naming the backbone and the data), the trained tensors their initialisation moved by seeded
noise so that every task computes its own function. Their predictions mean nothing; their speed and memory are
those of trained runs.

    data = write_data("work/data/MNLI", "models/minilm-l6-fairseq/dict.txt", labels=["a", "b", "c"], pair=True)
    run = write_run("work/runs/mnli-lora", "lora", data, "models/minilm-l6-fairseq/model.pt", seed=3,
                    sizes={"encoder_layers": 6, ...}, vocab="models/minilm-l6-fairseq/vocab.txt")
"""

import os
import shutil
from pathlib import Path

import torch

from fairseq_idpg.data.task_info import TaskInfo
from fairseq_idpg.methods import get_method

USER_DIR = Path(__file__).resolve().parents[1]


def write_data(folder, dictionary, labels=None, pair=False, name="SST-2"):
    """A prepared-data folder's three small files (input0/dict.txt: a copy of ``dictionary``, label/dict.txt,
    task.json); ``labels``: the label names (None: a regression task)."""
    folder = Path(folder)
    (folder / "input0").mkdir(parents=True)
    (folder / "label").mkdir()
    shutil.copy(dictionary, folder / "input0" / "dict.txt")
    (folder / "label" / "dict.txt").write_text("".join(f"{label} 1\n" for label in labels or []))
    regression = labels is None
    info = TaskInfo(
        task=name, num_classes=1 if regression else len(labels), regression=regression, pair=pair,
        metric="pearson_spearman" if regression else "accuracy", splits={}, bpe="wordpiece", labels=labels,
    )  # fmt: skip
    info.write(folder)
    return folder


def write_run(save, method, data, backbone, seed, sizes, vocab, noise=0.1, model_options=None):
    """A run folder ``save`` with checkpoint_best.pt of method record ``method`` on ``data`` and ``backbone``
    (its encoder ``sizes``: encoder_layers, ...; ``vocab``: its WordPiece vocab.txt), its trained tensors their
    initialisation plus ``noise`` x N(0, 1) (seeded). ``model_options``: more model options by name (GloVe's file)."""
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq.trainer import Trainer

    info = TaskInfo.read(data)
    argv = [str(data), "--user-dir", str(USER_DIR), *get_method(method).train_args()]
    argv += [f"--{k.replace('_', '-')}={v}" for k, v in {**sizes, **(model_options or {})}.items()]
    argv += ["--backbone", os.fspath(backbone)] if get_method(method).frozen_backbone else []
    argv += ["--criterion", "sentence_prediction_metrics", "--cpu"]
    argv += ["--num-classes", str(info.num_outputs), "--init-token", "0", "--separator-token", "2"]
    argv += ["--optimizer", "adam", "--lr", "1e-3", "--seed", str(seed), "--save-dir", str(save)]
    argv += ["--bpe", "wordpiece", "--wordpiece-vocab", os.fspath(vocab)]
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
