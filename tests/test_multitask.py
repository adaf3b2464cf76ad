"""One frozen backbone serving every attached task at once (fairseq_idpg/hub): a batch mixing rows of a task of
every method family (prompt tuning, DPT, IDPG, LoRA and its variants, VeRA, prefix tuning, an adapter, BitFit,
inducer, (IA)^3) and of every other record that can share a backbone (a new method is served here by its record),
with padding, sentence pairs, 2- and 3-class and regression heads, gives each row the logits its task's own fairseq
model (fairseq's hub) computes alone, to float rounding (vmap batches the matmuls differently: 1e-5). The runs are
built from tiny models (tests/multitask_support.py), not trained."""

import pytest
import torch
from multitask_support import LABELS, PAIR, write_run, write_runs

from fairseq_idpg.errors import ConfigError
from fairseq_idpg.hub import MultiTaskModel
from fairseq_idpg.hub.attached import HEAD, frozen_tensors
from fairseq_idpg.hub.packing import pack
from fairseq_idpg.methods import methods_where

# task name -> (method record, data); tasks of one method on data with other class counts share a pass
SCENARIO = {
    "pt-sst2": ("prompt-tuning-5", "sst2"), "pt-rte": ("prompt-tuning-5", "rte"), "dpt-mnli": ("dpt", "mnli"),
    "idpg-sst2": ("m-idpg-phm", "sst2"), "idpg-mnli": ("m-idpg-phm", "mnli"), "lora-sst2": ("lora", "sst2"),
    "lora-rte": ("lora", "rte"), "lora-stsb": ("lora", "stsb"), "prefix-rte": ("prefix-tuning", "rte"),
    "adapter-sst2": ("houlsby-adapter", "sst2"), "bitfit-mnli": ("bitfit", "mnli"), "inducer-sst2": ("inducer", "sst2"),
    "ia3-rte": ("ia3", "rte"), "dora-sst2": ("dora", "sst2"), "dora-rte": ("dora", "rte"),
    "pissa-mnli": ("pissa", "mnli"), "vera-sst2": ("vera", "sst2"), "vera-rte": ("vera", "rte"),
}  # fmt: skip
# and a task of every other record that can share a backbone (``frozen_backbone``: its own data), so that a new block
# or method is served here by its record
TASKS = {
    **SCENARIO,
    **{f"{name}-sst2": (name, "sst2") for name in methods_where(frozen_backbone=True)
       if name not in {m for m, _ in SCENARIO.values()}},
}  # fmt: skip
SINGLES = ["a gripping , funny and moving film .", "the plot is thin .", "it 's fine .", "one of the year 's best ."]
PAIRS = [
    ("A man is playing a guitar on the stage .", "Nobody plays ."),
    ("The cat sat .", "A cat sat on the mat in the sun ."),
    ("Two dogs run .", "Animals move ."),
]
pytestmark = pytest.mark.xdist_group("multitask")  # one worker builds the runs once


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny4, method_files):
    """({task: run folder}, the tiny backbone) of TASKS, each with its own seed."""
    glove = {"idpg_glove_vectors": method_files["idpg_glove_vectors"]}
    folders = write_runs(tmp_path_factory.mktemp("multitask"), tiny4, TASKS, glove)
    return folders, tiny4


def multitask(backbone, folders, names=TASKS):
    mt = MultiTaskModel(backbone.model_file, bpe="wordpiece", wordpiece_vocab=str(backbone.folder / "vocab.txt"))
    for name in names:
        mt.attach(name, folders[name])
    return mt


def own_model(folders, name, backbone):
    from fairseq.models.roberta import RobertaModel

    data = folders[name].parents[1] / "data" / TASKS[name][1]
    return RobertaModel.from_pretrained(
        str(folders[name]), "checkpoint_best.pt", data_name_or_path=str(data),
        user_dir="fairseq_idpg", backbone=str(backbone.model_file), bpe="wordpiece",
        wordpiece_vocab=str(backbone.folder / "vocab.txt"),
    ).eval()  # fmt: skip


def mixed_rows():
    """Rows of every task, interleaved: 1 to 3 rows each, of several lengths (padded in the batch)."""
    names, texts = [], []
    for i in range(3):
        for j, name in enumerate(TASKS):
            if (i + j) % 3 == 2 and i:  # tasks get 2 or 3 rows: members with fewer rows get dummy rows
                continue
            texts.append(PAIRS[(i + j) % len(PAIRS)] if PAIR[TASKS[name][1]] else SINGLES[(i + j) % len(SINGLES)])
            names.append(name)
    return names, texts


