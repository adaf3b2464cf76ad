"""fairseq's Adam for K members at once, over their stacked tensors: one optimizer step for a whole group.

    adam = StackedAdam(stacked.tensors, betas=(0.9, 0.98), eps=1e-6, weight_decay=0.1)
    adam.step(lr, coef)                     # lr, coef: [K], each member's own
    adam.member_state(k)                    # member k's state in fairseq's (torch.optim's) format
    adam.load_member_state(k, state)        # and back
    adam.member_state(k, flat=True)         # as --fp16's FP16Optimizer saves it (one flat fp32 copy)

Each trained tensor is stacked over the members, [K, ...] (``stacked.StackedMembers``), its gradient too. Member k's
update is fairseq's Adam (``fairseq.optim.adam.Adam.step``) on its slice, with its own learning rate ``lr[k]`` (its
own schedule) and its gradient multiplied first by ``coef[k]`` (what its trainer multiplies by: one over its sample
size, its clipping coefficient):

    g = coef_k * grad                      m = beta1 m + (1 - beta1) g          v = beta2 v + (1 - beta2) g^2
    p = p - weight_decay * lr_k * p         p = p - lr_k sqrt(1 - beta2^t_k) / (1 - beta1^t_k) * m / (sqrt(v) + eps)

with t_k the member's own step count. A member that does not step (``active[k]`` false: it has finished or left)
keeps its slice, moments and step count (its gradient slice must be finite: it is multiplied by 0). Every
operator runs once per stacked tensor for all members (foreach operators over the tensors; the members' numbers
as [K] tensors broadcast over each slice): the launches of a step do not grow with K. The moments are float32.

Half-precision tensors are updated in float32 in one of fairseq's two ways:

- ``masters=True`` (``--fp16``, ``--bf16``: fairseq's ``FP16Optimizer``): a float32 master copy of each stacked tensor
  is kept from step to step; Adam updates the masters and the half tensors get them rounded. ``reset_masters(k)``
  takes member k's masters from its half tensors again, as ``FP16Optimizer`` builds its copy from the model's
  parameters (a run that loads a checkpoint). Under ``--fp16`` that copy is one flat tensor, and so is its saved
  state (``member_state(k, flat=True)``; ``load_member_state`` reads either form); under ``--bf16`` it is a copy per
  tensor, as here.
- ``masters=False`` (``--memory-efficient-fp16``/``-bf16``, and fairseq's ``Adam`` on half tensors): each step
  updates a float32 copy made from the half tensor, and keeps nothing.
"""

import math

import torch


