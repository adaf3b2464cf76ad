"""Houlsby adapter, parallel FFN adapter, Compacter and BitFit: the layer with empty slots is
fairseq's layer, zero up-projections leave the backbone unchanged, placement, counts, errors. The methods
come from the registry (``blocks_support``); a compact checkpoint's resume: tests/test_block_generic.py."""

import copy
import re

import pytest
import torch
import torch.nn.functional as F
from blocks_support import block_tensors, blocks_in, logits, methods_with, run_main_job
from checkpoint_support import assert_compact_and_resumable, assert_hub_agrees_with_validation
from conftest import SHARED, STANDIN, build_tiny

from fairseq_idpg.blocks import BLOCKS
from fairseq_idpg.errors import ConfigError
from fairseq_idpg.methods import METHODS
from fairseq_idpg.modules.adapters.adapted_layer import AdaptedEncoderLayer
from fairseq_idpg.modules.adapters.bottleneck import BottleneckAdapter
from fairseq_idpg.modules.adapters.compacter import CompacterAdapter

# the adapters, from the block registry: the blocks on the sublayers' outputs or beside the FFN (sequential and
# parallel adapters), whose up-projection is their output
ADAPTERS = blocks_in("after_attention", "after_ffn", "ffn")


def test_layer_with_empty_slots_is_fairseqs_layer(tiny):
    fairseq_layer = build_tiny(tiny, "roberta_blocks", bitfit=True).eval().encoder.sentence_encoder.layers[0]
    ours = AdaptedEncoderLayer.convert(copy.deepcopy(fairseq_layer))
    x = torch.randn(6, 2, 32)
    pad = torch.tensor([[False] * 6, [False] * 4 + [True] * 2])
    for train in (False, True):
        fairseq_layer.train(train), ours.train(train)
        torch.manual_seed(3)
        expected = fairseq_layer(x, pad)
        torch.manual_seed(3)  # same dropout masks: the same operations in the same order
        assert torch.equal(ours(x, pad), expected)


@pytest.mark.parametrize("preset", methods_with(*ADAPTERS))
def test_zero_up_projection_leaves_the_backbone_unchanged(tiny, preset):
    model = build_tiny(tiny, "roberta_blocks", blocks_preset=preset).eval()
    # the reference: the method's other blocks (MAM: its prefixes, inducer, LoRA) with the same tensors, without
    # the adapters; BitFit only so that something trains (its biases are the backbone's: fairseq's own forward)
    adapter_options = {option for block in ADAPTERS for option in BLOCKS[block].defaults()}
    others = {k: v for k, v in METHODS[preset].preset.items() if k not in adapter_options}
    reference = build_tiny(tiny, "roberta_blocks", bitfit=True, **others).eval()
    missing, unexpected = reference.load_state_dict(model.state_dict(), strict=False)
    adapter_tensors = set().union(*(names for block, names in block_tensors(model).items() if block in ADAPTERS))
    assert not missing and unexpected and set(unexpected) == adapter_tensors
    up = [p for name, p in model.named_parameters() if name in adapter_tensors and ".up." in name]
    assert up, f"{preset}: no up-projection (.up.) among the adapters' tensors {sorted(adapter_tensors)}"
    with torch.no_grad():
        for p in up:
            p.normal_(0, 0.1)
    assert not torch.allclose(logits(model), logits(reference), atol=1e-4)
    with torch.no_grad():
        for p in up:
            p.zero_()
    assert torch.allclose(logits(model), logits(reference), atol=1e-6)


