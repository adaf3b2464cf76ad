"""PHM layer (IDPG Eq. 4): equals a dense layer with W = sum_i kron(A_i, B_i)."""

import pytest
import torch

from fairseq_idpg.modules.phm import PHMLinear


@pytest.mark.parametrize("n,rank", [(2, 0), (4, 0), (4, 2)])
def test_phm_equals_dense_with_kronecker_weight(n, rank):
    torch.manual_seed(0)
    layer = PHMLinear(8, 12, n, rank=rank).double()
    B = layer.B_set()
    W = sum(torch.kron(layer.A[i], B[i]) for i in range(n))  # the definition, term by term
    x = torch.randn(3, 5, 8, dtype=torch.float64)
    assert torch.allclose(layer(x), x @ W + layer.bias, atol=1e-12)
    assert torch.allclose(layer.weight(), W, atol=1e-12)


def test_parameter_count_and_shared_A():
    a = PHMLinear(1024, 16, 16)
    assert sum(p.numel() for p in a.parameters()) == 16**3 + 1024 * 16 // 16 + 16
    b = PHMLinear(16, 5 * 1024, 16, A_from=a, bias=False)
    assert sum(p.numel() for p in b.parameters()) == 16 * 5 * 1024 // 16  # A not counted twice
    assert b.A_set() is a.A


def test_n_must_divide_dimensions():
    with pytest.raises(ValueError, match="PHM n=16 must divide in_features=300"):
        PHMLinear(300, 16, 16)
