"""A sweep's specification (``examples/*/*.yaml``; its keys are described in ``fairseq_idpg/sweep.py``): read,
checked key by key (one line naming the file and the key), and expanded into its runs, each the request of one
``scripts/run.sh`` run; the names of its few-shot budgets, which the results tables read back."""

import itertools
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Iterable, List, Optional

from fairseq_idpg.errors import SweepError
from fairseq_idpg.run import (
    format_lr,
)
from fairseq_idpg.run_config import RunConfig, RunError, canonical_task

SPEC_KEYS = {"name", "description", "model", "published", "tasks", "methods", "lrs", "seeds", "budget"}
SPEC_KEYS |= {"max_update", "args", "head_lrs"}
VARIANT_KEYS = {"label", "method", "args", "lrs", "head_lrs", "seeds", "tasks", "max_update"}
BUDGET_KEYS = {"few_shot", "data_seed", "dev_from_train", "split_dev"}
SPLIT_DEV = "split-dev"  # the budget's name of ``split_dev: true`` in records and tables


# ---------------------------------------------------------------------------------------- the specification
@dataclass(frozen=True)
class Run:
    """One cell entry: a run's request (a method on a task at one lr, seed and data budget) under its
    table label. ``run.task``, ``run.lr``, ... are the request's fields."""

    config: RunConfig  # lr None: the one run.sh chooses (the recipe's, the stand-in's fine-tuning lr)
    label: str
    table_budget: Optional[str] = None  # a per-task K's common name in tables, "K=1000 (CR: 775)"

    def __getattr__(self, name):
        if name == "config":  # not set yet (unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.config, name)

    @property
    def budget(self):
        """The budget's name in records and tables: full, K=<k>, dev<N>, split-dev (or the spec's per-task name)."""
        if self.table_budget:
            return self.table_budget
        if self.few_shot is not None:
            return few_shot_budget(self.few_shot)
        if self.dev_from_train is not None:
            return f"dev{self.dev_from_train}"
        return SPLIT_DEV if self.split_dev else "full"

    @property
    def name(self):
        lr = f"lr{format_lr(self.lr)}" if self.lr is not None else "lr-recipe"
        lr += f".headlr{format_lr(self.head_lr)}" if self.head_lr is not None else ""
        if self.few_shot is not None:
            data = f"K={self.few_shot}.data{self.data_seed}."
        elif self.dev_from_train is not None:
            data = f"dev{self.dev_from_train}.data{self.data_seed}."
        else:
            data = f"{SPLIT_DEV}.data{self.data_seed}." if self.split_dev else ""
        return f"{self.task}.{self.label}.{data}{lr}.seed{self.seed}"

    def request(self, model, work_dir, dry_run=False):
        """The run's request on ``model`` in ``work_dir``."""
        return replace(self.config, model=model, work_dir=str(work_dir), dry_run=dry_run)

    def argv(self, model, work_dir):
        """run.sh's command line."""
        return self.request(model, work_dir).argv()


@dataclass
class Spec:
    name: str
    path: Path
    description: str = ""
    model: str = "standin"
    published: Optional[str] = None
    runs: List[Run] = field(default_factory=list)


def _list(value, where, kind, least=None):
    """``value`` as a list whose items are each of ``kind`` (int: at least ``least``, when given)."""
    values = value if isinstance(value, list) else [value]
    for v in values:
        if kind is int and (isinstance(v, bool) or not isinstance(v, int)):
            valid = f" (valid: integers >= {least})" if least is not None else ""
            raise SweepError(f"{where}: {v!r} is not an integer{valid}")
        if kind is int and least is not None and v < least:
            raise SweepError(f"{where}: {v!r} is too small (valid: integers >= {least})")
        if kind is float and not _positive(v):
            raise SweepError(f"{where}: {v!r} is not a positive number (valid: finite numbers > 0, e.g. 1e-3)")
        if kind is str and not isinstance(v, str):
            raise SweepError(f"{where}: {v!r} is not a name")
    return values


def _positive(value):
    """YAML 1.1 reads 5e-3 as text (a float needs a dot there): numbers in either form."""
    try:
        return not isinstance(value, bool) and math.isfinite(float(value)) and float(value) > 0  # not .inf, .nan
    except (TypeError, ValueError):
        return False


def _unknown(mapping, valid, where):
    extra = sorted(set(mapping) - valid)
    if extra:
        raise SweepError(f"{where}: unknown key {extra[0]!r}; valid: {', '.join(sorted(valid))}")


def known_task(name, where):
    """The task's canonical name; one line naming ``where`` for a task the project does not have."""
    try:
        return canonical_task(str(name))
    except RunError as e:
        raise SweepError(f"{where}: {e}") from None


