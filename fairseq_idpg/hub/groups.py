"""The tasks of one method configuration, run as members of one ``StackedMembers`` (one pass for all of them).

Members of different methods (another architecture, preset or setting) have other tensors or compute another
function, so they cannot share one vmap: each method configuration is its own group and its own pass through
the backbone (``attached.method_key`` says what must be equal). Within a group, tasks with different numbers
of classes differ only in their head's output layer: each member's is padded with zero rows to the group's
largest class count, and each row's logits are sliced back to its task's classes (the padded rows are zero
weights and biases: the real classes' logits are what the task's own head computes).
"""

import torch
from torch import nn

from fairseq_idpg.fused import StackedMembers

from .attached import HEAD
from .packing import pack


def padded_head(state, head, rows):
    """``state`` with the head's out_proj weight [C, d] and bias [C] padded with zero rows to ``rows``."""
    out = dict(state)
    for suffix in ("weight", "bias"):
        name = f"classification_heads.{head}.out_proj.{suffix}"
        value = state[name]
        extra = value.new_zeros((rows - value.size(0), *value.shape[1:]))
        out[name] = torch.cat([value, extra])
    return out


class MethodGroup:
    """Tasks of one method configuration on one template model (the first task's, its backbone shared)."""

    def __init__(self, key, template, head=HEAD):
        self.key, self.template, self.head = key, template, head
        self.tasks = []  # AttachedTask, in member order
        self._stacked = None

    def add(self, task):
        self.tasks.append(task)
        self._stacked = None  # rebuilt at the next pass

    def remove(self, name):
        self.tasks = [t for t in self.tasks if t.name != name]
        self._stacked = None

    @property
    def width(self):
        """The group's largest class count: every member's head has this many output rows."""
        return max(t.num_outputs for t in self.tasks)

    def stacked(self):
        if self._stacked is None:
            head = self.template.classification_heads[self.head]
            if head.out_proj.out_features != self.width:  # the template's head gets the padded shape too
                like = head.out_proj.weight
                head.out_proj = nn.Linear(like.size(1), self.width).to(like)
            members = [padded_head(t.state, self.head, self.width) for t in self.tasks]
            self._stacked = StackedMembers(self.template, members=members)
            self._stacked.tensors.requires_grad_(False)  # inference: no graph (the template keeps its flags)
        return self._stacked

    @torch.no_grad()
    def run(self, rows, member):
        """Logits [N, width] of ``rows`` (N token tensors) of members ``member`` [N], in one pass."""
        dictionary = self.tasks[0].text.task.source_dictionary
        tokens, used, local, slot = pack(rows, member, dictionary.pad(), dictionary.bos(), dictionary.eos())
        stacked = self.stacked()
        device = stacked.tensors[0].device
        members = None if len(used) == stacked.k else used.to(device)
        out = stacked(tokens.to(device), members=members, classification_head_name=self.head)
        return out[local.to(device), slot.to(device)]
