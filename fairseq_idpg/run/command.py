"""The launcher + fairseq-train command line of a run, and its check without training: the launcher's
flags, fairseq's parser, and the model built on the meta device."""

import sys

from fairseq_idpg.errors import ConfigError, argparse_error, flag_value
from fairseq_idpg.layout import REPO


def check_train_command(train, dictionary=None):
    """ConfigError for a launcher + fairseq-train command line (``train_command``) that the launcher or
    fairseq-train would refuse, found without the data and without training: the launcher's flags,
    fairseq's own parser (a misspelt flag, a bad value), the values compat fix 10 refuses, and the model
    built on the meta device (every build-time check of a method, ``--backbone``) against ``dictionary``
    (the model's dict.txt; None: the model is not there yet, an empty vocabulary and no backbone). About
    0.1 s after fairseq's import (the data's checks are fairseq-train's, when it runs)."""
    from fairseq import options
    from fairseq.data import Dictionary
    from fairseq.models import ARCH_MODEL_REGISTRY

    from fairseq_idpg.launch import build_command
    from fairseq_idpg.models.build import on_meta_device, stub_task
    from fairseq_idpg_compat import check_values

    ours, args = train[3 : train.index("--")], train[train.index("--") + 1 :]
    try:  # the flags the launcher owns
        build_command(args, *(int(flag_value(ours, f)) for f in ("--nproc", "--total-batch", "--batch-size")), cpu=True)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    parser = options.get_training_parser()
    parser.error = argparse_error  # argparse would print its usage and exit
    args = options.parse_args_and_arch(parser, input_args=[str(a) for a in args])
    check_values(args, args)
    vocabulary = Dictionary()
    if dictionary is not None:
        vocabulary = Dictionary.load(str(dictionary))
        vocabulary.add_symbol("<mask>")  # as the task does
    else:
        args.backbone = None
    with on_meta_device():
        ARCH_MODEL_REGISTRY[args.arch].build_model(args, stub_task(vocabulary))


def intervals(request, updates):
    """fairseq-train's validation and save intervals: the stand-in's smoke budgets validate and save
    (resumably) 3 times, whatever the epochs' length; mid-epoch saves keep only the latest."""
    flags, extra = [], request.extra_args
    if request.model == "standin":
        every = request.validate_interval_updates or max(1, updates // 3)
        flags += ["--validate-interval-updates", every]
        if request.save_interval_updates is None:
            flags += ["--save-interval-updates", every]
        # not also at each epoch's end: few-shot epochs of 32 updates would validate 10 times
        for flag in ("--validate-interval", "--save-interval"):
            if flag_value(extra, flag) is None:
                flags += [flag, 10**6]
    if (request.save_interval_updates or "--save-interval-updates" in flags) and flag_value(
        extra, "--keep-interval-updates"
    ) is None:
        flags += ["--keep-interval-updates", 1]  # checkpoint_<epoch>_<update>.pt: the latest only
    return flags


def train_command(request, method, recipe, backbone, data, budget, save):
    """The launcher + fairseq-train command line (the flags given last: they win)."""
    model_file, b, extra = backbone.dir / "model.pt", budget, list(request.extra_args)
    # a frozen backbone is loaded at build time; a fine-tuned one is the first launch's start only (a
    # resumed run continues from its checkpoint_last.pt)
    init = ["--backbone" if method.frozen_backbone else "--finetune-from-model", model_file]
    schedule = ["--lr-scheduler", "fixed"]
    if recipe.scheduler != "fixed":
        schedule = ["--lr-scheduler", "polynomial_decay", "--total-num-update", b.updates]
        schedule += ["--warmup-updates", b.warmup_updates]
    optimizer = ["--optimizer", "adam"]
    if b.head_lr is not None:  # the head at its own lr: fairseq_idpg/optim.py
        optimizer = ["--optimizer", "adam_head_lr", "--head-lr", b.head_lr]
        # fp16's one flat fp32 copy of the trained tensors would merge the head into the rest
        optimizer += ["--fp16-no-flatten-grads"] if request.fp16 else []
    # a command line reads best as flag-value pairs
    # fmt: off
    train = [
        data, "--user-dir", REPO / "fairseq_idpg", *method.train_args(),
        "--criterion", "sentence_prediction_metrics", "--num-classes", b.num_outputs,
        "--init-token", 0, "--separator-token", 2,
        *[x for kv in backbone.dims.items() for x in kv], *init,
        "--dropout", recipe.dropout, "--attention-dropout", recipe.dropout, "--weight-decay", recipe.weight_decay,
        *optimizer, "--adam-betas", "(0.9, 0.98)", "--adam-eps", 1e-06, "--clip-norm", recipe.clip_norm,
        *schedule, "--lr", b.lr, "--max-update", b.updates,
        "--valid-subset", ",".join(b.valid_subset),
        "--best-checkpoint-metric", b.metric, "--maximize-best-checkpoint-metric",
        "--save-dir", save, "--no-epoch-checkpoints", *intervals(request, b.updates),
        "--seed", request.seed,
        "--log-format", "json", "--log-interval", max(1, min(100, b.updates // 30)), "--num-workers", 0,
    ]
    # fmt: on
    train += ["--regression-target"] if b.regression else []
    train += ["--max-tokens", request.max_tokens] if request.max_tokens is not None else []
    train += ["--fp16"] if request.fp16 else []
    train += ["--bf16"] if request.bf16 else []
    train += ["--compile-layers"] if request.compile_layers else []  # how, not what: not in config.json
    train += ["--compile-backend", request.compile_backend] if request.compile_backend else []
    launch = [sys.executable, "-m", "fairseq_idpg.launch", "--nproc", request.nproc, "--total-batch", b.batch]
    launch += ["--batch-size", b.batch_size, "--"]
    return [str(x) for x in launch + train] + extra