def _few_shot(value, tasks, where):
    """task -> [(K, its table budget name or None)]. ``value``: K, [K...], or per task
    ``{default: [100, 500, 1000], CR: [100, 500, 775]}`` (lists of one length): the i-th K of every
    task shares a table, named ``K=1000 (CR: 775)`` where a task's K differs from the default."""
    per_task = value if isinstance(value, dict) else {"default": value}
    per_task = {
        k if k == "default" else known_task(k, where): _list(v, f"{where} ({k})", int, least=1)
        for k, v in per_task.items()
    }
    default = per_task.get("default")
    if default is None:
        missing = [t for t in tasks if t not in per_task]
        if missing:
            raise SweepError(f"{where} names no K for {missing[0]} (give it, or a default)")
        default = per_task[tasks[0]]
    if any(len(ks) != len(default) for ks in per_task.values()):
        raise SweepError(f"{where}: every task's list of K has the same length (the i-th K of each share a table)")
    names = []
    for i, k in enumerate(default):
        differ = [f"{t}: {ks[i]}" for t, ks in per_task.items() if t != "default" and ks[i] != k]
        names.append(few_shot_budget(k, differ) if differ else None)
    return {t: list(zip(per_task.get(t, default), names, strict=False)) for t in tasks}


def _lrs(value, method, task, where):
    """The learning rates a run list gets: the recipe's grid, its one lr (None), or the list given."""
    if value in (None, "paper"):
        recipe = method.recipe.for_task(task)
        return list(recipe.lr_grid) or [None]
    if value == "recipe":
        return [None]
    if isinstance(value, str):
        raise SweepError(f"{where}: lrs {value!r}; valid: paper, recipe, or a list of numbers")
    return [float(v) for v in _list(value, where, float)]


def _head_lrs(value, where):
    """The head lrs a run list gets: [None] (the recipe's, else the lr) or the list given."""
    return [None] if value is None else [float(v) for v in _list(value, where, float)]


def load_spec(path, model=None, tasks=None, methods=None, seeds=None, max_update=None):
    """The specification at ``path`` as its list of runs (``tasks``, ``methods``, ``seeds`` narrow it;
    ``model`` and ``max_update`` override it). SweepError names the key and what is valid."""
    path = Path(path)
    data = _read_spec(path)
    spec = Spec(str(data["name"]), path, str(data.get("description", "")), model or data.get("model", "standin"))
    spec.published = data.get("published")
    all_tasks = [known_task(t, f"{path}: tasks") for t in _list(data["tasks"], path, str)]
    budgets = _budgets(data.get("budget", "full"), all_tasks, path)
    base_args = [str(a) for a in _list(data.get("args", []), f"{path}: args", object)] if data.get("args") else []
    labels = set()
    for entry in _list(data["methods"], f"{path}: methods", object):
        variant = _variant(entry, labels, path)
        where = f"{path}: {variant['label']}"
        run_tasks = (
            [known_task(t, where) for t in _list(variant["tasks"], where, str)] if "tasks" in variant else all_tasks
        )
        updates = variant.get("max_update", data.get("max_update"))
        if updates is not None:
            _list(updates, f"{where}: max_update", int, least=1)
        common = {
            "seeds": [s for s in _list(variant.get("seeds", data.get("seeds", [1])), f"{where}: seeds", int, least=0)
                      if not seeds or s in seeds],
            "lrs": variant.get("lrs", data.get("lrs")),
            "head_lrs": _head_lrs(variant.get("head_lrs", data.get("head_lrs")), f"{where}: head_lrs"),
            "max_update": max_update if max_update is not None else updates,
            "args": base_args + [str(a) for a in variant.get("args", [])],
        }  # fmt: skip
        if methods and variant["label"] not in methods and variant["method"] not in methods:
            continue
        for task in run_tasks:
            if tasks and task not in tasks:
                continue
            spec.runs += _runs(spec.model, task, variant, budgets(task, where), where, **common)
    if not spec.runs:
        raise SweepError(f"{path}: no run left (check --tasks / --methods / --seeds)")
    return spec


class DuplicateKey(Exception):
    """A mapping of the specification names a key twice."""


def _unique_keys_loader():
    """YAML's safe loader, refusing a key written twice in one mapping: PyYAML keeps the last one silently,
    so a second ``seeds:`` would replace the first unseen."""
    import yaml

    class UniqueKeys(yaml.SafeLoader):
        def construct_mapping(self, node, deep=False):
            seen = set()
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=True)
                if isinstance(key, (str, int, float, bool)) and key in seen:
                    line = key_node.start_mark.line + 1
                    raise DuplicateKey(f"line {line}: the key {key!r} is written twice in one mapping (keep one)")
                if isinstance(key, (str, int, float, bool)):
                    seen.add(key)
            return super().construct_mapping(node, deep=deep)

    return UniqueKeys