def test_parallel_adapter_is_lora_initialised_and_sits_beside_the_ffn(tiny):
    model = build_tiny(tiny, "roberta_blocks", blocks_preset="mam-inducer").eval()
    layer = model.encoder.sentence_encoder.layers[0]
    adapter = layer.parallel_adapter
    assert (
        adapter.up.weight.abs().sum() == 0
        and adapter.down.bias.abs().sum() == 0
        and adapter.down.weight.abs().sum() > 0
    )
    with torch.no_grad():
        for p in adapter.parameters():
            p.normal_(0, 0.3)
    x = torch.randn(5, 2, 32)
    attention, _ = layer.self_attn(x, x, x, key_padding_mask=None)
    h = layer.self_attn_layer_norm(x + attention)  # the FFN's input (post-LN layer)
    ffn = layer.fc2(layer.activation_fn(layer.fc1(h)))
    f = F.relu(h @ adapter.down.weight.T + adapter.down.bias) @ adapter.up.weight.T + adapter.up.bias
    expected = layer.final_layer_norm(h + ffn + 2.0 * f)  # LN(x + FFN(x) + s f(x)); eval: no dropout
    assert torch.allclose(layer(x, None), expected, atol=1e-6)


def test_houlsby_adapter_placement_and_count():
    adapter = BottleneckAdapter(32, 4, init="houlsby")
    assert sum(p.numel() for p in adapter.parameters()) == 2 * 32 * 4 + 4 + 32
    assert 0 < adapter.down.weight.abs().max() <= 0.02  # N(0, 1e-2) truncated at 2 std
    x = torch.randn(3, 32)
    assert torch.allclose(adapter(x), F.relu(x @ adapter.down.weight.T) @ adapter.up.weight.T, atol=1e-7)


def test_the_idpg_authors_gelu_adapter_is_their_sequential_module():
    """``--adapter-activation gelu``: the IDPG authors' Houlsby adapter, ``nn.Sequential(Linear(d, r), nn.GELU(),
    Linear(r, d))``, on the same weights; ReLU (the default) differs from it."""
    torch.manual_seed(0)
    gelu, relu = BottleneckAdapter(32, 4, activation="gelu"), BottleneckAdapter(32, 4)
    theirs = torch.nn.Sequential(torch.nn.Linear(32, 4), torch.nn.GELU(), torch.nn.Linear(4, 32))
    with torch.no_grad():
        for p in list(gelu.parameters()) + list(theirs.parameters()):
            p.normal_(0, 0.5)
        relu.load_state_dict(gelu.state_dict())
        theirs.load_state_dict({"0.weight": gelu.down.weight, "0.bias": gelu.down.bias, "2.weight": gelu.up.weight,
                                "2.bias": gelu.up.bias})  # fmt: skip
    x = torch.randn(3, 32)
    assert torch.equal(gelu(x), theirs(x))
    assert (relu(x) - theirs(x)).abs().max() > 1e-2
    with pytest.raises(ConfigError, match="adapter activation must be 'relu' or 'gelu', got 'tanh'"):
        BottleneckAdapter(32, 4, activation="tanh")


def test_compacter_equals_the_dense_kronecker_adapter_and_counts():
    torch.manual_seed(0)
    adapter = CompacterAdapter(32, 8, n=4, rank=1).double()
    with torch.no_grad():
        adapter.up.bias.normal_()
    A = adapter.A
    W_down = sum(torch.kron(A[i], adapter.down.s[i] @ adapter.down.t[i]) for i in range(4))  # [32, 8]
    W_up = sum(torch.kron(A[i], adapter.up.s[i] @ adapter.up.t[i]) for i in range(4))  # [8, 32]
    x = torch.randn(5, 32, dtype=torch.float64)
    expected = F.gelu(x @ W_down + adapter.down.bias) @ W_up + adapter.up.bias
    assert torch.allclose(adapter(x), expected, atol=1e-12)
    # one A set for both projections: n^3 + 2 k (d + r) + r + d
    assert sum(p.numel() for p in adapter.parameters()) == 4**3 + 2 * 1 * (32 + 8) + 8 + 32
    assert adapter.down.A_set() is adapter.up.A_set() is adapter.A


