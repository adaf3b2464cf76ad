"""One Adam step for K members over their stacked tensors (``fairseq_idpg/fused/stacked_adam.py``) against fairseq's
Adam run on each member alone: the same parameters and moments after 5 updates with each member's own lr schedule,
gradient multiplier and pauses; its state in fairseq's format both ways; launches that do not grow with K."""

import pytest
import torch
from fairseq.optim.adam import Adam

from fairseq_idpg.fused.stacked_adam import StackedAdam
from fairseq_idpg.launches import count_launches

SHAPES = [(4,), (3, 5), (2, 2, 2)]
BETAS, EPS, DECAY = (0.9, 0.98), 1e-6, 0.1
K, UPDATES = 3, 5


def schedule(k, update):
    """Member k's lr at an update: its own peak and decay (members differ in lr, as a sweep's do)."""
    return (1e-3, 5e-3, 2e-2)[k] * (1 - 0.1 * update)


def multiplier(k, update):
    """What member k's trainer multiplies its gradients by: 1 / its sample size, its clipping coefficient."""
    return (1 / 16, 1 / 8, 0.37)[k] * (1 + 0.05 * update)


def active(k, update):
    return not (k == 1 and update == 2)  # member 1 sits out update 2 (it stepped nowhere: no batch of its own)


def train(dtype):
    """(stacked tensors after the stacked Adam, each member's tensors and fairseq Adam after its own updates)."""
    g = torch.Generator().manual_seed(0)
    start = [torch.randn(K, *shape, generator=g).to(dtype) for shape in SHAPES]
    grads = [[torch.randn(K, *shape, generator=g).to(dtype) for shape in SHAPES] for _ in range(UPDATES)]
    stacked = [t.clone().requires_grad_() for t in start]
    adam = StackedAdam(stacked, betas=BETAS, eps=EPS, weight_decay=DECAY)
    alone = []
    for k in range(K):
        params = [torch.nn.Parameter(t[k].clone()) for t in start]
        alone.append((params, Adam(params, lr=1.0, betas=BETAS, eps=EPS, weight_decay=DECAY)))
    for update in range(UPDATES):
        for t, grad in zip(stacked, grads[update], strict=True):
            t.grad = grad.clone()
        adam.step([schedule(k, update) for k in range(K)], [multiplier(k, update) for k in range(K)],
                  [active(k, update) for k in range(K)])  # fmt: skip
        for k, (params, optimizer) in enumerate(alone):
            if not active(k, update):
                continue
            for p, grad in zip(params, grads[update], strict=True):
                p.grad = (grad[k].float() * multiplier(k, update)).to(dtype)
            optimizer.param_groups[0]["lr"] = schedule(k, update)
            optimizer.step()
    return stacked, adam, alone


def relative(a, b):
    return ((a.float() - b.float()).abs().max() / b.float().abs().max()).item()


def test_each_member_is_fairseqs_adam_alone_in_fp32():
    stacked, adam, alone = train(torch.float32)
    for k, (params, optimizer) in enumerate(alone):
        for i, p in enumerate(params):
            assert relative(stacked[i][k], p) < 1e-6, (k, i)
            own = optimizer.state[p]
            assert relative(adam.exp_avg[i][k], own["exp_avg"]) < 1e-6
            assert relative(adam.exp_avg_sq[i][k], own["exp_avg_sq"]) < 1e-6
    assert adam.steps == [UPDATES, UPDATES - 1, UPDATES]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_each_member_is_fairseqs_adam_alone_in_half_precision(dtype):
    """Half-precision tensors, float32 moments and a float32 update copied back, as fairseq's Adam: within one
    rounding of the dtype."""
    stacked, _, alone = train(dtype)
    for k, (params, _) in enumerate(alone):
        for i, p in enumerate(params):
            assert stacked[i].dtype == dtype
            assert relative(stacked[i][k], p) <= 2 * torch.finfo(dtype).eps, (k, i)


def test_a_members_state_is_fairseqs_both_ways():
    """``member_state`` is what the member's fairseq Adam saves; a lone run's state loaded into a slot goes on as
    that run goes on alone."""
    stacked, adam, alone = train(torch.float32)
    params, optimizer = alone[1]
    saved, own = adam.member_state(1), optimizer.state_dict()
    assert saved["param_groups"][0]["params"] == own["param_groups"][0]["params"]
    for i in own["state"]:
        assert saved["state"][i]["step"] == own["state"][i]["step"] == UPDATES - 1
        for key in ("exp_avg", "exp_avg_sq"):
            assert torch.allclose(saved["state"][i][key], own["state"][i][key], rtol=1e-6, atol=0)
    # member 0's slot takes member 1's lone state and tensors: one more update each way, equal
    for t, p in zip(stacked, params, strict=True):
        with torch.no_grad():
            t[0].copy_(p)
    adam.load_member_state(0, own)
    grads = [torch.full_like(t, 0.5) for t in stacked]
    for t, grad in zip(stacked, grads, strict=True):
        t.grad = grad
    adam.step([2e-3] * K, [1.0] * K)
    for p, grad in zip(params, grads, strict=True):
        p.grad = grad[0].clone()
    optimizer.param_groups[0]["lr"] = 2e-3
    optimizer.step()
    for t, p in zip(stacked, params, strict=True):
        assert relative(t[0], p) < 1e-6
    with pytest.raises(ValueError, match="a state of 1 tensors for 3 stacked ones"):
        adam.load_member_state(2, {"state": {0: own["state"][0]}, "param_groups": own["param_groups"]})