class StackedAdam:
    """Adam over stacked tensors [K, ...] with each member's lr, gradient multiplier and state (module docstring)."""

    def __init__(self, tensors, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, masters=False):
        self.tensors = list(tensors)
        if not self.tensors:
            raise ValueError("StackedAdam: no tensors")
        self.k = self.tensors[0].size(0)
        if any(t.size(0) != self.k for t in self.tensors):
            raise ValueError(f"StackedAdam: every tensor stacks {self.k} members along its first dimension")
        self.betas, self.eps, self.weight_decay = tuple(betas), eps, weight_decay
        self.exp_avg = [torch.zeros_like(t, dtype=torch.float32) for t in self.tensors]
        self.exp_avg_sq = [torch.zeros_like(t, dtype=torch.float32) for t in self.tensors]
        self.steps = [0] * self.k  # each member's step count (a host number, as fairseq's)
        # float32 masters of the half-precision tensors, kept between steps (masters=True), else None
        self.masters = [t.detach().float() if masters and _half(t) else None for t in self.tensors]

    def _per_member(self, values, dtype=torch.float32):
        """[K] numbers as one tensor on the tensors' device, viewed to broadcast over each tensor's slices."""
        column = torch.as_tensor(values, dtype=dtype).to(self.tensors[0].device)
        return [column.view(self.k, *[1] * (t.dim() - 1)) for t in self.tensors]

    @torch.no_grad()
    def step(self, lr, coef=None, active=None):
        """One update of every active member: ``lr`` [K] its learning rate, ``coef`` [K] its gradient multiplier
        (1 when None), ``active`` [K] bools (all when None)."""
        active = [True] * self.k if active is None else [bool(a) for a in active]
        coef = [1.0] * self.k if coef is None else [float(c) for c in coef]
        lr = [float(x) for x in lr]
        beta1, beta2 = self.betas
        for k in range(self.k):
            self.steps[k] += active[k]
        # the members' numbers, computed on the host in double precision as fairseq's are
        size, decay, keep1, keep2 = [], [], [], []
        for k in range(self.k):
            t = self.steps[k]
            on = active[k] and t > 0
            size.append(lr[k] * math.sqrt(1 - beta2**t) / (1 - beta1**t) if on else 0.0)
            decay.append(1 - self.weight_decay * lr[k] if on else 1.0)
            keep1.append(beta1 if active[k] else 1.0)
            keep2.append(beta2 if active[k] else 1.0)
        masters = [
            m if m is not None else t.float() if _half(t) else t
            for t, m in zip(self.tensors, self.masters, strict=True)
        ]
        grads = [t.grad.float() for t in self.tensors]
        torch._foreach_mul_(grads, self._per_member([c if a else 0.0 for c, a in zip(coef, active, strict=True)]))
        torch._foreach_mul_(self.exp_avg, self._per_member(keep1))
        torch._foreach_add_(self.exp_avg, torch._foreach_mul(grads, self._per_member([1 - b for b in keep1])))
        torch._foreach_mul_(self.exp_avg_sq, self._per_member(keep2))
        scaled = torch._foreach_mul(grads, self._per_member([1 - b for b in keep2]))
        torch._foreach_addcmul_(self.exp_avg_sq, grads, scaled)
        denom = torch._foreach_sqrt(self.exp_avg_sq)
        torch._foreach_add_(denom, self.eps)
        if self.weight_decay != 0:
            torch._foreach_mul_(masters, self._per_member(decay))
        update = torch._foreach_div(self.exp_avg, denom)
        torch._foreach_mul_(update, self._per_member(size))
        torch._foreach_sub_(masters, update)
        halves = [(t, m) for t, m in zip(self.tensors, masters, strict=True) if m is not t]
        if halves:
            torch._foreach_copy_([t for t, _ in halves], [m for _, m in halves])

    @torch.no_grad()
    def reset_masters(self, k):
        """Member k's float32 masters from its half-precision tensors (``FP16Optimizer``'s copy of the model's
        parameters when it is built, e.g. after a checkpoint loaded)."""
        for t, m in zip(self.tensors, self.masters, strict=True):
            if m is not None:
                m[k].copy_(t[k])

    def member_state(self, k, flat=False):
        """Member k's state as fairseq's Adam saves it (``torch.optim.Optimizer.state_dict``: its tensors in this
        order, numbered from 0), so that its checkpoint is a lone run's. ``flat``: as ``--fp16``'s
        ``FP16Optimizer`` saves it, the state of one flat float32 copy of the tensors (their moments concatenated
        in this order)."""
        moments = [(m[k].clone(), v[k].clone()) for m, v in zip(self.exp_avg, self.exp_avg_sq, strict=True)]
        if flat:
            moments = [tuple(torch.cat([pair[j].flatten() for pair in moments]) for j in (0, 1))]
        state = {}
        if self.steps[k]:
            state = {i: {"step": self.steps[k], "exp_avg": m, "exp_avg_sq": v} for i, (m, v) in enumerate(moments)}
        group = {"betas": self.betas, "eps": self.eps, "weight_decay": self.weight_decay, "amsgrad": False,
                 "params": list(range(len(moments)))}  # fmt: skip
        return {"state": state, "param_groups": [group]}

    @torch.no_grad()
    def load_member_state(self, k, state_dict):
        """Member k's state from fairseq's Adam's ``state_dict`` (a lone run's checkpoint, or ``member_state``)."""
        state = state_dict["state"]
        if not state:
            self.steps[k] = 0
            for m, v in zip(self.exp_avg, self.exp_avg_sq, strict=True):
                m[k].zero_()
                v[k].zero_()
            return
        sizes = [t[k].numel() for t in self.tensors]
        if len(state) == 1 and len(self.tensors) > 1 and state[0]["exp_avg"].numel() == sum(sizes):
            flat = state[0]  # --fp16's FP16Optimizer: one flat copy
            pieces = zip(self.tensors, flat["exp_avg"].split(sizes), flat["exp_avg_sq"].split(sizes), strict=True)
            state = {i: {"step": flat["step"], "exp_avg": a.view_as(t[k]), "exp_avg_sq": b.view_as(t[k])}
                     for i, (t, a, b) in enumerate(pieces)}  # fmt: skip
        if sorted(state) != list(range(len(self.tensors))):
            raise ValueError(f"member {k}: a state of {len(state)} tensors for {len(self.tensors)} stacked ones")
        steps = {int(s["step"]) for s in state.values()}
        if len(steps) != 1:
            raise ValueError(f"member {k}: its tensors' step counts differ ({sorted(steps)})")
        self.steps[k] = steps.pop()
        for i, (m, v) in enumerate(zip(self.exp_avg, self.exp_avg_sq, strict=True)):
            m[k].copy_(state[i]["exp_avg"])
            v[k].copy_(state[i]["exp_avg_sq"])


def _half(t):
    return t.dtype in (torch.float16, torch.bfloat16)
