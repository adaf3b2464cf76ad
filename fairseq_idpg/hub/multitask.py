"""One frozen backbone serving every attached task at once: rows of different tasks and methods in one batch.

    from fairseq_idpg.hub import MultiTaskModel

    mt = MultiTaskModel("models/minilm-l6-fairseq/model.pt",
                        bpe="wordpiece", wordpiece_vocab="models/minilm-l6-fairseq/vocab.txt")
    mt.attach("sst2", "checkpoints/standin/SST-2/lora/lr2e-4.seed1.0123abcd")
    mt.attach("rte", "checkpoints/standin/RTE/m-idpg-phm/lr1e-3.seed1.89abcdef")
    mt.predict(["sst2", "rte"], ["a gripping film .", ("A man sleeps .", "Nobody sleeps .")])
    # [{"task": "sst2", "label": "1", "probabilities": {"0": 0.1, "1": 0.9}}, {"task": "rte", "label": ...}]

Each task keeps its own preprocessing (its BPE, sentence pairs), head and label names; each row's logits equal
those its task's own fairseq model computes alone (tests/test_multitask.py). The rows of one method
configuration (``groups.py``) go through the backbone in one pass, whatever their tasks; each further method
configuration present in the batch is one more pass. One copy of the backbone is kept, whatever the number of
tasks: each group's template model points at it, and each task adds only its trained tensors.
"""

from collections import OrderedDict

import torch

from .attached import HEAD, frozen_tensors, load_run, share_backbone
from .groups import MethodGroup


class InputTooLong(ValueError):
    """A row with more tokens than its task's model takes."""


class MultiTaskModel:
    """A frozen backbone (``backbone``: its fairseq checkpoint) and any number of trained runs attached by name.

    ``hub_options``: options every attached run loads with (``from_pretrained``'s overrides: the BPE and its
    files); ``attach`` takes more per run. ``device``: where the backbone and the tasks' tensors live."""

    def __init__(self, backbone, head=HEAD, device="cpu", **hub_options):
        self.backbone, self.head, self.device = str(backbone), head, torch.device(device)
        self.hub_options = hub_options
        self.tasks = OrderedDict()  # name -> AttachedTask
        self.groups = []  # MethodGroup, in order of first attach
        self._shared = None  # the backbone's tensors, by name

    # ------------------------------------------------------------------ tasks
    def attach(self, name, run, checkpoint=None, data=None, **overrides):
        """Attach run ``run`` (a run folder, a shared checkpoint's folder or a checkpoint file) as task ``name``;
        returns its ``AttachedTask``."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"task name: expected a non-empty string, got {name!r}")
        if name in self.tasks:
            raise ValueError(f"task {name}: already attached ({self.tasks[name].checkpoint}); detach it first")
        options = {**self.hub_options, **overrides}
        task, model = load_run(name, run, self.backbone, checkpoint, data, head=self.head, **options)
        task.state = {n: t.to(self.device) for n, t in task.state.items()}
        group = next((g for g in self.groups if g.key == task.key), None)
        if group is None:
            model = model.to(self.device)
            if self._shared is None:
                self._shared = frozen_tensors(model)
            else:
                share_backbone(model, self._shared)
            group = MethodGroup(task.key, model, self.head)
            self.groups.append(group)
        group.add(task)
        self.tasks[name] = task
        return task

    def detach(self, name):
        """Remove task ``name`` (its group goes when it is the last)."""
        self._task(name)
        del self.tasks[name]
        for group in self.groups:
            group.remove(name)
        self.groups = [g for g in self.groups if g.tasks]

    def _task(self, name):
        if name not in self.tasks:
            known = ", ".join(self.tasks) or "none"
            raise KeyError(f"unknown task {name!r}; attached: {known}")
        return self.tasks[name]

    # ------------------------------------------------------------------ text -> tokens
    def encode(self, name, text):
        """Token ids [T] of ``text`` (a sentence, or a pair as a 2-tuple/list) with task ``name``'s preprocessing."""
        task = self._task(name)
        texts = (text,) if isinstance(text, str) else tuple(text)
        if not texts or not all(isinstance(t, str) for t in texts) or len(texts) > 2:
            raise TypeError(f"task {name}: a sentence is a string or a pair of strings, got {text!r}")
        if len(texts) != (2 if task.pair else 1):
            want = "a pair of sentences" if task.pair else "one sentence"
            raise ValueError(f"task {name}: takes {want} per row, got {len(texts)}")
        tokens = task.text.encode(*texts)
        if len(tokens) > task.max_tokens:
            raise InputTooLong(
                f"task {name}: input of {len(tokens)} tokens, longer than the {task.max_tokens} it takes"
            )
        return tokens

    def passes(self, names):
        """How many passes through the backbone a batch of rows of tasks ``names`` takes (method groups)."""
        keys = {self._task(n).key for n in names}
        return len(keys)

    # ------------------------------------------------------------------ inference
    def logits(self, names, texts):
        """Each row's logits (a tensor [classes of its task]; regression: [1]). ``names``: one task name for
        every row, or one per row; ``texts``: a sentence or pair per row."""
        names = self._names(names, texts)
        return self.logits_of_tokens(names, [self.encode(n, t) for n, t in zip(names, texts, strict=True)])

    def logits_of_tokens(self, names, rows):
        """``logits`` of rows already encoded (``encode``): one pass per method group present."""
        out = [None] * len(rows)
        for group in self.groups:
            index = {t.name: i for i, t in enumerate(group.tasks)}
            mine = [i for i, n in enumerate(names) if n in index]
            if not mine:
                continue
            member = torch.tensor([index[names[i]] for i in mine])
            logits = group.run([rows[i] for i in mine], member).float().cpu()
            for i, row in zip(mine, logits, strict=True):
                out[i] = row[: self.tasks[names[i]].num_outputs]
        return out

    @staticmethod
    def _names(names, texts):
        names = [names] * len(texts) if isinstance(names, str) else list(names)
        if len(names) != len(texts):
            raise ValueError(f"{len(names)} task names for {len(texts)} rows: give one per row, or one for all")
        return names

    def predict(self, names, texts):
        """Each row's prediction: ``{"task", "label", "probabilities": {label: p}}``, or for a regression task
        ``{"task", "score"}``."""
        names = self._names(names, texts)
        return self.predictions(names, self.logits(names, texts))

    def predictions(self, names, logits):
        """``predict``'s dicts from each row's task name and logits."""
        results = []
        for name, row in zip(names, logits, strict=True):
            task = self.tasks[name]
            if task.labels is None:
                results.append({"task": name, "score": float(row[0])})
                continue
            probabilities = dict(zip(task.labels, torch.softmax(row, -1).tolist(), strict=True))
            results.append({"task": name, "label": task.labels[int(row.argmax())], "probabilities": probabilities})
        return results

    def describe(self):
        """{task: {arch, classes or "regression", pair, group}}: what is attached, and which tasks share a pass."""
        group_of = {t.name: i for i, g in enumerate(self.groups) for t in g.tasks}
        return {
            name: {"arch": t.arch, "labels": t.labels, "pair": t.pair, "group": group_of[name]}
            for name, t in self.tasks.items()
        }
