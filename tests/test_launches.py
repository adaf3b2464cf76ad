"""Kernel launches per update, counted on the CPU (``fairseq_idpg/launches.py``; docs/launches.md): our
methods' training steps at a tiny 24-layer shape launch no more operators than PEFT's where we reached it,
no more than the counts pinned here where we did not (a change that adds launches fails), and as many
in fp16 as in bf16. The counts are deterministic: the same operators whatever the weights and the load."""

import pytest
import torch

from fairseq_idpg.launches import Shape, count_launches, launches_kernel, model_launches, ours, theirs
from fairseq_idpg.profiled_launches import model_profiled_launches, profiled_launches

# 24 layers x 32, batch 4 x 16 (a quarter of the rows padded): the counts of scripts/count_launches.py's
# default shape (x 64, 4 x 32), which do not depend on the width or the batch
SHAPE = Shape(dim=32, heads=2, ffn=64, length=16)
# ours in bf16 (docs/launches.md): a count may go down, not up
PINNED = {"finetune": 1158, "prompt-tuning-5": 863, "lora": 1379, "m-idpg-phm": 1148, "houlsby-adapter": 1519,
          "inducer": 2935}  # fmt: skip


def launches(build, name, dtype=torch.bfloat16):
    return model_launches(build, name, SHAPE, dtype=dtype, trace=False).total


@pytest.fixture(scope="module")
def counted():
    """{(side, name): launches per update in bf16}, counted once for the module."""
    cache = {}

    def get(side, name):
        if (side, name) not in cache:
            cache[side, name] = launches(ours if side == "ours" else theirs, name)
        return cache[side, name]

    return get


def test_views_and_allocations_launch_nothing():
    aten = torch.ops.aten
    assert not any(launches_kernel(op) for op in (aten.view.default, aten.t.default, aten.expand.default))
    assert not launches_kernel(aten._unsafe_view.default) and not launches_kernel(aten.empty.memory_format)
    assert launches_kernel(aten.add_.Tensor) and launches_kernel(aten.mm.default)
    x = torch.randn(4, 4)
    counted = count_launches(lambda: (x.t() @ x).view(16).add_(1), trace=True)
    assert counted.total == 2 and dict(counted.by_op) == {"mm": 1, "add_": 1}
    assert all(line.startswith("tests/test_launches.py:") for line in counted.by_line), counted.by_line


@pytest.mark.parametrize("name", ["finetune", "prompt-tuning-5", "prefix-tuning", "lora"])
def test_launches_no_more_than_pefts(counted, name):
    assert counted("ours", name) <= counted("theirs", name)


def test_the_second_tracer_counts_what_computes_once():
    """torch.profiler's events: ``matmul`` (a composite) is its ``mm``, views count nothing, and an operator's
    own inner work (``clone``'s copy) is not counted again."""
    x = torch.randn(4, 4)
    assert dict(profiled_launches(lambda: (x.t() @ x).view(16).add_(1))) == {"mm": 1, "add_": 1}
    assert dict(profiled_launches(lambda: x.t().clone())) == {"clone": 1}


@pytest.mark.parametrize("name", ["prompt-tuning-5", "lora"])
def test_a_second_tracer_finds_ours_at_most_pefts_too(name):
    """The same steps traced by torch.profiler, nothing patched (the CPU's own dropout and attention): ours at most
    PEFT's by this count as well (docs/launches.md, "A second tracer", has fine-tuning and prefix tuning too)."""
    mine, peft = (sum(model_profiled_launches(build, name, SHAPE).values()) for build in (ours, theirs))
    assert mine <= peft, (mine, peft)


@pytest.mark.parametrize("name", sorted(PINNED))
def test_launches_stay_at_most_the_pinned_count(counted, name):
    assert counted("ours", name) <= PINNED[name]


def test_m_idpg_launches_at_most_1_35_times_prompt_tuning(counted):
    """IDPG's generator runs after every layer; its cost over static prompts is bounded (its weight gradients
    once per backward, ``modules/prompts/layer_steps.py``)."""
    assert counted("ours", "m-idpg-phm") <= 1.35 * counted("ours", "prompt-tuning-5")


@pytest.mark.parametrize("name", ["prefix-tuning", "m-idpg-phm", "houlsby-adapter", "inducer"])
def test_fp16_steps_launch_what_bf16_steps_launch(counted, name):
    assert launches(ours, name, torch.float16) == counted("ours", name)


# ---------------------------------------------------------------------------------------- a fairseq-train update
# host syncs of one bf16 update (docs/launches.md): fairseq's padding check (2; the prompt models' 1), the
# grad norm's finiteness (2), the meters' .item() at the log line (7-8); M-IDPG's cache look-up (3)
UPDATE_SYNCS = {"prompt-tuning-5": 10, "lora": 12, "m-idpg-phm": 13}


@pytest.fixture(scope="module")
def updates(tmp_path_factory):
    """{(name, dtype): Launches of one fairseq-train update}, counted once for the module."""
    from fairseq_idpg.launches import update_launches

    cache, folder = {}, tmp_path_factory.mktemp("update")

    def get(name, dtype=torch.bfloat16):
        if (name, dtype) not in cache:
            cache[name, dtype] = update_launches(name, SHAPE, dtype, trace=False, folder=folder)
        return cache[name, dtype]

    return get


@pytest.mark.parametrize("name", ["prompt-tuning-5", "lora", "m-idpg-phm"])
def test_a_fairseq_train_update_launches_at_most_1_10_times_the_model_step(counted, updates, name):
    """fairseq's Trainer around the step (optimizer wrappers, clipping, meters) adds at most a tenth: no
    loop over the trained tensors (compat fixes 14 and 15)."""
    assert updates(name).total <= 1.10 * counted("ours", name)


@pytest.mark.parametrize("name", sorted(UPDATE_SYNCS))
def test_a_fairseq_train_update_syncs_with_the_host_at_most_the_pinned_times(updates, name):
    assert updates(name).host_syncs <= UPDATE_SYNCS[name], updates(name).syncs


def test_an_fp16_update_adds_only_the_loss_scalers_launches(counted, updates):
    """fp16's flat fp32 copy is filled and read by foreach copies too: an fp16 update launches what a bf16
    one does but the loss scaler's few operators, whatever the number of trained tensors."""
    fp16, bf16 = updates("lora", torch.float16).total, updates("lora").total
    assert bf16 <= fp16 <= bf16 + 8 and fp16 <= 1.10 * counted("ours", "lora")


def test_the_benchmarks_standin_size_is_the_standins_shape():
    from fairseq_idpg.launches import SIZES
    from fairseq_idpg.models.build import STANDIN

    assert Shape(**SIZES["standin"]).sizes() == STANDIN
