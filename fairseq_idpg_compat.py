"""Run fairseq 0.12.2 (its last release) on Python 3.11 and 3.12 and torch >= 2.4.

This module is imported at interpreter start by ``fairseq_idpg_compat.pth``, which
``pip install`` puts into site-packages next to it, so every process gets the fixes
(fairseq-train, fairseq-validate, fairseq-preprocess, torchrun and spawn workers, the
hub) with no environment variable and no edit of fairseq's files. At import it touches
nothing but ``dataclasses`` and ``sys.meta_path``: the fixes of fairseq modules are applied
right after those modules load (a post-import hook), so processes that never import
fairseq pay nothing.

One fix per trap, each tested in ``tests/test_compat.py`` (12 and 13 in ``tests/test_faults_training.py``, 14 and
15 in ``tests/test_foreach_adam.py``, 19 in ``tests/test_fused_train.py``):

1. ``dataclass_identity_hash``: Python 3.11 rejects a dataclass field whose default is an
   unhashable object; fairseq's ``FairseqConfig`` uses instances of other config
   dataclasses (``common: CommonConfig = CommonConfig()``), so ``import fairseq`` fails
   with "mutable default ... use default_factory" (hydra-core 1.0.7, which fairseq pins,
   does the same). Their config classes get identity ``__hash__`` (object's), which is
   what Python 3.10 silently allowed.
2. ``torch_load_full_pickle``: torch 2.6 made ``torch.load`` default to
   ``weights_only=True``; fairseq checkpoints pickle ``argparse.Namespace``, omegaconf
   containers and numpy scalars, so loading any checkpoint (``--restore-file``, resume,
   fairseq-validate, ``from_pretrained``) fails. fairseq's checkpoint and distributed
   code see a ``torch`` whose ``load`` defaults to ``weights_only=False`` (torch < 2.6
   behaviour; fairseq checkpoints are trusted files, as they always were).
3. ``bf16_without_tpu``: fairseq's option parser sets ``--tpu`` whenever ``--bf16`` is
   given, then tries to import torch_xla. ``--bf16`` now means bf16 on the device you
   run on; ``--tpu`` still works when asked for.
4. ``no_fast_path_duplicates``: every ``TransformerEncoderLayer`` carries a second copy of
   its attention and FFN weights as parameters for the "BetterTransformer" inference fast
   path. They double checkpoint size, inflate parameter counts, and after a checkpoint
   load the eval-mode fast path runs on them, silently bypassing any method that changes
   the attention (LoRA, inducer, prefixes). The copies are removed and the fast path is
   off; checkpoints that contain the copies still load.

5. ``validate_defaults_from_checkpoint``: fairseq-validate's parser defaults to
   ``--task translation --criterion cross_entropy``; a task whose config refers to its
   criterion (sentence_prediction's ``${criterion.classification_head_name}``) then fails
   before anything runs unless ``--criterion`` is repeated by hand. fairseq-validate now
   takes ``--task`` and ``--criterion`` from the checkpoint given by ``--path`` when they
   are not on the command line (explicit flags still win).

6. ``all_gather_list_on_cpu``: fairseq's ``all_gather_list`` (used for logging outputs that
   cannot be summed, e.g. the per-example predictions behind Pearson/Spearman, and by
   multi-worker fairseq-validate) allocates ``torch.cuda.ByteTensor`` buffers, so every
   CPU (gloo) multi-worker run crashes there. On gloo the buffers are CPU tensors.

7. ``hydra_plugin_scan_without_find_module``: Python 3.12 removed the finders'
   ``find_module`` (deprecated since 3.4); hydra-core 1.0.7, which fairseq pins, scans its
   plugins with ``pkgutil.walk_packages`` and calls ``importer.find_module(name).load_module(name)``,
   so anything that builds a fairseq config (``convert_namespace_to_omegaconf``: fairseq-train,
   fairseq-validate, the hub) fails with "'FileFinder' object has no attribute 'find_module'".
   hydra's plugin scanner sees a ``pkgutil`` whose packages import through ``importlib``
   (what ``load_module`` did). Applied only where ``find_module`` is gone, when hydra's module
   loads and again when fairseq's config code loads (under pytest, whose hydra plugin has pytest
   import hydra's modules itself, the first never fires).

8. ``atomic_checkpoint_copies``: fairseq's ``save_checkpoint`` writes the first file of a save atomically
   (``NAME.tmp``, then a rename) but makes the others (``checkpoint_best.pt``, ``checkpoint_last.pt``, ...)
   with a plain copy, so a kill during the copy leaves a truncated file. The copies now go to ``NAME.tmp``
   in the same folder and are renamed over ``NAME`` (``os.replace``): a checkpoint file is the old one or
   the new one, never part of one (after a killed process; no fsync, so not after a power loss).

9. ``resume_from_intact_checkpoint``: fairseq-train's default ``--restore-file checkpoint_last.pt`` on a
   truncated or unreadable file failed with a PyTorch stream error naming no file. It now names the
   file and resumes from the newest intact checkpoint of ``--save-dir`` (by its number of updates:
   ``checkpoint_<epoch>_<updates>.pt``, ``checkpoint<epoch>.pt``, ``checkpoint_best.pt``,
   ``checkpoint.best_*.pt``), saying so; with none, one line and exit status 2. Intact means its zip
   directory and metadata read (what truncation destroys); tensor bytes are not checked.
   ``resume_checkpoint`` is the same choice for other code (the main job, ``fairseq_idpg/run/``). A
   ``checkpoint_last.pt`` that cannot be opened at all (no permission; a mocked path) is left to fairseq.

10. ``one_line_cli_errors``: fairseq-train and fairseq-validate printed every configuration error as the last
   line of a 20-40 line traceback. ``ConfigError`` (the one exception type for a user's mistake; the
   checks of ``fairseq_idpg`` raise it, see ``fairseq_idpg/errors.py``) now ends them with
   ``PROG: error: MESSAGE`` on stderr and exit status 2; any other exception keeps its traceback. Before
   anything runs, values that cannot be right are refused the same way: ``--lr`` <= 0, negative
   ``--max-update``/``--max-epoch``/``--num-workers``, ``--batch-size``/``--max-tokens``/``--update-freq``
   < 1, and fairseq-validate's ``--path`` when it is missing or not a checkpoint (was ``KeyError: None``);
   fairseq-train without ``--arch`` (was a bare ``RuntimeError`` traceback).
   A save folder that fairseq-train made for a run refused this way is removed when still empty. A
   ConfigError that fairseq wraps in another exception (a resume on another backbone: "Cannot load model
   parameters from checkpoint ...") is reported the same way. Under torchrun (``TORCHELASTIC_ERROR_FILE``
   set) a worker writes its line to torchrun's error file instead of stderr: the launcher
   (``fairseq_idpg.launch``) prints it once for all workers.

11. ``fp16_optimizer_on_any_device``: fairseq's ``FP16Optimizer`` (``--fp16``, ``--bf16``) keys its flat fp32
   master copy by ``torch.cuda.current_device()``, so ``--fp16 --cpu`` stopped in ``build_fp32_params`` with
   "Torch not compiled with CUDA enabled" (and, on a CUDA machine, would key CPU parameters by a GPU index
   that its gradient sync never finds). Off CUDA the flat copy is keyed by the parameters' own device (index
   None on the CPU, what the sync looks up) and lives there; on CUDA nothing changes. The copy holds exactly
   the parameters the trainer hands over (those with ``requires_grad``: a frozen backbone gets none).
   ``MemoryEfficientFP16Optimizer`` and ``DynamicLossScaler`` make no CUDA assumption. Where torch has no
   CUDA, ``Trainer.train_step``'s loss-scale overflow branch (``grad_norm = torch.tensor(0.0).cuda()``)
   crashed with the same error instead of skipping the update: its ``torch.tensor`` (the trainer's only
   one) now gives a tensor whose ``.cuda()`` stays on the CPU. The trainer module's ``torch`` is replaced
   by one that differs in ``tensor`` alone, because the call sits in the middle of ``train_step``: a
   narrower fix would copy that method. tests/test_compat.py fails if trainer.py gets another call.

12. ``one_line_write_failures``: a full disk (or a read-only or over-quota folder) while fairseq-train saved a
   checkpoint ended in a traceback of ~20 lines (fairseq logs it, retries twice, raises) and left a partial
   ``checkpoint_<epoch>_<updates>.pt.tmp``. A local checkpoint is now written like the project's other files
   (``fairseq_idpg.files.save_torch``: a temporary beside it, renamed when complete, removed when the
   write fails), and a failed write or copy ends with ``fairseq-train: error: FILE: could not be written
   (WHY); free some space, or give --save-dir a folder with room ...``, exit status 2; the checkpoints saved
   before are as they were.

13. ``one_line_divergence``: a diverged update (fp32 NaN/Inf gradients, fp16's loss scale at its minimum)
   ended fairseq-train in a ``FloatingPointError`` traceback after writing the diverged state to
   ``crash.pt`` (re-running the batch under fairseq's ``NanDetector``, whose hooks fail with this torch,
   added a StopIteration traceback). It now ends with one line on stderr, ``FloatingPointError: REASON at
   update N (lr LR is likely too high: try a lower --lr)``, exit status 1, and no crash.pt (nothing can resume from that
   state). The line starts as Python's did, so the main job still reads the reason from train.log.

14. ``foreach_adam``: without apex (no fused Adam), fairseq's ``Adam`` (``--optimizer adam``, and
   ``adam_head_lr`` built on it) updates the trained tensors in a Python loop, about 10 kernels each per
   update (LoRA's 24-layer model: ~1,400 launches, full fine-tuning ~5,200). ``fairseq.optim.adam.Adam`` is
   now ``ForeachAdam``: fairseq's update in ``torch._foreach_*`` operators over all the tensors of a
   parameter group at once (a few launches, whatever their number). The maths is fairseq's, operator for
   operator: ``m = b1 m + (1 - b1) g``, ``v = b2 v + (1 - b2) g g``, ``denom = sqrt(v) + eps`` (eps before
   the bias correction, unlike ``torch.optim.AdamW``), ``p -= wd lr p`` (decoupled, before the step),
   ``p -= lr sqrt(1 - b2^t) / (1 - b1^t) m / denom``; fp32 moments and maths for fp16/bf16 tensors
   (``MemoryEfficientFP16Optimizer``), written back in their dtype; the same state keys (``step`` an int,
   ``exp_avg``, ``exp_avg_sq``), so checkpoints of either resume with the other. Flags, config and run
   folders are unchanged. fairseq's loop stays as ``ForeachAdam.per_tensor`` (the tests' reference).

15. ``foreach_gradient_loops``: the rest of fairseq's update loops over the trained tensors in Python too
   (without apex's ``amp_C``): ``clip_grad_norm_`` (one norm per tensor, then one multiply per tensor),
   ``multiply_grads`` (one multiply per tensor) and ``FP16Optimizer``'s fp32 copies (the gradient and parameter
   copies to and from them, flat or not, and in bf16 and with ``--fp16-no-flatten-grads`` their zeroing: one
   each per tensor), about 6 launches per tensor per update. Each loop is one foreach operator now, with the
   same operators per tensor (``torch.norm(g, 2, float32)``, ``mul_``, ``copy_``, ``zero_``), so the values are
   the same; flat copies on several devices, apex, expert parameters, a single tensor and the multiply of half
   gradients by a number (which the CPU's foreach rounds differently) keep fairseq's code.

16. ``optimizer_without_dynamo_import``: torch's ``Optimizer`` marks ``add_param_group``, ``zero_grad``,
   ``state_dict`` and ``load_state_dict`` as never compiled (``torch._disable_dynamo``), which imports
   ``torch._dynamo`` at their first call: building fairseq's optimizer cost every fairseq-train about 2 s of
   CPU (4 s on a loaded machine) before its first update, for a compiler it never runs. Until something imports
   ``torch._dynamo`` (``torch.compile``, ``--compile-layers``, a custom operator), nothing can be compiling, so
   those methods run as they are; from then on they go through torch's own ``torch._dynamo.disable`` as
   before. Nothing else changes: the same calls, in the same order, on the same tensors.

17. ``compose_without_hydra``: fairseq builds its configuration from the command line
   (``convert_namespace_to_omegaconf``: fairseq-train once, fairseq-validate twice, each member of a fused group) by
   writing every option as a hydra override string and composing them with hydra's ``compose``, whose merges
   deep-copy the whole configuration tree again and again: about 2 s of CPU per call, most of a short run's start.
   The same configuration is now composed directly: the overrides (fairseq's own, parsed by hydra's own override
   parser) select the config groups' nodes from hydra's ``ConfigStore`` (the defaults of fairseq's ``config.yaml``
   where none is given) on fairseq's structured ``FairseqConfig``, and each value is set with
   ``OmegaConf.update(..., merge=True)``, the call hydra makes; about 0.3 s. Anything else (an override that adds,
   deletes or renames a package, a config group with no node in the store, a value the configuration refuses) goes
   to hydra's ``compose`` as before, so its errors are hydra's. fairseq's own code around the call is unchanged.

18. ``per_run_state``: fairseq keeps a training run's state in module globals, as if a process ran one run:
   the metrics' aggregators (``fairseq.logging.metrics._aggregators``, ``_active_aggregators``,
   ``_active_aggregators_cnt``), the best validation score (``checkpoint_utils.save_checkpoint.best``) and the
   early stop's best and patience count (``fairseq_cli.train.should_stop_early.best``, ``.num_runs``). Runs
   trained together in one process (``fairseq_idpg.fused``) would read each other's. Each is now the current
   run's: the three globals are mappings over ``run_state()``, and the two functions keep their attributes in it
   (``RunAttributes``: calling one calls fairseq's function). ``new_run()`` gives the current context (a thread,
   or a ``contextvars.Context``) a fresh state; a process that never calls it has one run, the process's, and
   sees exactly what fairseq's globals held (every fairseq-train, fairseq-validate and hub process).

19. ``gradients_given`` and ``known_gradient_norm``: a fused group computes its members' gradients (and, under
   ``FP16Optimizer``, their norms, all at once) outside fairseq's ``backward``. ``gradients_given`` tells a
   trainer's optimizer so (``FP16Optimizer`` copies them to its fp32 copies, as after its own ``backward``);
   ``known_gradient_norm`` answers the norm-only question that ``FP16Optimizer.clip_grad_norm`` asks its fp32
   optimizer once with that norm (fairseq's own computation otherwise). Nothing changes for a run that calls
   neither.

20. ``tensorboard_writer_when_asked``: two fairseq modules that every fairseq process imports (its progress bars,
   and the text-to-speech task among all of fairseq's tasks) import ``tensorboardX`` for its ``SummaryWriter``,
   about 0.5 s of CPU (it imports protobuf and boto3) in every fairseq-train, fairseq-validate and hub process,
   whether or not the run logs to TensorBoard. While those two modules load, their ``SummaryWriter`` is bound to
   a function that imports ``tensorboardX`` at its first call (``--tensorboard-logdir``) and returns tensorboardX's
   own writer. Where ``tensorboardX`` is not installed nothing changes (fairseq then says so as before), and
   anything else that imports ``tensorboardX`` gets the module itself.

torchaudio is never imported by the workflow: fairseq imports it lazily in speech code
only, and the installer does not install it (the wheel fairseq's metadata pulls in does
not load with this torch).
"""

