"""PiSSA (Meng et al. 2024, "PiSSA: Principal Singular Values and Singular Vectors Adaptation of Large Language
Models", section 3): LoRA whose factors start as the principal singular components of the frozen weight, the
rest of the weight (the residual) kept frozen.

    W = U S V^T                                  (W: [out, in]; singular values descending)
    A_0 = sqrt(S_r / s) V_r^T      [r, in]       B_0 = U_r sqrt(S_r / s)      [out, r]
    W_res = W - s B_0 A_0                        (s = alpha / r, LoRA's scaling)

so that ``W_res + s B_0 A_0 = W``: the model starts as the frozen one, and training moves the principal part.
The split of the singular values (their square root into each factor, divided by the scaling) is PEFT's
``init_lora_weights="pissa"`` (``LoraLayer.pissa_init``: a full SVD in float32); with s = 1 it is the paper's
Eq. 2-3. The residual is not stored: ``LoRA`` keeps A_0 and B_0 (recomputed from the backbone whenever the model
is built, never saved) and computes ``W_res x`` as ``W x - s B_0 A_0 x``, so the frozen backbone stays the one
every other method shares (docs/blocks.md, "PiSSA").
"""

import torch


def principal_factors(weight, rank, scaling):
    """(A_0 [rank, in], B_0 [out, rank]) of ``weight`` [out, in] (module docstring), in ``weight``'s dtype: the
    SVD runs in float32 whatever the weight's, as PEFT's does."""
    u, s, vh = torch.linalg.svd(weight.detach().float(), full_matrices=False)
    root = torch.sqrt(s[:rank] / scaling)  # [r]
    a = root[:, None] * vh[:rank]  # diag(sqrt(S_r / s)) V_r^T
    b = u[:, :rank] * root[None, :]  # U_r diag(sqrt(S_r / s))
    return a.to(weight.dtype), b.to(weight.dtype)
