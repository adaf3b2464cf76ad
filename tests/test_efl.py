"""EFL (``--method efl``, ``--task efl_sentence_prediction``): the entailment pairs built from real rows
of ../shared/data, the argmax-over-descriptions prediction against a hand computation on a tiny model,
the MNLI head reused as the entailment head, the refusals, and (slow) training on the offline stand-in
(all-MiniLM-L6-v2 converted to fairseq RoBERTa format; not RoBERTa, and not MNLI-tuned) through
scripts/run.sh, with fairseq-validate's score equal to the one fairseq-train selected."""

import json
import re
from pathlib import Path

import pytest
import torch
from conftest import STANDIN, build_tiny

from fairseq_idpg.data.label_descriptions import DESCRIPTIONS, Hypotheses, hypotheses_for
from fairseq_idpg.modules.entailment_head import EntailmentHead, install_entailment_head
from fairseq_idpg.modules.entailment_pairs import append_hypotheses, class_scores, description_suffixes, pair_targets

REPO = Path(__file__).resolve().parents[1]
IT_WAS_GREAT = [2008, 2000, 2306]  # "it was great" in the stand-in's dictionary (WordPiece, uncased)


def prepare(task, raw, out):
    from fairseq_idpg.preprocessing import prepare as prepare_data

    if not (out / "task.json").exists():
        prepare_data(task, str(raw), str(out), bpe="wordpiece", vocab=str(STANDIN / "vocab.txt"), workers=1)
    return out


def efl_task(data, **overrides):
    """The EFL task on a prepared folder, as fairseq-train sets it up."""
    from omegaconf import OmegaConf

    from fairseq_idpg.tasks.efl_sentence_prediction import EflSentencePredictionConfig, EflSentencePredictionTask

    values = dict(data=str(data), init_token=0, separator_token=2, regression_target=False)
    cfg = OmegaConf.structured(EflSentencePredictionConfig(**values, classification_head_name="mnli", seed=1))
    for key, value in overrides.items():
        setattr(cfg, key, value)
    return EflSentencePredictionTask.setup_task(cfg)


def first_examples(task, split, n):
    dataset = task.load_dataset(split)
    inner = dataset.dataset if hasattr(dataset, "dataset") else dataset  # SortDataset -> NestedDictionaryDataset
    return inner.collater([inner[i] for i in range(n)])


@pytest.fixture(scope="module")
def cr(shared_data, standin_model, tmp_path_factory):
    return prepare("CR", shared_data / "lmbff" / "cr", tmp_path_factory.mktemp("efl") / "CR")


@pytest.fixture(scope="module")
def rte(shared_data, standin_model, tmp_path_factory):
    return prepare("RTE", shared_data / "glue" / "RTE", tmp_path_factory.mktemp("efl") / "RTE")


# ---------------------------------------------------------------------------------------- pairs on real rows
def test_cr_pairs_from_real_rows(cr):
    """CR test rows 2 and 3 ("many of our disney movies do n't play on this dvd player ." and "player has a
    problem with dual-layer dvd 's ...", both negative) with EFL's one description "It was great"."""
    task = efl_task(cr, no_shuffle=True)
    assert task.hypotheses.texts == ("It was great",) and task.entailed_index == 1 and task.num_pairs == 1
    assert task.suffixes.tolist() == [[2, *IT_WAS_GREAT, 2]] and task.suffix_budget == 5
    assert task.bpe_place == STANDIN / "vocab.txt"  # found by the sha256 in task.json
    batch = first_examples(task, "valid", 3)
    tokens, target = batch["net_input"]["src_tokens"], batch["target"].view(-1)
    assert target.tolist() == [0, 0, 0]
    d = task.source_dictionary
    row = [d.index(w) for w in "many of our disney movies do n ' t play on this dvd player .".split()]
    assert tokens[1, : len(row) + 2].tolist() == [0, *row, 2]

    pairs = task.pairs(tokens)
    lengths = tokens.ne(1).sum(dim=1)
    assert lengths.tolist() == [91, 17, 22]
    assert pairs.shape == (3, 91 + 5)
    assert pairs[1].tolist() == [0, *row, 2, 2, *IT_WAS_GREAT, 2] + [1] * (91 - 17)
    assert pairs.ne(1).sum(dim=1).tolist() == [96, 22, 27]

    sample = task.pair_sample(batch)
    assert sample["target"].tolist() == [0, 0, 0] and sample["nsentences"] == 3 and sample["ntokens"] == 145