import contextvars
import importlib.abc
import importlib.util
import os
import re
import sys
from collections.abc import MutableMapping

_FAST_PATH_PARAMS = (
    "in_proj_weight",
    "in_proj_bias",
    "out_proj_weight",
    "out_proj_bias",
    "fc1_weight",
    "fc1_bias",
    "fc2_weight",
    "fc2_bias",
)


# ---------------------------------------------------------------- 1. dataclasses
_CONFIG_PACKAGES = ("fairseq", "fairseq_cli", "hydra")  # hydra-core 1.0.7, pinned by fairseq


def _is_fairseq_module(name):
    return name.split(".", 1)[0] in _CONFIG_PACKAGES


def dataclass_identity_hash():
    """Give fairseq's (unfrozen, eq) dataclasses object identity hashing on Python 3.11+."""
    import dataclasses

    original = dataclasses._process_class
    if getattr(original, "_fairseq_idpg_compat", False):
        return

    def _process_class(cls, *args, **kwargs):
        cls = original(cls, *args, **kwargs)
        if cls.__hash__ is None and _is_fairseq_module(getattr(cls, "__module__", "")):
            cls.__hash__ = object.__hash__
        return cls

    _process_class._fairseq_idpg_compat = True
    dataclasses._process_class = _process_class


# ---------------------------------------------------------------- 2. torch.load
def _torch_with_full_pickle_load():
    import types

    import torch

    class _TorchForFairseq(types.ModuleType):
        """``torch`` for fairseq's checkpoint code: ``load`` unpickles in full by default."""

        def __getattr__(self, name):
            return getattr(torch, name)

        @staticmethod
        def load(*args, **kwargs):
            kwargs.setdefault("weights_only", False)
            return torch.load(*args, **kwargs)

    return _TorchForFairseq("torch")


