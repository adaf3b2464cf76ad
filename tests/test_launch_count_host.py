"""The launch counter's host tensors (fairseq_idpg/launches.py): what a GPU run keeps on the host launches nothing,
nor does what is computed from it alone; its copy to the device is one launch; the same maths on a device tensor
is counted operator by operator."""

import torch

from fairseq_idpg.launches import count_launches, on_host


def test_host_tensors_launch_nothing_but_their_copy_to_the_device():
    def host_maths(norm):
        finite = torch.isfinite(norm).all()  # fairseq's trainer, on a fused member's gradient norm
        clip = torch.where(norm > 1.0, norm.new_tensor(100), norm.new_tensor(0))
        scaled = (norm * 2 + clip).clamp(max=1)
        assert bool(finite) and scaled.item() <= 1  # reads on the host: no device sync
        return scaled.to(torch.device("cpu"))  # to "the device": one copy

    counted = count_launches(lambda: host_maths(on_host(torch.tensor(2.5))), trace=False)
    assert (counted.total, dict(counted.by_op), counted.host_syncs) == (1, {"_to_copy": 1}, 0)
    on_device = count_launches(lambda: host_maths(torch.tensor(2.5)), trace=False)
    assert on_device.total >= 7 and on_device.host_syncs == 2


def test_a_host_tensor_beside_a_device_tensor_is_counted():
    grads = [torch.ones(3), torch.ones(2)]
    coef = on_host(torch.tensor(0.5))
    counted = count_launches(lambda: torch._foreach_mul_(grads, coef.to(grads[0].device)), trace=False)
    assert dict(counted.by_op) == {"_to_copy": 1, "_foreach_mul_": 1}