def test_rte_pairs_are_the_sentence_pairs(rte):
    """Sentence-pair tasks: no description, the second sentence is the hypothesis; RTE's class 0
    ("entailment") is the entailed one."""
    task = efl_task(rte, no_shuffle=True)
    assert task.hypotheses.kind == "pair" and task.entailed_index == 0 and task.suffix_budget == 0
    batch = first_examples(task, "valid", 4)
    tokens, target = batch["net_input"]["src_tokens"], batch["target"].view(-1)
    assert target.tolist() == [1, 0, 1, 1]  # dev rows 0-3: not_entailment, entailment, not_entailment x 2
    assert torch.equal(task.pairs(tokens), tokens)
    assert task.pair_sample(batch)["target"].tolist() == [0, 1, 0, 0]  # entailed = label "entailment"
    logits = torch.tensor([[0.0, 1.0], [2.0, -1.0], [0.5, 0.2], [-1.0, 0.3]])  # [not entailed, entailed]
    predicted = class_scores(logits, 1, task.entailed_index).argmax(-1)
    assert predicted.tolist() == [0, 1, 1, 0]  # class 0 ("entailment") iff entailed wins


def test_per_class_descriptions_make_c_pairs():
    """C descriptions: row b * C + c is example b with description c; the gold pair is the entailed one."""
    tokens = torch.tensor([[0, 11, 12, 13, 2], [0, 21, 2, 1, 1]])
    suffixes, lengths = description_suffixes([[7], [8, 9], [5, 5, 5]], eos=2, pad=1)
    assert suffixes.tolist() == [[2, 7, 2, 1, 1], [2, 8, 9, 2, 1], [2, 5, 5, 5, 2]] and lengths.tolist() == [3, 4, 5]
    pairs = append_hypotheses(tokens, 1, suffixes, lengths)
    expected = [
        [0, 11, 12, 13, 2, 2, 7, 2, 1, 1],
        [0, 11, 12, 13, 2, 2, 8, 9, 2, 1],
        [0, 11, 12, 13, 2, 2, 5, 5, 5, 2],
        [0, 21, 2, 2, 7, 2, 1, 1, 1, 1],
        [0, 21, 2, 2, 8, 9, 2, 1, 1, 1],
        [0, 21, 2, 2, 5, 5, 5, 2, 1, 1],
    ]
    assert pairs.tolist() == expected
    assert pair_targets(torch.tensor([2, 0]), 3).tolist() == [0, 0, 1, 1, 0, 0]
    assert pair_targets(torch.tensor([1, 0]), 1, entailed_index=1).tolist() == [1, 0]
    assert pair_targets(torch.tensor([1, 0]), 1, entailed_index=0).tolist() == [0, 1]


# ---------------------------------------------------------------------------------------- prediction by hand
def test_argmax_over_descriptions_equals_a_hand_computation(tiny):
    """EntailmentScores on a tiny random model: each class's score is the entailment log-odds of its pair,
    computed here pair by pair (one forward per pair, P from the MNLI softmax), and the prediction is the
    class whose description is most entailed."""
    from fairseq_idpg.tasks.efl_sentence_prediction import EntailmentScores

    torch.manual_seed(0)
    model = build_tiny(tiny, "roberta").eval()
    head = install_entailment_head(model, "mnli")
    with torch.no_grad():
        head.out_proj.weight.normal_(0, 2.0)  # spread the scores, so the argmax is not a tie
    tokens = torch.tensor([[0, 2023, 3185, 2001, 2045, 2], [0, 7592, 2088, 2, 1, 1], [0, 2307, 2, 1, 1, 1]])
    descriptions = [[2008, 2000, 2307], [2008, 2000, 6659], [2008, 2003, 2025, 1037]]
    suffixes, lengths = description_suffixes(descriptions, eos=2, pad=1)
    task = type("T", (), {})()
    task.num_pairs, task.entailed_index = 3, None
    task.pairs = lambda src: append_hypotheses(src, 1, suffixes, lengths)

    with torch.no_grad():
        scores, _ = EntailmentScores(model, task)(tokens, classification_head_name="mnli")
        by_hand = torch.empty(3, 3)
        for b, row in enumerate(tokens.tolist()):
            x = [t for t in row if t != 1]
            for c, d in enumerate(descriptions):
                pair = torch.tensor([x + [2, *d, 2]])
                features = model(pair, features_only=True)[0]
                p = head.mnli_logits(features).softmax(-1)[0]  # [contradiction, neutral, entailment]
                by_hand[b, c] = torch.log(p[2] / (p[0] + p[1]))
    assert scores.shape == (3, 3)
    torch.testing.assert_close(scores, by_hand, atol=1e-5, rtol=1e-5)
    assert torch.equal(scores.argmax(-1), by_hand.argmax(-1))
    print("scores", scores.tolist(), "prediction", scores.argmax(-1).tolist())