def torch_load_full_pickle(module):
    """Make ``torch.load`` inside ``module`` (a fairseq module) default to weights_only=False."""
    if not isinstance(module.torch, type(sys)) or module.torch.__name__ != "torch":
        return
    if type(module.torch).__name__ == "_TorchForFairseq":
        return
    module.torch = _torch_with_full_pickle_load()


# ---------------------------------------------------------------- 3. --bf16
def bf16_without_tpu(options):
    """``--bf16`` no longer implies ``--tpu`` in ``fairseq.options.parse_args_and_arch``."""
    original = options.parse_args_and_arch
    if getattr(original, "_fairseq_idpg_compat", False):
        return

    def parse_args_and_arch(parser, input_args=None, *args, **kwargs):
        result = original(parser, input_args, *args, **kwargs)
        parsed = result[0] if isinstance(result, tuple) else result
        argv = sys.argv[1:] if input_args is None else input_args
        if getattr(parsed, "bf16", False) and getattr(parsed, "tpu", False):
            parsed.tpu = "--tpu" in argv
        return result

    parse_args_and_arch._fairseq_idpg_compat = True
    options.parse_args_and_arch = parse_args_and_arch


# ---------------------------------------------------------------- 4. fast path
def no_fast_path_duplicates(transformer_layer):
    """Drop the BetterTransformer duplicate weights of ``TransformerEncoderLayerBase``."""
    import torch.nn as nn

    layer_cls = transformer_layer.TransformerEncoderLayerBase
    if getattr(layer_cls, "_fairseq_idpg_compat", False):
        return
    original_init = layer_cls.__init__

    module_torch = transformer_layer.torch

    class _MetaZeros:
        """``torch`` for fairseq's layer ``__init__``: its ``zeros`` (only the duplicates, dropped below) on the meta
        device: at roberta.large size they were 1.2 GB of zeros written and freed per model built."""

        def __getattr__(self, name):
            return getattr(module_torch, name)

        @staticmethod
        def zeros(*size, **kwargs):
            return module_torch.zeros(*size, **{**kwargs, "device": "meta"})

    def __init__(self, *args, **kwargs):
        transformer_layer.torch = _MetaZeros()
        try:
            original_init(self, *args, **kwargs)
        finally:
            transformer_layer.torch = module_torch
        for name in _FAST_PATH_PARAMS:
            if name in self._parameters:
                del self._parameters[name]
        self.BT_version = False  # never take torch._transformer_encoder_layer_fwd
        self.load_to_BT = False

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        for name in _FAST_PATH_PARAMS:
            state_dict.pop(prefix + name, None)
        # skip fairseq's override, which rebuilds the copies and arms the fast path
        nn.Module._load_from_state_dict(self, state_dict, prefix, *args, **kwargs)

    layer_cls.__init__ = __init__
    layer_cls._load_from_state_dict = _load_from_state_dict
    layer_cls._fairseq_idpg_compat = True


def _errors():
    """``fairseq_idpg.errors`` (the project's error root and command-line helpers), imported when a fix first
    needs it: this module loads at every interpreter's start, the project only in the commands that use it."""
    from fairseq_idpg import errors

    return errors


# ---------------------------------------------------------------- 5. fairseq-validate


def saved_task_and_criterion(path):
    """(task, criterion) names stored in a fairseq checkpoint, reading no tensor data."""
    import torch

    try:
        state = torch.load(path, map_location="cpu", weights_only=False, mmap=True)
    except RuntimeError:  # legacy (non-zip) serialization cannot be memory-mapped
        state = torch.load(path, map_location="cpu", weights_only=False)
    cfg = state.get("cfg")
    if cfg is not None:
        return cfg["task"]["_name"], cfg["criterion"]["_name"]
    args = state["args"]
    return args.task, args.criterion


def validate_defaults_from_checkpoint(validate):
    """Default fairseq-validate's ``--task``/``--criterion`` to those of the checkpoint."""
    import os

    original = validate.cli_main
    if getattr(original, "_fairseq_idpg_compat", False):
        return

    def cli_main():
        argv, errors = sys.argv[1:], _errors()
        ConfigError, flag_value = errors.ConfigError, errors.flag_value
        path = flag_value(argv, "--path")
        if not path and "-h" not in argv and "--help" not in argv:
            raise ConfigError("--path is required: the checkpoint to score (written by fairseq-train)")
        for each in (path or "").split(os.pathsep) if path else []:
            if not os.path.isfile(each):
                what = "a folder" if os.path.isdir(each) else "no such file"
                raise ConfigError(f"--path {each}: {what} (expected a checkpoint file written by fairseq-train)")
        missing = [f for f in ("--task", "--criterion") if flag_value(argv, f) is None]
        if path and missing:
            first = path.split(os.pathsep)[0]
            try:
                task, criterion = saved_task_and_criterion(first)
            except Exception as e:
                raise ConfigError(f"--path {first}: not a fairseq checkpoint ({_damage(e)})") from None
            defaults = {"--task": task, "--criterion": criterion}
            for flag in missing:
                sys.argv += [flag, defaults[flag]]
        return original()

    cli_main._fairseq_idpg_compat = True
    validate.cli_main = cli_main


# ---------------------------------------------------------------- 6. all_gather_list
def all_gather_list_on_cpu(distributed_utils):
    """Give fairseq's ``all_gather_list`` CPU buffers when the process group runs on gloo."""
    import torch
    import torch.distributed as dist

    original = distributed_utils.all_gather_list
    if getattr(original, "_fairseq_idpg_compat", False):
        return

    def all_gather_list(data, group=None, max_size=16384):
        # fairseq reads its buffers from the module-level name, i.e. from this wrapper
        cpu = not torch.cuda.is_available() or dist.get_backend() == "gloo"
        size = max_size * distributed_utils.get_world_size(group=group or distributed_utils.get_global_group())
        buffer = getattr(all_gather_list, "_buffer", None)
        if cpu and (buffer is None or buffer.is_cuda or buffer.numel() < size):
            all_gather_list._buffer = torch.zeros(size, dtype=torch.uint8)
            all_gather_list._cpu_buffer = torch.zeros(max_size, dtype=torch.uint8)
        return original(data, group=group, max_size=max_size)

    all_gather_list._fairseq_idpg_compat = True
    distributed_utils.all_gather_list = all_gather_list


def _patch_distributed_utils(module):
    torch_load_full_pickle(module)
    all_gather_list_on_cpu(module)


def hydra_plugin_scan_without_find_module(plugins):
    """Fix 7 (Python >= 3.12), on ``hydra.core.plugins``; see the module docstring."""
    import importlib.machinery

    if getattr(plugins, "_fairseq_idpg_compat", False) or hasattr(importlib.machinery.FileFinder, "find_module"):
        return
    import pkgutil
    import types

    class _Loader:
        def load_module(self, name):
            return importlib.import_module(name)

    class _Finder:
        def find_module(self, name, path=None):
            return _Loader()

    def walk_packages(*args, **kwargs):
        for info in pkgutil.walk_packages(*args, **kwargs):
            yield _Finder(), info.name, info.ispkg

    plugins.pkgutil = types.SimpleNamespace(**{**vars(pkgutil), "walk_packages": walk_packages})
    plugins._fairseq_idpg_compat = True


def _patch_loaded_hydra(module):
    plugins = sys.modules.get("hydra.core.plugins")
    if plugins is not None:
        hydra_plugin_scan_without_find_module(plugins)


# ---------------------------------------------------------------- 17. fairseq's config without hydra's compose
CONFIG_YAML_GROUPS = {"criterion": "cross_entropy", "lr_scheduler": "fixed"}  # fairseq/config/config.yaml's defaults


