"""fairseq's Adam for K members at once, over their stacked tensors: one optimizer step for a whole group.

    adam = StackedAdam(stacked.tensors, betas=(0.9, 0.98), eps=1e-6, weight_decay=0.1)
    adam.step(lr, coef)                     # lr, coef: [K], each member's own
    adam.member_state(k)                    # member k's state in fairseq's (torch.optim's) format
    adam.load_member_state(k, state)        # and back

Each trained tensor is stacked over the members, [K, ...] (``stacked.StackedMembers``), its gradient too. Member k's
update is fairseq's Adam (``fairseq.optim.adam.Adam.step``) on its slice, with its own learning rate ``lr[k]`` (its
own schedule) and its gradient multiplied first by ``coef[k]`` (what its trainer multiplies by: one over its sample
size, its clipping coefficient):

    g = coef_k * grad                      m = beta1 m + (1 - beta1) g          v = beta2 v + (1 - beta2) g^2
    p = p - weight_decay * lr_k * p         p = p - lr_k sqrt(1 - beta2^t_k) / (1 - beta1^t_k) * m / (sqrt(v) + eps)

with t_k the member's own step count. A member that does not step (``active[k]`` false: it has finished or left)
keeps its slice, moments and step count (its gradient slice must be finite: it is multiplied by 0). Every
operator runs once per stacked tensor for all members (foreach operators over the tensors; the members' numbers
as [K] tensors broadcast over each slice): the launches of a step do not grow with K. Half-precision tensors are
updated through float32 copies, as fairseq's Adam does; the moments are float32.
"""

import math

import torch


class StackedAdam:
    """Adam over stacked tensors [K, ...] with each member's lr, gradient multiplier and state (module docstring)."""

    def __init__(self, tensors, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0):
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
        masters = [t.float() if t.dtype in (torch.float16, torch.bfloat16) else t for t in self.tensors]
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

    def member_state(self, k):
        """Member k's state as fairseq's Adam saves it (``torch.optim.Optimizer.state_dict``: its tensors in this
        order, numbered from 0), so that its checkpoint is a lone run's."""
        state = {}
        if self.steps[k]:
            state = {i: {"step": self.steps[k], "exp_avg": m[k].clone(), "exp_avg_sq": v[k].clone()}
                     for i, (m, v) in enumerate(zip(self.exp_avg, self.exp_avg_sq, strict=True))}  # fmt: skip
        group = {"betas": self.betas, "eps": self.eps, "weight_decay": self.weight_decay, "amsgrad": False,
                 "params": list(range(len(self.tensors)))}  # fmt: skip
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
        if sorted(state) != list(range(len(self.tensors))):
            raise ValueError(f"member {k}: a state of {len(state)} tensors for {len(self.tensors)} stacked ones")
        steps = {int(s["step"]) for s in state.values()}
        if len(steps) != 1:
            raise ValueError(f"member {k}: its tensors' step counts differ ({sorted(steps)})")
        self.steps[k] = steps.pop()
        for i, (m, v) in enumerate(zip(self.exp_avg, self.exp_avg_sq, strict=True)):
            m[k].copy_(state[i]["exp_avg"])
            v[k].copy_(state[i]["exp_avg_sq"])