def test_bitfit_trains_exactly_the_encoder_biases(tiny):
    model = build_tiny(tiny, "roberta_blocks", blocks_preset="bitfit").train()
    trainable = {
        n for n, p in model.named_parameters() if p.requires_grad and not n.startswith("classification_heads.")
    }
    encoder_biases = {
        n
        for n, _ in model.encoder.sentence_encoder.named_parameters(prefix="encoder.sentence_encoder")
        if n.endswith(".bias")
    }
    assert trainable == encoder_biases and "encoder.sentence_encoder.layers.0.fc1.bias" in trainable
    assert model.num_trainable_parameters() == 2 * (4 * 32 + 64 + 32 + 2 * 32) + 32
    logits(model).sum().backward()
    assert model.encoder.sentence_encoder.layers[0].fc1.weight.grad is None
    assert model.encoder.sentence_encoder.layers[0].fc1.bias.grad.abs().sum() > 0


COMPACTERS = methods_with("adapter", where=lambda blocks: blocks["adapter"].adapter == "compacter")
# (record, flags, message), each record from the registry: every record of the block the flag belongs to (the size
# options at 0 and below: tests/test_block_generic.py, for every block)
INVALID = [
    *((preset, dict(adapter_dim=33), "--adapter-dim must be between 1 and the model dimension 32, got 33")
      for preset in methods_with("adapter")),
    *((preset, dict(compacter_n=3), "--compacter-n 3 must divide --encoder-embed-dim 32 and --adapter-dim 16")
      for preset in COMPACTERS),
    *((preset, dict(encoder_attention_heads=3), "--encoder-attention-heads 3 must divide --encoder-embed-dim 32")
      for preset in COMPACTERS),
    *((preset, dict(adapter_activation="gelu"), "--adapter-activation applies to --adapter houlsby")
      for preset in COMPACTERS),
    *((preset, dict(ffn_adapter_dim=dim), f"--ffn-adapter-dim must be between 1 and the model dimension 32, got {dim}")
      for preset in methods_with("ffn_adapter") for dim in (40, 64)),
]  # fmt: skip


@pytest.mark.parametrize("preset,flags,message", INVALID, ids=[f"{p}: {m}" for p, _, m in INVALID])
def test_invalid_settings_fail_at_build_time(tiny, preset, flags, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        build_tiny(tiny, "roberta_blocks", blocks_preset=preset, **flags).eval()


@pytest.mark.slow
def test_compacter_trains_and_validates_end_to_end(tmp_path, glue_slices, standin_model):
    from fairseq_idpg.layout import data_folder
    from fairseq_idpg.preprocessing import prepare

    # RTE's slice prepared in this process where run.sh prepares it: its task.json records the same files, so
    # run.sh uses it (one prepare_data.py start fewer)
    data, vocab = data_folder(tmp_path, "standin", "RTE"), STANDIN / "vocab.txt"
    prepare("RTE", str(glue_slices / "RTE"), str(data), bpe="wordpiece", vocab=str(vocab), workers=1)
    save, results = run_main_job(tmp_path, "compacter", glue_slices / "RTE")
    assert_compact_and_resumable(save, updates=5)  # adapters + head + fingerprint; the optimizer state fits
    # the hub, from the raw dev sentences, reproduces the prepared tokens and what fairseq-validate's model predicts
    assert_hub_agrees_with_validation(save, "RTE", SHARED / "data" / "glue" / "RTE")
    assert 0.0 < results["results"]["valid"]["accuracy"] < 100.0  # a score, as a number


def test_houlsby_adapter_multiplies_by_no_scale_of_one():
    """s = 1 (Houlsby's adapter) launches no multiply and gives the values of s * f exactly; another s still
    scales."""
    from fairseq_idpg.launches import count_launches
    from fairseq_idpg.modules.adapters.bottleneck import BottleneckAdapter

    torch.manual_seed(0)
    x = torch.randn(3, 2, 8)
    houlsby, scaled = BottleneckAdapter(8, 4).eval(), BottleneckAdapter(8, 4, scale=2.0).eval()
    scaled.load_state_dict(houlsby.state_dict())
    assert "mul" not in count_launches(lambda: houlsby(x), trace=False).by_op
    unscaled = houlsby.up(torch.relu(houlsby.down(x)))
    assert torch.equal(houlsby(x), unscaled * 1.0) and torch.equal(scaled(x), unscaled * 2.0)