def composed_config(overrides):
    """What hydra's ``compose("config", overrides, strict=False)`` gives fairseq's ``convert_namespace_to_omegaconf``,
    built without hydra's merges; None for what it leaves to hydra (see fix 17)."""
    from fairseq.dataclass.configs import FairseqConfig
    from hydra.core.config_store import ConfigStore
    from hydra.core.object_type import ObjectType
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf

    store = ConfigStore.instance()
    groups, values = dict(CONFIG_YAML_GROUPS), []
    for override in OverridesParser.create().parse_overrides(list(overrides)):
        plain = not (override.is_add() or override.is_delete() or override.is_sweep_override())
        if not plain or override.get_subject_package() is not None:
            return None
        key = override.key_or_group
        if "." not in key and store.get_type(key) == ObjectType.GROUP:
            groups[key] = override.value()
        else:
            values.append((key, override.value()))
    cfg = OmegaConf.structured(FairseqConfig)
    OmegaConf.set_struct(cfg, False)  # strict=False
    for group, name in groups.items():
        if name is None:
            continue
        if store.get_type(f"{group}/{name}.yaml") != ObjectType.CONFIG:
            return None  # a config file of fairseq's (hydra searches its files too)
        cfg[group] = store.load(f"{group}/{name}.yaml").node
    for key, value in values:
        OmegaConf.update(cfg, key, value, merge=True)
    return cfg


def compose_without_hydra(utils):
    """``fairseq.dataclass.utils``'s ``compose`` composes directly where ``composed_config`` can; else hydra's."""
    if getattr(utils, "_fairseq_idpg_compose", False):
        return
    hydra_compose = utils.compose

    def compose(config_name=None, overrides=(), strict=None, return_hydra_config=False):
        if config_name == "config" and strict is False and not return_hydra_config:
            try:
                cfg = composed_config(overrides)
            except Exception:  # a value the configuration refuses: hydra's own error, below
                cfg = None
            if cfg is not None:
                return cfg
        return compose.hydra_compose(config_name, overrides=list(overrides), strict=strict,
                                     return_hydra_config=return_hydra_config)  # fmt: skip

    compose.hydra_compose = hydra_compose  # (an attribute: the tests compare the two)
    utils.compose = compose
    utils._fairseq_idpg_compose = True


def _patch_dataclass_utils(module):
    _patch_loaded_hydra(module)
    compose_without_hydra(module)


# ---------------------------------------------------------------- 8. atomic copies
def atomic_copy(src, dst):
    """Copy ``src`` to ``dst`` through ``dst.tmp`` (same folder) and a rename: ``dst`` is never partial."""
    import shutil

    tmp = str(dst) + ".tmp"
    try:
        shutil.copyfile(src, tmp)
        os.replace(tmp, dst)
    except BaseException:
        try:
            os.remove(tmp)
        except OSError:
            pass
        raise
    return True


def atomic_checkpoint_copies(checkpoint_utils):
    """``checkpoint_utils.PathManager.copy`` (only its use there) copies local files atomically."""
    base = checkpoint_utils.PathManager
    if getattr(base, "_fairseq_idpg_compat", False):
        return

    class PathManager(base):
        _fairseq_idpg_compat = True

        @staticmethod
        def copy(src_path, dst_path, overwrite=False):
            if base.path_requires_pathmanager(dst_path) or not base.supports_rename(dst_path):
                return base.copy(src_path, dst_path, overwrite=overwrite)
            if not overwrite and os.path.exists(dst_path):
                return False
            try:
                return atomic_copy(src_path, dst_path)
            except OSError as e:
                raise _write_failed(dst_path, e) from e

    checkpoint_utils.PathManager = PathManager


# ---------------------------------------------------------------- 9. resume from an intact checkpoint
def _resume_names(suffix=""):
    """The files of a save folder that hold a full training state (fairseq's names)."""
    kinds = r"_last|_\d+_\d+|\d+|_best|\.best_.+"
    return re.compile(rf"checkpoint(?:{kinds}){re.escape(suffix)}\.pt")


def _damage(error):
    """A one-line reason, without torch's advice on internal miniz errors."""
    if isinstance(error, (KeyError, IndexError, TypeError)):
        return f"not a fairseq training checkpoint: no {error.args[0] if error.args else 'training state'}"
    text = str(error).splitlines()[0] if str(error) else type(error).__name__
    text = text.split(". This is an internal")[0].replace("PytorchStreamReader failed reading zip archive: ", "")
    return f"truncated or unreadable: {text}"


def _saved_updates(path):
    """(updates, None) of a fairseq training checkpoint, reading its zip directory and pickle but not its
    tensors; (None, why) for a truncated or unreadable file, or one without training state."""
    import torch

    try:
        try:
            state = torch.load(path, map_location="cpu", weights_only=False, mmap=True)
        except Exception:  # a legacy (non-zip) file, a file system without mmap, or damage: read it plainly
            state = torch.load(path, map_location="cpu", weights_only=False)
        updates = int(state["optimizer_history"][-1]["num_updates"])
        state["extra_state"]["train_iterator"]
    except Exception as e:
        size = os.path.getsize(path) if os.path.isfile(path) else 0
        return None, f"{_damage(e)}; {size:,} bytes"
    return updates, None


def checkpoint_num_updates(path):
    """Updates a fairseq training checkpoint was saved at; ValueError naming the file when it is damaged."""
    updates, damage = _saved_updates(path)
    if damage:
        raise ValueError(f"{path} is damaged ({damage})")
    return updates


def resume_checkpoint(last, suffix=""):
    """(path, updates, damage) to resume from instead of ``last`` (checkpoint_last.pt): ``last`` itself when
    intact (damage None); else the newest intact checkpoint beside it by its updates, and why ``last`` is not
    usable (e.g. "failed finding central directory; 131,072 bytes"); (None, None, damage) when there is none."""
    updates, damage = _saved_updates(last)
    if damage is None:
        return str(last), updates, None
    folder, names = os.path.dirname(str(last)) or ".", _resume_names(suffix)
    found = []
    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name)
        if path == str(last) or not names.fullmatch(name):
            continue
        updates, unusable = _saved_updates(path)
        if unusable:
            continue
        found.append((-updates, 0 if "_last" in name else 2 if "best" in name else 1, path))  # ties: last first
    if not found:
        return None, None, damage
    updates, _, path = min(found)
    return path, -updates, damage


def _openable(path):
    """Whether ``path`` names a file this process can open; any other path is left to fairseq as it was
    (its own error, or what its tests mock: test_train.py's TestLoadCheckpoint patches ``os.path.join``)."""
    try:
        path = os.fspath(path)  # a str, never an int (open() takes a file descriptor)
        if not isinstance(path, str) or not os.path.isfile(path):
            return False
        with open(path, "rb"):
            return True
    except (OSError, TypeError, ValueError):
        return False


def resume_from_intact_checkpoint(checkpoint_utils):
    """fairseq-train's resume from ``checkpoint_last.pt`` falls back to the newest intact checkpoint."""
    original = checkpoint_utils.load_checkpoint
    if getattr(original, "_fairseq_idpg_compat", False):
        return

    def load_checkpoint(cfg, trainer, **passthrough_args):
        suffix = trainer.checkpoint_suffix or ""
        last = os.path.join(cfg.save_dir, f"checkpoint_last{suffix}.pt")
        if cfg.restore_file != "checkpoint_last.pt" or not _openable(last):
            return original(cfg, trainer, **passthrough_args)
        path, updates, damage = resume_checkpoint(last, suffix)
        if damage is None:
            return original(cfg, trainer, **passthrough_args)
        if path is None:
            raise _errors().ConfigError(
                f"--save-dir {cfg.save_dir}: {os.path.basename(last)} is damaged ({damage}) "
                f"and no intact checkpoint is left to resume from; remove it to train from the start"
            )
        checkpoint_utils.logger.warning(
            f"{last} is damaged ({damage}); resuming from the newest intact checkpoint {path} "
            f"(update {updates}); the next save replaces {os.path.basename(last)}"
        )
        load = trainer.load_checkpoint
        trainer.load_checkpoint = lambda filename, *a, **k: load(path if filename == last else filename, *a, **k)
        try:
            return original(cfg, trainer, **passthrough_args)
        finally:
            del trainer.load_checkpoint

    load_checkpoint._fairseq_idpg_compat = True
    checkpoint_utils.load_checkpoint = load_checkpoint


