"""One trained run attached by name: its preprocessing and labels (what the hub uses for it alone), its trained
tensors, and the key of the method configuration it shares a forward with.

    task, model = load_run("sst2", "checkpoints/standin/SST-2/lora/lr2e-4.seed1.0123abcd",
                           backbone="models/minilm-l6-fairseq/model.pt", bpe="wordpiece", wordpiece_vocab=...)

The run loads through fairseq's hub (``RobertaModel.from_pretrained``), as docs/using.md loads one task: the
backbone's fingerprint is checked, the BPE and sentence-pair layout are the task's own. A run is a run folder
(``checkpoint_best.pt``), a folder of a shared checkpoint (``model.pt`` beside ``task.json``), or a checkpoint
file; its prepared-data files come from ``data`` when given, else from the run's folder when it holds
``task.json``, else from the folder its training read (recorded in the checkpoint).
"""

import argparse
import hashlib
import itertools
import os
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import torch
from fairseq.models.roberta.hub_interface import RobertaHubInterface

from fairseq_idpg.errors import ConfigError
from fairseq_idpg.models.frozen_roberta import FrozenBackboneRobertaModel
from fairseq_idpg.tasks.model_protocol import task_info, task_is_pair

HEAD = "sentence_classification_head"  # the head fairseq-train registers (--classification-head-name)
USER_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class TaskText:
    """A task's own text -> tokens, exactly as its hub (``RobertaHubInterface.encode``), without its model."""

    encode = RobertaHubInterface.encode

    def __init__(self, hub):
        self.bpe, self.task = hub.bpe, hub.task


@dataclass
class AttachedTask:
    """What the multi-task model keeps of one run (its model is dropped, or kept as its group's template)."""

    name: str
    checkpoint: str
    text: TaskText
    labels: Optional[List[str]]  # label-dictionary order; None for regression (one score)
    pair: bool  # the task reads sentence pairs
    arch: str
    key: Tuple  # the method configuration: tasks with equal keys share one pass
    state: Dict[str, torch.Tensor] = field(repr=False)  # trained tensors (method + head)
    max_tokens: int = 512  # the longest input (<s> ... </s>) the model takes

    @property
    def num_outputs(self) -> int:
        return 1 if self.labels is None else len(self.labels)


def resolve_run(run, checkpoint=None):
    """(folder, checkpoint file name) of a run folder, a shared folder or a checkpoint file."""
    if os.path.isfile(run):
        return os.path.dirname(os.path.abspath(run)), os.path.basename(run)
    if not os.path.isdir(run):
        raise FileNotFoundError(f"{run}: no such run folder or checkpoint file")
    if checkpoint is None:
        found = [f for f in ("checkpoint_best.pt", "model.pt") if os.path.isfile(os.path.join(run, f))]
        if not found:
            raise FileNotFoundError(f"{run}: holds neither checkpoint_best.pt nor model.pt; name the checkpoint file")
        checkpoint = found[0]
    return os.path.abspath(run), checkpoint


def data_folder(folder, checkpoint):
    """Where the run's dictionaries and task.json are: the folder itself, else the data its training read."""
    if os.path.isfile(os.path.join(folder, "task.json")):
        return folder
    state = torch.load(os.path.join(folder, checkpoint), map_location="cpu", weights_only=False)
    return ((state.get("cfg") or {}).get("task") or {}).get("data") or folder


def load_run(name, run, backbone, checkpoint=None, data=None, head=HEAD, **overrides):
    """(AttachedTask, its fairseq model in eval mode on the given backbone). ``overrides``: options of the
    checkpoint, as ``from_pretrained`` takes them (the BPE's files, ...)."""
    from fairseq.models.roberta import RobertaModel

    folder, checkpoint = resolve_run(run, checkpoint)
    hub = RobertaModel.from_pretrained(
        folder,
        checkpoint,
        data_name_or_path=os.path.abspath(data or data_folder(folder, checkpoint)),
        user_dir=USER_DIR,
        backbone=backbone,
        **overrides,
    ).eval()
    model = hub.model
    if not isinstance(model, FrozenBackboneRobertaModel) or all(p.requires_grad for p in model.parameters()):
        raise ConfigError(
            f"task {name}: {run} is a fine-tuning run (every weight trained): it cannot share a frozen backbone; "
            "load it alone with RobertaModel.from_pretrained"
        )
    if head not in model.classification_heads:
        raise ConfigError(f"task {name}: {run} has no head {head!r} (it has {sorted(model.classification_heads)})")
    info, outputs = task_info(hub.task), model.classification_heads[head].out_proj.out_features
    regression = bool(info.regression) if info is not None else outputs == 1
    dictionary = hub.task.label_dictionary
    labels = None if regression else [dictionary[i + dictionary.nspecial] for i in range(outputs)]
    state = {n: p.detach() for n, p in model.named_parameters() if p.requires_grad}
    task = AttachedTask(
        name=name,
        checkpoint=os.path.join(folder, checkpoint),
        text=TaskText(hub),
        labels=labels,
        pair=bool(task_is_pair(hub.task)),
        arch=model.args.arch,
        key=method_key(model, head),
        state=state,
        max_tokens=model.max_positions(),  # a prompted model's max_positions() leaves its prompt out already
    )
    return task, model


def method_key(model, head=HEAD):
    """What must be equal for two runs to share one vmap: the model class, its options (but where the backbone
    lives, dropout, which evaluation does not apply, and runtime options), its trained tensors' names and
    shapes (but the head's output rows: padded, ``groups.py``), and its own buffers' values."""
    parser = argparse.ArgumentParser(argument_default=argparse.SUPPRESS)
    type(model).add_args(parser)
    skip = {"backbone", "save_trainable_only", "help", *getattr(model, "RUNTIME_OPTIONS", ())}
    names = sorted(a.dest for a in parser._actions if a.dest not in skip and "dropout" not in a.dest)
    settings = tuple((n, repr(getattr(model.args, n, None))) for n in names if "layerdrop" not in n)
    out_rows = f"classification_heads.{head}.out_proj."
    shapes = tuple(
        (n, tuple(p.shape)) for n, p in model.named_parameters() if p.requires_grad and not n.startswith(out_rows)
    )
    digest = hashlib.sha256()
    for n, b in model.named_buffers():
        if n not in model.backbone_names:
            digest.update(n.encode() + b.detach().cpu().float().numpy().tobytes())
    return (type(model).__name__, settings, shapes, digest.hexdigest())


def frozen_tensors(model):
    """{name: tensor} of the model's frozen backbone (a tied tensor under each of its names)."""
    named = itertools.chain(model.named_parameters(remove_duplicate=False), model.named_buffers(remove_duplicate=False))
    return {n: t for n, t in named if n in model.backbone_names and not t.requires_grad}


def share_backbone(model, shared):
    """Point ``model``'s frozen backbone tensors at ``shared``'s (one copy in memory for every group)."""
    for name, tensor in frozen_tensors(model).items():
        if name not in shared or shared[name].shape != tensor.shape:
            raise ConfigError(f"{model.args.arch}: backbone tensor {name} does not match the attached backbone's")
        owner, _, leaf = name.rpartition(".")
        module = model.get_submodule(owner)
        table = module._parameters if leaf in module._parameters else module._buffers
        table[leaf] = shared[name]
