"""A method's model built as fairseq-train builds it, from tensors made elsewhere, saved as a compact
checkpoint that fairseq-validate and the hub load (the importers' output).

    model, cfg = build_for_import(METHODS["lora"], backbone, data, {"--lora-rank": 8})
    copy_imported(model, {"encoder...lora_q.A": tensor, ...}, folder)
    save_imported(model, cfg, out_file, source="peft:/path/to/adapter")

The command line is the method's part of run.sh's fairseq-train command (``Method.train_args``, the
criterion, the encoder sizes of the backbone, ``--backbone``) with ``overrides`` last (they win), parsed
by fairseq's own parser; the task (``--num-classes`` from the data's label dictionary) builds the model and
its classification head.
"""

from fairseq_idpg.errors import ConfigError


def build_for_import(method, backbone, data, overrides=None):
    """(model, cfg): ``method``'s model on ``backbone`` for the prepared ``data`` folder (its head included)."""
    from pathlib import Path

    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    from fairseq_idpg.run import model_dims

    labels = Path(data) / "label" / "dict.txt"
    if not (Path(data) / "input0" / "dict.txt").is_file():
        raise ConfigError(f"--data {data}: not a prepared task folder (no input0/dict.txt; scripts/prepare_data.py)")
    classes = sum(1 for _ in open(labels)) if labels.is_file() else 1  # no label dictionary: regression (STS-B)
    argv = [str(data), "--user-dir", str(Path(__file__).resolve().parents[1]), *method.train_args()]
    argv += ["--criterion", "sentence_prediction_metrics", "--num-classes", str(classes)]
    argv += ["--init-token", "0", "--separator-token", "2"] + ([] if labels.is_file() else ["--regression-target"])
    argv += [str(x) for kv in model_dims(backbone).items() for x in kv] + ["--backbone", str(backbone)]
    for flag, value in (overrides or {}).items():  # True: a switch (--bitfit)
        argv += [flag] if value is True else [flag, str(value)]
    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, argv)
    cfg = convert_namespace_to_omegaconf(args)
    task = tasks.setup_task(cfg.task)
    model = task.build_model(cfg.model)
    return model.eval(), cfg


def copy_imported(model, state, folder):
    """Copy ``state`` (our names -> imported tensors) into ``model``; a shape that differs is one line naming
    the tensor and ``folder`` (the head: another number of classes), before anything is copied."""
    import torch

    own = model.state_dict(full=True)
    for key, value in state.items():
        if own[key].shape != value.shape:
            head = key.startswith("classification_heads.")
            why = "another number of classes than --data's" if head else "the adapter's sizes are not this model's"
            raise ConfigError(
                f"{folder}: {key} has shape {tuple(value.shape)}, this model {tuple(own[key].shape)} ({why})"
            )
    with torch.no_grad():
        for key, value in state.items():
            own[key].copy_(value)


def save_imported(model, cfg, out_file, source):
    """Write ``model``'s compact checkpoint (its cfg, no optimizer state) to ``out_file``; ``source``: where
    its tensors came from (kept as ``imported_from``)."""
    import os

    from fairseq_idpg.conversion.weights import checkpoint_state
    from fairseq_idpg.files import save_torch

    # the layout of a never-trained checkpoint; the model state is compact (every method saves trainable only)
    state = checkpoint_state(cfg, model, cfg.task.data)
    state["optimizer_history"][0]["criterion_name"] = "SentencePredictionMetricsCriterion"
    state["last_optimizer_state"] = None
    state["imported_from"] = source
    os.makedirs(os.path.dirname(os.path.abspath(out_file)), exist_ok=True)
    save_torch(state, out_file)  # atomically
    return out_file