# ---------------------------------------------------------------- 12. a failed checkpoint write
def _write_failed(path, error):
    """The ConfigError for a checkpoint file that could not be written (a full disk, a read-only folder)."""
    why = getattr(error, "strerror", None) or str(error) or "the write failed"
    return _errors().ConfigError(
        f"{path}: could not be written ({why}); free some space, or give --save-dir a folder with room (the same "
        f"command then resumes); the checkpoints saved before are as they were"
    )


def one_line_write_failures(checkpoint_utils):
    """``checkpoint_utils.torch_persistent_save`` writes a local file atomically; a failed write is one line."""
    original = checkpoint_utils.torch_persistent_save
    if getattr(original, "_fairseq_idpg_compat", False):
        return

    def torch_persistent_save(obj, filename, async_write=False):
        manager = checkpoint_utils.PathManager
        if async_write or manager.path_requires_pathmanager(filename) or not manager.supports_rename(filename):
            return original(obj, filename, async_write=async_write)
        from fairseq_idpg.files import save_torch

        try:
            save_torch(obj, filename)
        except _errors().ConfigError as e:  # save_torch's own line names the file; this one says what to do
            raise _write_failed(filename, e.__cause__ or e) from e.__cause__

    torch_persistent_save._fairseq_idpg_compat = True
    checkpoint_utils.torch_persistent_save = torch_persistent_save


def _patch_checkpoint_utils(module):
    per_run_attributes(module, "save_checkpoint")
    torch_load_full_pickle(module)
    atomic_checkpoint_copies(module)
    resume_from_intact_checkpoint(module)
    one_line_write_failures(module)


# ---------------------------------------------------------------- 10. one-line errors
def check_values(dataset, optimization=None):
    """ConfigError for the fairseq values that cannot be right (fix 10); 0 keeps fairseq's meaning "no limit".
    ``dataset`` and ``optimization``: fairseq's config groups, or one argparse Namespace for both."""
    checks = [
        ("--batch-size", dataset.batch_size, 1),
        ("--max-tokens", dataset.max_tokens, 1),
        ("--num-workers", dataset.num_workers, 0),
    ]
    opt = optimization
    if opt is not None:
        checks += [("--max-update", opt.max_update, 0), ("--max-epoch", opt.max_epoch, 0)]
        checks += [("--update-freq", f, 1) for f in opt.update_freq]
    ConfigError = _errors().ConfigError
    for flag, value, least in checks:
        if value is not None and value < least:
            raise ConfigError(f"{flag} must be >= {least}, got {value}")
    for lr in opt.lr if opt is not None else ():
        if not lr > 0:
            raise ConfigError(f"--lr must be > 0 (the learning rate), got {lr:g}")


def config_error_in(error):
    """The ConfigError that ``error`` is, or that a bare ``Exception`` wraps (fairseq's "Cannot load model
    parameters from checkpoint ..." around a failed load), else None: any other exception is a bug's."""
    errors = sys.modules.get("fairseq_idpg.errors")  # not imported: no ConfigError can have been raised
    while type(error) is Exception:
        error = error.__cause__ or error.__context__
    return error if errors is not None and isinstance(error, errors.ConfigError) else None


def _one_line(prog, call):
    """Run ``call()``; a ConfigError (also one that another exception wraps) ends the process with
    ``prog: error: message`` and exit status 2, a divergence (fix 13) with its ``FloatingPointError: ...`` line
    and exit status 1. A torchrun worker writes that line to torchrun's error file instead, so that the
    launcher (``fairseq_idpg.launch``) says it once for all its workers."""
    try:
        return call()
    except Exception as e:
        found = config_error_in(e)
        if found is None and not isinstance(e, Diverged):
            raise
        line = f"{prog}: error: " + " ".join(str(found).split()) if found is not None else e.line()
        code = 2 if found is not None else 1
        error_file = os.environ.get("TORCHELASTIC_ERROR_FILE")
        if not error_file:
            print(line, file=sys.stderr, flush=True)
            sys.exit(code)
        import json
        import time

        with open(error_file, "w", encoding="utf-8") as f:
            json.dump({"message": line, "timestamp": int(time.time())}, f)
        sys.exit(code)


def one_line_cli_errors(module, prog):
    """``module.cli_main`` (fairseq_cli.train or .validate) reports a ConfigError in one line; its ``main``
    refuses impossible values first and, for training, removes the save folder it made for a refused run."""
    if getattr(module.cli_main, "_fairseq_idpg_one_line", False):
        return
    original_main, original_cli = module.main, module.cli_main

    def main(cfg, *args, **kwargs):
        save_dir = cfg.checkpoint.save_dir if prog == "fairseq-train" else None
        existed = save_dir is None or os.path.exists(save_dir)
        try:
            check_values(cfg.dataset, cfg.get("optimization"))
            return original_main(cfg, *args, **kwargs)
        except Exception as e:
            refused = config_error_in(e) is not None
            if refused and not existed and os.path.isdir(save_dir) and not os.listdir(save_dir):
                os.rmdir(save_dir)
            raise

    def cli_main(*args, **kwargs):
        if prog == "fairseq-train":  # its argparse errors too (a misspelt flag): one line, not the usage
            given = kwargs.pop("modify_parser", args[0] if args else None)

            def modify_parser(parser):
                parser.error = _errors().argparse_error
                for action in parser._actions:  # without it, fairseq's parser raised a bare RuntimeError
                    if "--arch" in action.option_strings:
                        action.required = True
                if given is not None:
                    given(parser)

            args, kwargs = (), {**kwargs, "modify_parser": modify_parser}
        return _one_line(prog, lambda: original_cli(*args, **kwargs))

    cli_main._fairseq_idpg_one_line = cli_main._fairseq_idpg_compat = True
    module.main, module.cli_main = main, cli_main


def _patch_train(module):
    per_run_attributes(module, "should_stop_early")
    one_line_cli_errors(module, "fairseq-train")


def _patch_validate(module):
    validate_defaults_from_checkpoint(module)
    one_line_cli_errors(module, "fairseq-validate")


# ---------------------------------------------------------------- 11. fp16 optimizers off CUDA
def fp16_optimizer_on_any_device(fp16_optimizer):
    """``_FP16OptimizerMixin.build_fp32_params`` builds the flat fp32 copy on the parameters' own device."""
    mixin = fp16_optimizer._FP16OptimizerMixin
    original = mixin.__dict__["build_fp32_params"].__func__
    if getattr(original, "_fairseq_idpg_compat", False):
        return

    def build_fp32_params(cls, args, params, flatten=True):
        params = list(params)
        pipeline = getattr(args, "pipeline_model_parallel", False) and getattr(args, "distributed_no_spawn", False)
        if not flatten or pipeline or not params or params[0].is_cuda:
            return original(cls, args, params, flatten=flatten)
        import torch

        # one flat fp32 tensor on the parameters' device, keyed as the grad/param syncs look it up (p.device.index)
        flat = torch.nn.Parameter(torch.cat([p.data.reshape(-1) for p in params]).float())
        flat.grad = torch.zeros_like(flat.data)
        return {params[0].device.index: flat}

    build_fp32_params._fairseq_idpg_compat = True
    mixin.build_fp32_params = classmethod(build_fp32_params)


def _patch_fp16_optimizer(module):
    fp16_optimizer_on_any_device(module)
    if not getattr(module._FP16OptimizerMixin, "_fairseq_idpg_foreach", False):
        foreach_fp32_copies(module)
        module._FP16OptimizerMixin._fairseq_idpg_foreach = True


def trainer_overflow_without_cuda(trainer):
    """Where torch has no CUDA, ``fairseq.trainer``'s ``torch.tensor(0.0).cuda()`` (the grad norm of an
    update skipped for a loss-scale overflow) stays on the CPU; with CUDA nothing changes."""
    import types

    import torch

    if torch.cuda.is_available() or type(trainer.torch).__name__ == "_TorchForTrainer":
        return

    class _HostTensor(torch.Tensor):
        def cuda(self, *args, **kwargs):
            return self.as_subclass(torch.Tensor)

    class _TorchForTrainer(types.ModuleType):
        def __getattr__(self, name):
            return getattr(torch, name)

        @staticmethod
        def tensor(*args, **kwargs):
            return torch.tensor(*args, **kwargs).as_subclass(_HostTensor)

    trainer.torch = _TorchForTrainer("torch")