def _read_spec(path):
    """The YAML mapping, its keys checked."""
    import yaml

    if not path.is_file():
        raise SweepError(f"{path}: no such specification file")
    try:
        data = yaml.load(path.read_text(), Loader=_unique_keys_loader())
    except DuplicateKey as e:
        raise SweepError(f"{path}: {e}") from None
    except yaml.YAMLError as e:
        raise SweepError(f"{path}: not valid YAML ({str(e).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise SweepError(f"{path}: a specification is a mapping with keys {', '.join(sorted(SPEC_KEYS))}")
    _unknown(data, SPEC_KEYS, str(path))
    for key in ("name", "tasks", "methods"):
        if not data.get(key):
            raise SweepError(f"{path}: {key!r} is missing")
    return data


def _budgets(budget, tasks, path):
    """``budgets(task, where)``: a task's data budgets, [{few_shot, dev_from_train, split_dev, data_seed ("seed":
    the run's), name}]."""
    if budget == "full":
        return lambda task, where: [{}]
    if not isinstance(budget, dict):
        raise SweepError(
            f"{path}: budget {budget!r}; valid: full, or a mapping with few_shot, dev_from_train or split_dev"
        )
    _unknown(budget, BUDGET_KEYS, f"{path}: budget")
    given = [key for key in ("few_shot", "dev_from_train", "split_dev") if key in budget]
    if len(given) > 1:
        raise SweepError(f"{path}: budget: {' and '.join(given)} exclude each other")
    data_seed = budget.get("data_seed", "seed")
    if data_seed != "seed":
        _list(data_seed, f"{path}: budget.data_seed", int, least=0)
    if "few_shot" in budget:
        few_shot = _few_shot(budget["few_shot"], tasks, f"{path}: budget.few_shot")

        def per_task(task, where):
            if task not in few_shot:  # a variant's own task
                raise SweepError(f"{where}: budget.few_shot names no K for {task} (add it to the spec's tasks)")
            return [{"few_shot": k, "data_seed": data_seed, "name": name} for k, name in few_shot[task]]

        return per_task
    if "dev_from_train" in budget:
        _list(budget["dev_from_train"], f"{path}: budget.dev_from_train", int, least=1)
        return lambda task, where: [{"dev_from_train": int(budget["dev_from_train"]), "data_seed": data_seed}]
    if "split_dev" in budget:
        value = budget["split_dev"]
        if value is not True:
            shown = str(value).lower() if isinstance(value, bool) else repr(value)  # as YAML spells it
            raise SweepError(f"{path}: budget.split_dev: {shown}; valid: true (leave it out for the whole dev set)")
        return lambda task, where: [{"split_dev": True, "data_seed": data_seed}]
    raise SweepError(f"{path}: budget needs few_shot, dev_from_train or split_dev (or is 'full')")


def _variant(entry, labels, path):
    """A ``methods`` entry as a mapping with its method checked and its label (unique) set."""
    from fairseq_idpg.methods import METHODS

    variant = {"method": entry} if isinstance(entry, str) else entry
    if not isinstance(variant, dict):
        raise SweepError(f"{path}: methods: {entry!r} is neither a method name nor a mapping")
    _unknown(variant, VARIANT_KEYS, f"{path}: methods: {variant.get('label', variant.get('method'))}")
    name = variant.get("method")
    if name not in METHODS:
        raise SweepError(f"{path}: methods: unknown method {name!r}; valid: {', '.join(sorted(METHODS))}")
    label = str(variant.get("label", name))
    if label in labels:
        raise SweepError(f"{path}: methods: the label {label!r} is used twice (give variants their own label)")
    labels.add(label)
    return {**variant, "label": label}


def _runs(model, task, variant, budgets, where, seeds, lrs, head_lrs, max_update, args):
    """One variant's runs on one task: every budget x lr x head lr x seed."""
    from fairseq_idpg.methods import METHODS

    runs, name = [], variant["method"]
    for b in budgets:
        for lr, head_lr in itertools.product(_lrs(lrs, METHODS[name], task, f"{where}: lrs"), head_lrs):
            for seed in seeds:
                sample_seed = seed if b.get("data_seed") == "seed" else b.get("data_seed", 1)
                request = RunConfig(task, name, model, seed, lr=lr, head_lr=head_lr, few_shot=b.get("few_shot"),
                                    dev_from_train=b.get("dev_from_train"), split_dev=b.get("split_dev", False),
                                    data_seed=sample_seed, max_update=max_update)  # fmt: skip
                try:
                    request = request.with_flags(args)
                except RunError as e:
                    raise SweepError(f"{where}: args: {e}") from None
                runs.append(Run(request, variant["label"], b.get("name")))
    return runs


def few_shot_budget(k: int, differing: Iterable[str] = ()) -> str:
    """A few-shot budget's name: ``K=1000``, or, where some tasks sample another K for the same table
    (``differing``: ``"CR: 775"``), ``K=1000 (CR: 775)``. ``default_budget`` reads it back."""
    differing = list(differing)
    return f"K={k}" + (f" ({', '.join(differing)})" if differing else "")