def fp16_optimizer(params, dtype):
    """fairseq's ``FP16Optimizer`` over ``params`` as fairseq-train builds it for ``--bf16`` (a float32 copy per
    tensor) or ``--fp16`` (one flat float32 copy, a loss scale of 128), its Adam with this file's settings."""
    from fairseq.dataclass.configs import FairseqConfig
    from fairseq.optim.adam import FairseqAdamConfig
    from fairseq.optim.fp16_optimizer import FP16Optimizer
    from omegaconf import OmegaConf

    cfg = OmegaConf.structured(FairseqConfig)
    adam = FairseqAdamConfig(lr=[1.0], adam_betas=str(BETAS), adam_eps=EPS, weight_decay=DECAY)
    adam._name = "adam"
    cfg.optimizer = OmegaConf.structured(adam)
    cfg.common.fp16, cfg.common.bf16 = True, dtype == torch.bfloat16
    return FP16Optimizer.build_optimizer(cfg, params)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_with_masters_each_member_is_fairseqs_fp16_optimizer_alone(dtype):
    """``masters=True``: each member's half tensors, float32 masters and state are those of fairseq's
    ``FP16Optimizer`` (``--bf16``: a copy per tensor; ``--fp16``: one flat copy, gradients scaled by its loss scale)
    trained alone over 5 updates, the masters and moments within 1e-6; its flat state loads back."""
    g = torch.Generator().manual_seed(0)
    start = [torch.randn(K, *shape, generator=g).to(dtype) for shape in SHAPES]
    grads = [[torch.randn(K, *shape, generator=g).to(dtype) for shape in SHAPES] for _ in range(UPDATES)]
    stacked = [t.clone().requires_grad_() for t in start]
    adam = StackedAdam(stacked, betas=BETAS, eps=EPS, weight_decay=DECAY, masters=True)
    alone = []
    for k in range(K):
        params = [torch.nn.Parameter(t[k].clone()) for t in start]
        alone.append((params, fp16_optimizer(params, dtype)))
    scale = 1.0 if dtype == torch.bfloat16 else alone[0][1].scaler.loss_scale
    assert (type(alone[0][1].fp32_params) is list) == (dtype == torch.bfloat16)
    for update in range(UPDATES):
        for t, grad in zip(stacked, grads[update], strict=True):
            t.grad = grad * scale  # what the fused backward of the scaled losses gives
        adam.step([schedule(k, update) for k in range(K)], [multiplier(k, update) / scale for k in range(K)],
                  [active(k, update) for k in range(K)])  # fmt: skip
        for k, (params, optimizer) in enumerate(alone):
            if not active(k, update):
                continue
            optimizer.zero_grad()
            loss = sum((p.float() * grad[k].float()).sum() for p, grad in zip(params, grads[update], strict=True))
            optimizer.backward(loss)
            optimizer.multiply_grads(multiplier(k, update))
            optimizer.clip_grad_norm(0.0)
            optimizer.set_lr(schedule(k, update))
            optimizer.step()
    for k, (params, optimizer) in enumerate(alone):
        copies = optimizer.fp32_params
        flat = not isinstance(copies, list)
        masters = [copies[i] for i in range(len(SHAPES))] if not flat else next(iter(copies.values())).split(
            [t[k].numel() for t in stacked])  # fmt: skip
        for i, p in enumerate(params):
            assert relative(adam.masters[i][k], masters[i].view_as(p)) < 1e-6, (k, i)
            assert relative(stacked[i][k], p) <= torch.finfo(dtype).eps, (k, i)
        saved, own = adam.member_state(k, flat=flat), optimizer.state_dict()
        assert sorted(saved["state"]) == sorted(own["state"]) == list(range(1 if flat else len(SHAPES)))
        for i in own["state"]:
            assert saved["state"][i]["step"] == own["state"][i]["step"]
            for key in ("exp_avg", "exp_avg_sq"):
                assert relative(saved["state"][i][key], own["state"][i][key]) < 1e-6, (k, i, key)
    # member 0's slot takes member 2's saved state (flat under --fp16) and tensors: its masters from them
    with torch.no_grad():
        for t, p in zip(stacked, alone[2][0], strict=True):
            t[0].copy_(p)
    own = alone[2][1].state_dict()
    adam.load_member_state(0, own)
    adam.reset_masters(0)
    assert all(torch.equal(m[0], t[0].float()) for m, t in zip(adam.masters, stacked, strict=True))
    loaded = adam.member_state(0, flat=flat)["state"]
    assert all(torch.equal(loaded[i][key], own["state"][i][key]) and loaded[i]["step"] == UPDATES
               for i in own["state"] for key in ("exp_avg", "exp_avg_sq"))  # fmt: skip


def launches_of_a_step(k):
    tensors = [torch.zeros(k, *shape, requires_grad=True) for shape in SHAPES]
    for t in tensors:
        t.grad = torch.ones_like(t)
    adam = StackedAdam(tensors, betas=BETAS, eps=EPS, weight_decay=DECAY)
    adam.step([1e-3] * k)
    return count_launches(lambda: adam.step([1e-3] * k, [0.5] * k), trace=False).total


def test_a_steps_launches_do_not_grow_with_the_members():
    """One step for 20 members launches what it launches for 2 (foreach operators over the stacked tensors, the
    members' numbers one copy each to the device); fairseq's Adam alone launches 8 per member and list of tensors."""
    assert launches_of_a_step(20) == launches_of_a_step(2)