# ---------------------------------------------------------------- 13. divergence
class Diverged(FloatingPointError):
    """fairseq's FloatingPointError of one update, with the update and the lr it was trained with."""

    LR_REASONS = ("gradients are Nan/Inf", "Minimum loss scale reached")  # what a too-high lr causes

    def __init__(self, update, reason, lr):
        super().__init__(reason)
        self.update, self.reason, self.lr = update, reason, lr

    def line(self):
        """One line that begins as Python's traceback ended (``FloatingPointError: REASON``): the main job reads
        divergence from train.log by it (``fairseq_idpg/run/execution.py``, ``divergence``)."""
        reason = " ".join(self.reason.split("\n")[0].split())
        advice = self.lr is not None and self.reason.startswith(self.LR_REASONS)
        why = f" (lr {self.lr:g} is likely too high: try a lower --lr)" if advice else ""
        return f"FloatingPointError: {reason} at update {self.update}{why}"


def one_line_divergence(trainer):
    """``Trainer.train_step`` raises ``Diverged`` for fairseq's FloatingPointError; ``crash.pt`` (the diverged
    state, saved while that error is handled) is no longer written, and the batch is no longer run again under
    fairseq's ``NanDetector``: its backward hooks fail on a RoBERTa encoder with this torch (StopIteration,
    a module output without tensors), which replaced the FloatingPointError by another traceback."""
    import contextlib

    cls = trainer.Trainer
    if getattr(cls, "_fairseq_idpg_diverged", False):
        return
    trainer.NanDetector = lambda model, *args, **kwargs: contextlib.nullcontext()
    train_step, save_checkpoint = cls.train_step, cls.save_checkpoint

    def diverging_train_step(self, samples, raise_oom=False):
        try:
            return train_step(self, samples, raise_oom)
        except Diverged:  # an inner call's (fairseq's AMP retries call train_step again)
            raise
        except FloatingPointError as e:
            lr = self.cfg.optimization.lr[0] if self.cfg.optimization.lr else None
            raise Diverged(self.get_num_updates() + 1, str(e), lr) from e

    def skipping_crash_save(self, filename, extra_state):
        if os.path.basename(filename) == "crash.pt" and isinstance(sys.exc_info()[1], FloatingPointError):
            return None  # nothing resumes from a diverged state; its write cost time and disk
        return save_checkpoint(self, filename, extra_state)

    cls.train_step, cls.save_checkpoint = diverging_train_step, skipping_crash_save
    cls._fairseq_idpg_diverged = True


def _patch_trainer(module):
    trainer_overflow_without_cuda(module)
    one_line_divergence(module)


# ---------------------------------------------------------------- 14. foreach Adam
_HALF = ("float16", "bfloat16")


def _master_dtype(torch, p):
    """fairseq's ``p_data_fp32``'s dtype: fp32 for a half tensor, else the tensor's own."""
    return torch.float32 if str(p.dtype).rsplit(".", 1)[-1] in _HALF else p.dtype


def _adam_state(torch, state, p, amsgrad):
    """fairseq's per-tensor state (``step`` an int, the moments in the master dtype), made or moved back to
    it (a loaded state dict is cast to the parameter's dtype by torch); no operator when already there."""
    dtype = _master_dtype(torch, p)
    keys = ("exp_avg", "exp_avg_sq", "max_exp_avg_sq") if amsgrad else ("exp_avg", "exp_avg_sq")
    if len(state) == 0:
        state["step"] = 0
        for key in keys:
            state[key] = torch.zeros_like(p, dtype=dtype)
    for key in keys:
        if state[key].dtype != dtype or state[key].device != p.device:
            state[key] = state[key].to(device=p.device, dtype=dtype)
    return state


def _adam_buckets(torch, optimizer, group):
    """The group's tensors with a gradient, their step counted, in buckets that one set of foreach operators
    updates: the same device, dtype and step (a tensor without a gradient in some update lags behind)."""
    buckets = {}
    for p in group["params"]:
        if p.grad is None:
            continue
        if p.grad.is_sparse:
            raise RuntimeError("Adam does not support sparse gradients, please consider SparseAdam instead")
        state = _adam_state(torch, optimizer.state[p], p, group.get("amsgrad", False))
        state["step"] += 1
        buckets.setdefault((p.device, p.dtype, p.grad.dtype, state["step"]), []).append((p, state))
    return list(buckets.values())


def _as_dtype(torch, tensors, dtype):
    """``tensors`` in ``dtype``: themselves, or fp32 copies made by one foreach copy (fairseq's ``.float()``)."""
    if tensors[0].dtype == dtype:
        return tensors
    copies = [torch.empty_like(t, dtype=dtype) for t in tensors]
    torch._foreach_copy_(copies, tensors)
    return copies


def _adam_update(torch, bucket, group):
    """fairseq's ``Adam.step`` for one bucket, operator for operator, each a foreach operator."""
    import math

    params, states = [p for p, _ in bucket], [s for _, s in bucket]
    dtype, step = _master_dtype(torch, params[0]), states[0]["step"]
    grads, master = _as_dtype(torch, [p.grad for p in params], dtype), _as_dtype(torch, params, dtype)
    exp_avg, exp_avg_sq = [s["exp_avg"] for s in states], [s["exp_avg_sq"] for s in states]
    (beta1, beta2), lr = group["betas"], group["lr"]
    torch._foreach_mul_(exp_avg, beta1)
    torch._foreach_add_(exp_avg, grads, alpha=1 - beta1)
    torch._foreach_mul_(exp_avg_sq, beta2)
    torch._foreach_addcmul_(exp_avg_sq, grads, grads, value=1 - beta2)
    if group.get("amsgrad", False):
        max_exp_avg_sq = [s["max_exp_avg_sq"] for s in states]
        torch._foreach_maximum_(max_exp_avg_sq, exp_avg_sq)
        exp_avg_sq = max_exp_avg_sq
    denom = torch._foreach_sqrt(exp_avg_sq)
    torch._foreach_add_(denom, group["eps"])  # eps before the bias correction, as fairseq
    step_size = lr * math.sqrt(1 - beta2**step) / (1 - beta1**step)
    if group["weight_decay"] != 0:
        torch._foreach_add_(master, master, alpha=-group["weight_decay"] * lr)
    torch._foreach_addcdiv_(master, exp_avg, denom, value=-step_size)
    if master is not params:
        torch._foreach_copy_(params, master)


def foreach_adam(adam):
    """``fairseq.optim.adam.Adam`` becomes ``ForeachAdam``: its update over each parameter group at once."""
    if getattr(adam.Adam, "_fairseq_idpg_compat", False):
        return
    import torch

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0, amsgrad=False):
        # fairseq's, without its ``super(Adam, self)``: ``Adam`` is looked up in the module, now this class
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad)
        torch.optim.Optimizer.__init__(self, params, defaults)

    # fairseq's loop, constructible whatever ``adam.Adam`` names
    per_tensor = type("PerTensorAdam", (adam.Adam,), {"__init__": __init__, "__module__": adam.__name__})

    class ForeachAdam(torch.optim.Optimizer):
        """fairseq's Adam (``per_tensor``: its loop over the tensors) in foreach operators (fix 14)."""

        _fairseq_idpg_compat = True
        supports_memory_efficient_fp16 = True
        supports_flat_params = True

        @torch.no_grad()
        def step(self, closure=None):
            loss = closure() if closure is not None else None
            for group in self.param_groups:
                for bucket in _adam_buckets(torch, self, group):
                    _adam_update(torch, bucket, group)
            return loss

    ForeachAdam.__init__ = __init__
    ForeachAdam.per_tensor = per_tensor
    ForeachAdam.__module__ = adam.__name__
    adam.Adam = ForeachAdam


# ---------------------------------------------------------------- 15. foreach gradient loops
def _foreach_clip_grad_norm(utils):
    """``utils.clip_grad_norm_``: the per-tensor norms and the clip's multiplies as foreach operators."""
    import torch

    original = utils.clip_grad_norm_

    def clip_grad_norm_(params, max_norm, aggregate_norm_fn=None):
        params = [params] if isinstance(params, torch.Tensor) else list(params)
        with_grad = [p for p in params if p is not None and getattr(p, "grad", None) is not None]
        plain = not any(hasattr(p, "expert") for p in with_grad)
        if len(with_grad) < 2 or not plain or utils.multi_tensor_l2norm_available or with_grad[0].device.type == "xla":
            return original(params, max_norm, aggregate_norm_fn)
        grads = [p.grad.detach() for p in with_grad]
        total_norm = torch.norm(torch.stack(torch._foreach_norm(grads, 2, dtype=torch.float32)))
        if aggregate_norm_fn is not None:
            total_norm = aggregate_norm_fn(total_norm)
        if max_norm > 0:
            clip_coef = (float(max_norm) / (total_norm + 1e-6)).clamp_(max=1)
            torch._foreach_mul_(grads, clip_coef)
        return total_norm

    clip_grad_norm_._fairseq_idpg_compat, clip_grad_norm_.per_tensor = True, original
    utils.clip_grad_norm_ = clip_grad_norm_