def test_a_mixed_batch_of_every_family_equals_each_tasks_own_model(runs):
    folders, backbone = runs
    mt = multitask(backbone, folders)
    names, texts = mixed_rows()
    got = mt.logits(names, texts)
    assert mt.passes([n for n in names if n in SCENARIO]) == 12  # one per method configuration: 18 tasks of 12
    own = {}
    with torch.no_grad():
        for name, text, logits in zip(names, texts, got, strict=True):
            if name not in own:  # once per task (setdefault's argument would load it again for every row)
                own[name] = own_model(folders, name, backbone)
            hub = own[name]
            alone = hub.predict(HEAD, hub.encode(*((text,) if isinstance(text, str) else text)), return_logits=True)[0]
            assert logits.shape == alone.shape == (len(LABELS.get(TASKS[name][1], [0])),)
            torch.testing.assert_close(logits, alone, rtol=1e-4, atol=1e-5, msg=name)
    # the tasks differ: a row of one task given to another changes its logits (no member mixed up)
    a, b = mt.logits(["lora-sst2", "pt-sst2"], [SINGLES[0], SINGLES[0]])
    assert (a - b).abs().max() > 1e-3


def test_predictions_name_the_tasks_labels(runs):
    folders, backbone = runs
    mt = multitask(backbone, folders, ["lora-sst2", "dpt-mnli", "lora-stsb"])
    rows = ["it 's fine .", PAIRS[0], PAIRS[1]]
    predicted = mt.predict(["lora-sst2", "dpt-mnli", "lora-stsb"], rows)
    logits = mt.logits(["lora-sst2", "dpt-mnli", "lora-stsb"], rows)
    for p, lg, labels in zip(predicted[:2], logits, (LABELS["sst2"], LABELS["mnli"]), strict=False):
        assert list(p["probabilities"]) == labels and p["label"] == labels[int(lg.argmax())]
        assert sum(p["probabilities"].values()) == pytest.approx(1.0, abs=1e-6)
    assert predicted[2] == {"task": "lora-stsb", "score": pytest.approx(float(logits[2][0]))}


def test_one_backbone_in_memory_and_groups_by_method(runs):
    folders, backbone = runs
    mt = multitask(backbone, folders, SCENARIO)
    # the two dora tasks: one group; the two vera tasks too (the same seed: the same frozen A and B)
    assert [len(g.tasks) for g in mt.groups] == [2, 1, 2, 3, 1, 1, 1, 1, 1, 2, 1, 2]
    first = {n: t.data_ptr() for n, t in frozen_tensors(mt.groups[0].template).items()}
    for group in mt.groups[1:]:
        shared = {n: t.data_ptr() for n, t in frozen_tensors(group.template).items()}
        assert shared and all(first[n] == ptr for n, ptr in shared.items())  # BitFit's biases are its own
    mt.detach("lora-rte")
    assert [t.name for t in mt.groups[3].tasks] == ["lora-sst2", "lora-stsb"]
    torch.testing.assert_close(
        mt.logits("lora-stsb", [PAIRS[2]])[0],
        multitask(backbone, folders, ["lora-stsb"]).logits("lora-stsb", [PAIRS[2]])[0],
    )


def test_bad_inputs_are_refused_with_the_reason(runs, tiny_backbones, tmp_path):
    folders, backbone = runs
    mt = multitask(backbone, folders, ["lora-sst2", "lora-rte"])
    with pytest.raises(KeyError, match="unknown task 'nope'; attached: lora-sst2, lora-rte"):
        mt.predict("nope", ["x"])
    with pytest.raises(ValueError, match="task lora-rte: takes a pair of sentences per row, got 1"):
        mt.predict("lora-rte", ["only one"])
    with pytest.raises(ValueError, match=r"task lora-sst2: input of 7\d\d tokens, longer than the 512 it takes"):
        mt.predict("lora-sst2", ["word " * 700])
    with pytest.raises(ValueError, match="task lora-sst2: already attached"):
        mt.attach("lora-sst2", folders["lora-sst2"])
    with pytest.raises(FileNotFoundError, match="no such run folder or checkpoint file"):
        mt.attach("gone", tmp_path / "gone")
    other = tiny_backbones(layers=4, seed=1)  # same shapes, other weights
    wrong = MultiTaskModel(other.model_file, bpe="wordpiece", wordpiece_vocab=str(other.folder / "vocab.txt"))
    with pytest.raises(RuntimeError, match="checkpoint was trained on another backbone"):
        wrong.attach("lora-sst2", folders["lora-sst2"])


def test_fine_tuning_runs_are_refused(runs, tmp_path):
    folders, backbone = runs
    run = write_run(tmp_path / "ft", "finetune", folders["lora-sst2"].parents[1] / "data" / "sst2", backbone, seed=0)
    mt = multitask(backbone, folders, [])
    with pytest.raises(ConfigError, match="task ft: .* is a fine-tuning run .every weight trained.: it cannot share"):
        mt.attach("ft", run)


def test_packing_pads_members_with_dummy_rows():
    rows = [torch.tensor([0, 5, 2]), torch.tensor([0, 6, 7, 8, 2]), torch.tensor([0, 9, 2])]
    tokens, used, local, slot = pack(rows, torch.tensor([4, 1, 4]), pad=1, bos=0, eos=2)
    assert used.tolist() == [1, 4] and local.tolist() == [1, 0, 1] and slot.tolist() == [0, 0, 1]
    assert tokens.tolist() == [
        [[0, 6, 7, 8, 2], [0, 2, 1, 1, 1]],  # member 1: its row, then a dummy <s> </s>
        [[0, 5, 2, 1, 1], [0, 9, 2, 1, 1]],
    ]