def test_entailment_head_is_the_mnli_head(tiny):
    """Binary softmax = [P(contradiction) + P(neutral), P(entailment)] of the MNLI head, and an MNLI
    checkpoint's ``mnli`` head (3 outputs) loads into it unchanged."""
    torch.manual_seed(0)
    mnli = build_tiny(tiny, "roberta")
    mnli.register_classification_head("mnli", num_classes=3)
    efl = build_tiny(tiny, "roberta")
    install_entailment_head(efl, "mnli")
    efl.load_state_dict(mnli.state_dict())
    assert isinstance(efl.classification_heads["mnli"], EntailmentHead)
    tokens = torch.tensor([[0, 2023, 3185, 2, 2, 2008, 2000, 2306, 2]])
    mnli.eval(), efl.eval()
    with torch.no_grad():
        p = mnli(tokens, classification_head_name="mnli")[0].softmax(-1)
        q = efl(tokens, classification_head_name="mnli")[0].softmax(-1)
    torch.testing.assert_close(q, torch.stack([p[:, 0] + p[:, 1], p[:, 2]], -1))


# ---------------------------------------------------------------------------------------- descriptions, refusals
def test_descriptions_cover_the_classification_tasks():
    from fairseq_idpg.preprocessing import TASKS

    for name, spec in TASKS.items():
        if name in ("STS-B", "MNLI"):
            with pytest.raises(ValueError, match=f"EFL does not apply to {name}"):
                hypotheses_for(name)
            continue
        h = hypotheses_for(name)
        assert h.source, name
        assert h.kind == ("pair" if spec.pair else "description"), name
        h.check(spec.num_classes)
        assert spec.labels[h.entailed_index(spec.labels)] in ("1", "entailment"), name
    assert set(DESCRIPTIONS) == set(TASKS) - {"STS-B", "MNLI"}
    with pytest.raises(ValueError, match="needs entailed_label"):
        Hypotheses("description", ("It was great",))
    with pytest.raises(ValueError, match="2 descriptions for 3 classes"):
        Hypotheses("description", ("a", "b")).check(3)


def test_sts_b_is_refused_in_one_line(shared_data, standin_model, tmp_path):
    data = prepare("STS-B", shared_data / "glue" / "STS-B", tmp_path / "STS-B")
    with pytest.raises(ValueError) as e:
        efl_task(data, regression_target=True, num_classes=1)
    assert "\n" not in str(e.value) and "EFL does not apply to STS-B" in str(e.value)


# ---------------------------------------------------------------------------------------- end to end (slow)
# the stand-in's smoke budget for this test: 30 updates of 16 examples at lr 2e-4, validated once at the end
# (measured: dev accuracy 71.9, 70.9 for seeds 1, 2; 75.1 after 60 updates at 1e-4; chance 50.9)
BUDGET = ["--max-update", "30", "--total-batch", "16", "--lr", "2e-4", "--validate-interval-updates", "30"]
# fairseq-train's dev accuracy in train.log: --log-format json, then simple
VALID_ACCURACY = (r'"valid_accuracy": "([0-9.]+)"', r"valid on 'valid' subset \|.*?\| accuracy ([0-9.]+)")


@pytest.mark.slow
def test_efl_trains_on_the_standin_sst2(tmp_path, sst2_slice, standin_model, capfd):
    """scripts/run.sh SST-2 --method efl on the stand-in (not MNLI-tuned: EFL starts from the stand-in
    itself, with a fresh entailment head) learns above chance on the first 3,200 train rows, and
    fairseq-validate on checkpoint_best.pt (results.json) reports the dev accuracy (the whole dev set)
    fairseq-train's validation selected it with. The job's main (what run.sh execs) runs in this process, on the
    slice prepared in this process where run.sh prepares it: two interpreter starts fewer (run.sh itself and its
    preparation are run by tests/test_end_to_end.py's SST-2 learning run)."""
    from fairseq_idpg.layout import data_folder
    from fairseq_idpg.run import main

    prepare("SST-2", sst2_slice, data_folder(tmp_path, "standin", "SST-2"))  # where run.sh prepares: it uses it
    capfd.readouterr()
    code = main(["SST-2", "--method", "efl", "--raw", str(sst2_slice), *BUDGET, "--work-dir", str(tmp_path)])
    stdout, stderr = capfd.readouterr()
    assert code == 0, stdout[-3000:] + stderr[-3000:]
    assert "prepare_data.py" not in stdout  # the data prepared above, in this process
    (results_file,) = (tmp_path / "checkpoints" / "standin" / "SST-2" / "efl").glob("*/results.json")
    results = json.loads(results_file.read_text())
    accuracy = results["results"]["valid"]["accuracy"]
    print(f"stand-in SST-2 dev accuracy {accuracy} after {results['updates']} updates; times {results['timings']}")
    assert accuracy > 60.0  # chance: 50.9 (444 of the 872 dev examples are positive)
    log = (results_file.parent / "train.log").read_text()
    logged = [float(a) for pattern in VALID_ACCURACY for a in re.findall(pattern, log)]
    assert logged and accuracy == pytest.approx(max(logged), abs=0.01)