def _foreach_multiply_grads(fairseq_optimizer):
    """``FairseqOptimizer.multiply_grads``: one foreach multiply."""
    import torch

    per_tensor = fairseq_optimizer.FairseqOptimizer.multiply_grads

    def multiply_grads(self, c):
        grads = [p.grad.data for p in self.params if p.grad is not None]
        if grads and not torch.is_tensor(c) and grads[0].dtype in (torch.float16, torch.bfloat16):
            return per_tensor(self, c)  # the CPU's foreach multiply of a half tensor by a number rounds otherwise
        if grads:
            torch._foreach_mul_(grads, c.to(grads[0].device) if torch.is_tensor(c) else c)

    multiply_grads.per_tensor = per_tensor
    fairseq_optimizer.FairseqOptimizer.multiply_grads = multiply_grads


def foreach_gradient_loops(module):
    """Fix 15 in ``fairseq.utils`` and ``fairseq.optim.fairseq_optimizer``, each patched once."""
    if module.__name__ == "fairseq.utils" and not getattr(module.clip_grad_norm_, "_fairseq_idpg_compat", False):
        _foreach_clip_grad_norm(module)
    elif module.__name__ == "fairseq.optim.fairseq_optimizer" and not hasattr(
        module.FairseqOptimizer.multiply_grads, "per_tensor"
    ):
        _foreach_multiply_grads(module)


def _fp32_pairs(optimizer):
    """(fp16 parameters, their fp32 copies) of a not flattened ``FP16Optimizer``, the trained ones."""
    pairs = [(p, p32) for p, p32 in zip(optimizer.fp16_params, optimizer.fp32_params, strict=True) if p.requires_grad]
    return [p for p, _ in pairs], [p32 for _, p32 in pairs]


def _fp32_views(optimizer, grads):
    """(trained fp16 parameters, the fp32 tensors they are copied to and from: their copies' data or gradients,
    or the slices of the flat copy viewed as them); None where fairseq's loop runs (flat copies on several
    devices, a copy without a gradient yet)."""
    if not optimizer.has_flat_params:
        params, copies = _fp32_pairs(optimizer)
        if grads and any(p32.grad is None for p32 in copies):
            return None
        return params, [(p32.grad if grads else p32).data for p32 in copies]
    flats, params = optimizer.fp32_params, list(optimizer.fp16_params)
    if not isinstance(flats, dict) or len(flats) != 1 or len({p.device for p in params}) != 1:
        return None
    flat = next(iter(flats.values()))
    target, views, offset = (flat.grad if grads else flat).data, [], 0
    for p in params:  # the flat copy's layout (fairseq's build_fp32_params: the parameters in order)
        views.append(target[offset : offset + p.numel()].view_as(p))
        offset += p.numel()
    return params, views


def foreach_fp32_copies(fp16_optimizer):
    """``FP16Optimizer``'s per-tensor copies to and from its fp32 copies (flat or not), and the zeroing of the
    not flattened ones, as foreach operators."""
    import torch

    mixin = fp16_optimizer._FP16OptimizerMixin
    sync_grads, sync_params, zero_grad = (
        mixin._sync_fp16_grads_to_fp32, mixin._sync_fp32_params_to_fp16, mixin.zero_grad
    )  # fmt: skip

    def _sync_fp16_grads_to_fp32(self):
        views = _fp32_views(self, grads=True) if self._needs_sync else None
        if not views or not views[0]:
            return sync_grads(self)  # fairseq's: the first update, several devices, nothing to do
        params, targets = views
        reached = [(p.grad.data, t) for p, t in zip(params, targets, strict=True) if p.grad is not None]
        unreached = [t for p, t in zip(params, targets, strict=True) if p.grad is None]
        if reached:
            torch._foreach_copy_([t for _, t in reached], [g for g, _ in reached])
        if unreached:  # fairseq copies zeros for them (a head the loss does not reach)
            torch._foreach_zero_(unreached)
        self._needs_sync = False

    def _sync_fp32_params_to_fp16(self):
        views = _fp32_views(self, grads=False)
        if not views or not views[0]:
            return sync_params(self)
        torch._foreach_copy_([p.data for p in views[0]], views[1])

    def foreach_zero_grad(self):
        if self.has_flat_params:
            return zero_grad(self)
        for p in self.fp16_params:
            p.grad = None
        grads = [p32.grad for p32 in self.fp32_params if p32.grad is not None]
        if grads:
            torch._foreach_zero_(grads)
        self._needs_sync = False
        if self.scaler is not None:
            self._multiply_factor = 1.0 / float(self.scaler.loss_scale)

    mixin._fairseq_idpg_per_tensor = dict(
        _sync_fp16_grads_to_fp32=sync_grads, _sync_fp32_params_to_fp16=sync_params, zero_grad=zero_grad
    )
    mixin._sync_fp16_grads_to_fp32, mixin.zero_grad = _sync_fp16_grads_to_fp32, foreach_zero_grad
    mixin._sync_fp32_params_to_fp16 = _sync_fp32_params_to_fp16


# ---------------------------------------------------------------- 16. optimizers without torch._dynamo
def _until_dynamo(fn, recursive):
    """What torch's ``_disable_dynamo`` wrapper of ``fn`` calls (its ``__dynamo_disable`` cache): ``fn`` itself
    while ``torch._dynamo`` is not imported (nothing can be compiling), torch's ``disable`` of it once it is."""

    def call(*args, **kwargs):
        if "torch._dynamo" not in sys.modules:
            return fn(*args, **kwargs)
        disabled = sys.modules["torch._dynamo"].disable(fn, recursive, wrapping=False)
        setattr(fn, "__dynamo_disable", disabled)  # torch's own cache from now on
        return disabled(*args, **kwargs)

    call._fairseq_idpg_compat = True
    return call


def dynamo_guarded(cls):
    """(function, recursive) of each method of ``cls`` that torch wrapped in ``torch._disable_dynamo``."""
    for method in vars(cls).values():
        code = getattr(method, "__code__", None)  # the wrapper's own (functools.wraps copies the names)
        if code is None or code.co_qualname != "_disable_dynamo.<locals>.inner":
            continue
        cells = dict(zip(code.co_freevars, (c.cell_contents for c in method.__closure__ or ()), strict=True))
        if cells.get("fn") is not None:
            yield cells["fn"], cells.get("recursive", True)


def optimizer_without_dynamo_import(optimizer):
    """Fix 16 in ``torch.optim.optimizer``: each ``Optimizer`` method wrapped by ``torch._disable_dynamo``."""
    for fn, recursive in dynamo_guarded(optimizer.Optimizer):
        if getattr(fn, "__dynamo_disable", None) is None:
            setattr(fn, "__dynamo_disable", _until_dynamo(fn, recursive))


# ---------------------------------------------------------------- 18. per-run state
class RunState:
    """fairseq's per-run state (fix 18): the metrics module's aggregators and the function attributes
    ``save_checkpoint.best``, ``should_stop_early.best`` and ``.num_runs`` (``attributes``: function -> dict)."""

    def __init__(self):
        from collections import OrderedDict, defaultdict

        self.aggregators = OrderedDict()
        self.active_aggregators = OrderedDict()
        self.active_aggregators_cnt = defaultdict(int)
        self.attributes = {}


_PROCESS_RUN = None  # the state of a process's one run (every run but a fused group's members): made at first use
_RUN = contextvars.ContextVar("fairseq_run_state")  # a context's own run (new_run)


def run_state():
    """The current run's ``RunState``: the context's own (``new_run``), else the process's."""
    global _PROCESS_RUN
    state = _RUN.get(None)
    if state is None:
        if _PROCESS_RUN is None:
            _PROCESS_RUN = RunState()
        state = _PROCESS_RUN
    return state


def new_run():
    """Give the current context (a thread's, or a ``contextvars.Context`` being run) a fresh ``RunState``: from
    here on, fairseq's per-run state in this context is its own and nobody else's."""
    _RUN.set(RunState())


class _RunMapping(MutableMapping):
    """A module global of fairseq's metrics that is the current run's (fix 18): every read and write goes to
    ``run_state().<field>``."""

    def __init__(self, field):
        self._field = field

    def _own(self):
        return getattr(run_state(), self._field)

    def __getitem__(self, key):
        return self._own()[key]  # (a defaultdict's missing key: its default, as before)

    def __setitem__(self, key, value):
        self._own()[key] = value

    def __delitem__(self, key):
        del self._own()[key]

    def __iter__(self):
        return iter(self._own())

    def __len__(self):
        return len(self._own())

    def __contains__(self, key):
        return key in self._own()

    def clear(self):
        self._own().clear()

    def copy(self):
        return self._own().copy()

    def __repr__(self):
        return f"<{self._field} of the current run: {self._own()!r}>"


class RunAttributes:
    """A fairseq function whose attributes are the current run's (fix 18); calling it calls the function."""

    def __init__(self, fn):
        object.__setattr__(self, "__wrapped__", fn)
        object.__setattr__(self, "_fairseq_idpg_compat", True)

    def __call__(self, *args, **kwargs):
        return self.__wrapped__(*args, **kwargs)

    def _own(self):
        return run_state().attributes.setdefault(self.__wrapped__, {})

    def __getattr__(self, name):
        own = self._own()
        if name in own:
            return own[name]
        return getattr(self.__wrapped__, name)  # __name__, __doc__, ... (fairseq sets nothing else on them)

    def __setattr__(self, name, value):
        self._own()[name] = value

    def __delattr__(self, name):
        try:
            del self._own()[name]
        except KeyError:
            raise AttributeError(name) from None


def per_run_metrics(metrics):
    """fairseq's metrics module keeps the run's aggregators in three module globals (fix 18)."""
    if isinstance(metrics._aggregators, _RunMapping):
        return
    state = run_state()  # what the module made at import (its ``reset()``): the process's run's
    for field in ("aggregators", "active_aggregators", "active_aggregators_cnt"):
        getattr(state, field).update(getattr(metrics, f"_{field}"))
        setattr(metrics, f"_{field}", _RunMapping(field))


def per_run_attributes(module, name):
    """``module.name``: a function whose attributes are the current run's (fix 18)."""
    fn = getattr(module, name)
    if not isinstance(fn, RunAttributes):
        setattr(module, name, RunAttributes(fn))


# ---------------------------------------------------------------- 19. gradients given to fairseq's optimizer
def gradients_given(optimizer):
    """Tell ``optimizer`` (a trainer's) that its tensors' ``.grad`` were set from outside, not by its ``backward``
    (fix 19): ``FP16Optimizer`` then copies them to its fp32 copies before clipping and stepping, as after its
    own ``backward``."""
    if hasattr(optimizer, "_needs_sync"):
        optimizer._needs_sync = True


def takes_known_gradient_norm(optimizer):
    """Whether ``known_gradient_norm`` applies to ``optimizer`` (a trainer's): under ``FP16Optimizer``."""
    from fairseq.optim.fp16_optimizer import _FP16OptimizerMixin

    return isinstance(optimizer, _FP16OptimizerMixin)


def known_gradient_norm(optimizer, norm):
    """The next gradient norm that ``optimizer`` (a trainer's ``FP16Optimizer``) asks its fp32 optimizer for is
    ``norm`` (a host float), not computed again (fix 19). ``FP16Optimizer.clip_grad_norm`` asks it for the norm
    only (``max_norm`` 0) and then scales, clips and checks it for overflow as it does; anything else (clipping
    asked there, an aggregate function, no norm given) is fairseq's own computation. True where it applies (under
    ``FP16Optimizer``), False otherwise (fp32 runs compute theirs as fairseq does)."""
    if not takes_known_gradient_norm(optimizer):
        return False
    inner = optimizer.fp32_optimizer
    if not isinstance(inner.__dict__.get("clip_grad_norm"), _KnownNorm):
        inner.clip_grad_norm = _KnownNorm(inner.clip_grad_norm)
    inner.clip_grad_norm.norm = norm
    return True


class _KnownNorm:
    """An fp32 optimizer's ``clip_grad_norm`` that answers a known norm once (``known_gradient_norm``)."""

    def __init__(self, own):
        self.own, self.norm = own, None

    def __call__(self, max_norm, aggregate_norm_fn=None):
        import torch

        from fairseq_idpg.host_tensors import on_host  # (a leaf: the launch counter counts no kernel for it)

        norm, self.norm = self.norm, None
        if norm is None or max_norm > 0 or aggregate_norm_fn is not None:
            return self.own(max_norm, aggregate_norm_fn)
        return on_host(torch.tensor(norm, dtype=torch.float32))


# ---------------------------------------------------------------- 20. tensorboard writer when asked
def _summary_writer(*args, **kwargs):
    """tensorboardX's ``SummaryWriter(*args, **kwargs)``, tensorboardX imported now (fix 20)."""
    from tensorboardX import SummaryWriter

    return SummaryWriter(*args, **kwargs)


class tensorboard_writer_when_asked:
    """While a module that imports ``tensorboardX`` for its ``SummaryWriter`` loads, ``tensorboardX`` is a module
    holding ``_summary_writer`` only (fix 20); the real one is imported at the writer's first call."""

    def __enter__(self):
        self.stand_in = None
        if "tensorboardX" not in sys.modules and importlib.util.find_spec("tensorboardX") is not None:
            self.stand_in = type(sys)("tensorboardX")
            self.stand_in.SummaryWriter = _summary_writer
            sys.modules["tensorboardX"] = self.stand_in

    def __exit__(self, *exc):
        if self.stand_in is not None and sys.modules.get("tensorboardX") is self.stand_in:
            del sys.modules["tensorboardX"]


# ---------------------------------------------------------------- post-import hook
_POST_IMPORT = {
    "fairseq.checkpoint_utils": _patch_checkpoint_utils,
    "fairseq.distributed.utils": _patch_distributed_utils,
    "fairseq.options": bf16_without_tpu,
    "fairseq.optim.fp16_optimizer": _patch_fp16_optimizer,
    "fairseq.optim.fairseq_optimizer": foreach_gradient_loops,
    "fairseq.utils": foreach_gradient_loops,
    "fairseq.optim.adam": foreach_adam,
    "fairseq.trainer": _patch_trainer,
    "fairseq.modules.transformer_layer": no_fast_path_duplicates,
    "fairseq_cli.train": _patch_train,
    "fairseq.logging.metrics": per_run_metrics,
    "fairseq_cli.validate": _patch_validate,
    "hydra.core.plugins": hydra_plugin_scan_without_find_module,
    "torch.optim.optimizer": optimizer_without_dynamo_import,
    "fairseq.dataclass.utils": _patch_dataclass_utils,
}


# modules run under a context (fix 20): what they import while they load
_WHILE_LOADING = {
    "fairseq.logging.progress_bar": tensorboard_writer_when_asked,
    "fairseq.tasks.text_to_speech": tensorboard_writer_when_asked,
}


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, loader, patch, context=None):
        self._loader, self._patch, self._context = loader, patch, context

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        if self._context is None:
            self._loader.exec_module(module)
        else:
            with self._context():
                self._loader.exec_module(module)
        if self._patch is not None:
            self._patch(module)

    def __getattr__(self, name):  # get_source, get_code, is_package, ... for tracebacks
        return getattr(self._loader, name)


class _PostImportFinder(importlib.abc.MetaPathFinder):
    """Finds the modules of ``_POST_IMPORT`` and ``_WHILE_LOADING`` the normal way, loads them under their context
    and patches them once loaded."""

    def find_spec(self, fullname, path=None, target=None):
        patch, context = _POST_IMPORT.get(fullname), _WHILE_LOADING.get(fullname)
        if patch is None and context is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _PatchingLoader(spec.loader, patch, context)
                return spec
        return None


def install():
    """Apply every fix; idempotent. Modules already imported are patched at once."""
    if sys.version_info >= (3, 11):
        dataclass_identity_hash()
    if not any(isinstance(f, _PostImportFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _PostImportFinder())
    for name, patch in _POST_IMPORT.items():
        if name in sys.modules:
            patch(sys.modules[name])


install()
