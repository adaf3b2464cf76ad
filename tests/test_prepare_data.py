"""scripts/prepare_data.py on slices of the real files and on rows written in the distributed formats."""

import contextlib
import csv
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fairseq.data import Dictionary, data_utils
from fairseq.data.encoders.gpt2_bpe_utils import get_encoder

from fairseq_idpg.preprocessing import TASKS, Example, PrepareError, get_task, make_splits

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "prepare_data.py"
_spec = importlib.util.spec_from_file_location("prepare_data_cli", SCRIPT)
cli = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(cli)


@pytest.fixture
def run(capsys, roberta_bpe):
    """run(task, raw, out, *options) -> (exit code, stdout, stderr) of the CLI, in-process."""

    def _run(task, raw, out, *options, bpe_dir=roberta_bpe):
        argv = [task, "--raw", str(raw), "--out", str(out), "--workers", "1"]
        argv += ["--bpe-dir", str(bpe_dir)] if bpe_dir and "--bpe" not in options else []
        code = cli.main(argv + list(options))
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return _run


def head(src: Path, dst_dir: Path, lines: int, extra: str = "") -> None:
    """The first ``lines`` lines of a real file, byte for byte (BOM, \\r\\n kept), plus ``extra``."""
    dst_dir.mkdir(parents=True, exist_ok=True)
    with open(src, "rb") as f:
        data = b"".join(f.readline() for _ in range(lines))
    (dst_dir / src.name).write_bytes(data + extra.encode("utf-8"))


def write(path: Path, rows, delimiter="\t") -> None:
    """Rows in the distributed format: GLUE TSV (tabs, quotes left bare) or LM-BFF CSV (quoted)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8", newline="") as f:
        if delimiter == "\t":
            f.writelines("\t".join(row) + "\n" for row in rows)
        else:
            csv.writer(f).writerows(rows)


def load(out: Path, column: str, split: str):
    """The binarized split as lists of ids (``eos`` = 2 ends each row, as fairseq-preprocess writes)."""
    dictionary = Dictionary.load(str(out / column / "dict.txt"))
    dataset = data_utils.load_indexed_dataset(str(out / column / split), dictionary)
    assert dataset is not None, f"{out / column / split} missing"
    return [dataset[i].tolist() for i in range(len(dataset))]


def labels_of(out: Path, split: str):
    """Class indices as fairseq's sentence_prediction computes them (strip eos, minus nspecial)."""
    dictionary = Dictionary.load(str(out / "label" / "dict.txt"))
    return [row[0] - dictionary.nspecial for row in load(out, "label", split)]


def texts_of(out: Path, column: str, split: str, roberta_bpe: Path):
    """Decode GPT-2 rows back to text: dict.txt symbols are GPT-2 BPE ids."""
    dictionary = Dictionary.load(str(out / column / "dict.txt"))
    encoder = get_encoder(str(roberta_bpe / "encoder.json"), str(roberta_bpe / "vocab.bpe"))
    return [encoder.decode(int(dictionary[i]) for i in row[:-1]) for row in load(out, column, split)]


def read_tsv(path: Path, header=True):
    with open(path, encoding="utf-8-sig", newline="") as f:
        rows = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    return rows[1:] if header else rows


# --- real files ---------------------------------------------------------------------------


def test_sst2_slice_hello_world_and_labels(tmp_path, shared_data, run):
    raw = tmp_path / "SST-2"
    head(shared_data / "glue/SST-2/train.tsv", raw, 31, extra="Hello world\t1\n")
    head(shared_data / "glue/SST-2/dev.tsv", raw, 11)
    code, out, err = run("sst-2", raw, tmp_path / "bin", "--workers", "2")  # the process pool
    assert code == 0, err
    assert "train.tsv 31 rows (official 67,349)" in out and "warning: train.tsv has 31 rows" in err
    bin_ = tmp_path / "bin"
    train = load(bin_, "input0", "train")
    assert len(train) == 31 and len(load(bin_, "input0", "valid")) == 10
    assert train[-1] == [31414, 232, 2]  # RoBERTa's ids for "Hello world", then </s>
    assert labels_of(bin_, "train") == [int(r[1]) for r in read_tsv(raw / "train.tsv")]
    assert (bin_ / "label" / "dict.txt").read_text().split()[::2] == ["0", "1"]
    assert not (bin_ / "input1").exists() and not (bin_ / "_text").exists()
    info = json.loads((bin_ / "task.json").read_text())
    assert {k: info[k] for k in ("task", "num_classes", "regression", "pair", "metric", "splits", "bpe")} == {
        "task": "SST-2",
        "num_classes": 2,
        "regression": False,
        "pair": False,
        "metric": "accuracy",
        "splits": {"train": 31, "valid": 10},
        "bpe": "gpt2",
    }


def test_rte_pair_with_word_labels(tmp_path, shared_data, run, roberta_bpe):
    raw = tmp_path / "RTE"
    head(shared_data / "glue/RTE/train.tsv", raw, 21)
    head(shared_data / "glue/RTE/dev.tsv", raw, 6)
    assert run("RTE", raw, tmp_path / "bin")[0] == 0
    rows = read_tsv(raw / "train.tsv")
    assert texts_of(tmp_path / "bin", "input1", "train", roberta_bpe) == [r[2] for r in rows]
    assert labels_of(tmp_path / "bin", "train") == [["entailment", "not_entailment"].index(r[3]) for r in rows]
    info = json.loads((tmp_path / "bin" / "task.json").read_text())
    assert info["pair"] and info["splits"] == {"train": 20, "valid": 5}


def test_mrpc_bom_header_and_quotes(tmp_path, shared_data, run, roberta_bpe):
    raw = tmp_path / "MRPC"
    head(shared_data / "glue/MRPC/train.tsv", raw, 16)
    head(shared_data / "glue/MRPC/dev.tsv", raw, 4)
    assert (raw / "train.tsv").read_bytes().startswith(b"\xef\xbb\xbfQuality")
    assert run("mrpc", raw, tmp_path / "bin")[0] == 0
    rows = read_tsv(raw / "train.tsv")
    assert len(rows) == 15
    # QUOTE_NONE: the bare quotes of '" the witness "' stay part of the sentence
    assert texts_of(tmp_path / "bin", "input0", "train", roberta_bpe) == [r[3] for r in rows]
    assert '" the witness "' in rows[0][3]
    assert labels_of(tmp_path / "bin", "train") == [int(r[0]) for r in rows]
    assert json.loads((tmp_path / "bin" / "task.json").read_text())["metric"] == "acc_and_f1"


def test_stsb_labels_are_score_over_5(tmp_path, shared_data, run):
    raw = tmp_path / "STS-B"
    head(shared_data / "glue/STS-B/train.tsv", raw, 21)
    head(shared_data / "glue/STS-B/dev.tsv", raw, 9)
    assert run("STS-B", raw, tmp_path / "bin")[0] == 0
    for split, name in (("train", "train.tsv"), ("valid", "dev.tsv")):
        written = [float(x) for x in (tmp_path / "bin" / "label" / f"{split}.label").read_text().split()]
        assert written == pytest.approx([float(r[9]) / 5 for r in read_tsv(raw / name)], abs=1e-6)
    assert not (tmp_path / "bin" / "label" / "dict.txt").exists()
    info = json.loads((tmp_path / "bin" / "task.json").read_text())
    assert (info["regression"], info["num_classes"], info["metric"]) == (True, 1, "pearson_and_spearman")
    assert len(load(tmp_path / "bin", "input1", "valid")) == 8


def test_cola_has_no_header(tmp_path, shared_data, run, roberta_bpe):
    raw = tmp_path / "CoLA"
    head(shared_data / "glue/CoLA/train.tsv", raw, 12)
    head(shared_data / "glue/CoLA/dev.tsv", raw, 5)
    assert run("cola", raw, tmp_path / "bin")[0] == 0
    rows = read_tsv(raw / "train.tsv", header=False)
    assert texts_of(tmp_path / "bin", "input0", "train", roberta_bpe) == [r[3] for r in rows]  # 12, first kept
    assert labels_of(tmp_path / "bin", "train") == [int(r[1]) for r in rows]
    assert json.loads((tmp_path / "bin" / "task.json").read_text())["metric"] == "mcc"


def test_cr_keeps_empty_sentences(tmp_path, shared_data, run):
    raw = tmp_path / "cr"
    head(shared_data / "lmbff/cr/train.csv", raw, 370)  # line 368 is '0,' (empty sentence), \r\n ends
    head(shared_data / "lmbff/cr/test.csv", raw, 10)
    code, out, err = run("CR", raw, tmp_path / "bin")
    assert code == 0, err
    train = load(tmp_path / "bin", "input0", "train")
    assert len(train) == 370 and train[367] == [2]  # only </s>: an empty input is kept
    assert labels_of(tmp_path / "bin", "train")[367] == 0


def test_mr_csv_quoting(tmp_path, shared_data, run, roberta_bpe):
    raw = tmp_path / "mr"
    head(shared_data / "lmbff/mr/train.csv", raw, 8)
    head(shared_data / "lmbff/mr/test.csv", raw, 8)
    assert run("MR", raw, tmp_path / "bin")[0] == 0
    first = texts_of(tmp_path / "bin", "input0", "train", roberta_bpe)[0]
    assert first.startswith('" analyze that " is one of those crass')  # """ analyze that "" ... unquoted


# --- formats written here (not in ../shared/data) -----------------------------------------


def test_qnli_and_qqp_written_rows(tmp_path, run):
    qnli = tmp_path / "QNLI"
    write(
        qnli / "train.tsv",
        [
            ["index", "question", "sentence", "label"],
            ["0", "Who wrote it?", "Hello world", "entailment"],
            ["1", "When?", 'It said "no".', "not_entailment"],
        ],
    )
    write(qnli / "dev.tsv", [["index", "question", "sentence", "label"], ["0", "Why?", "Because.", "not_entailment"]])
    assert run("qnli", qnli, tmp_path / "qnli-bin")[0] == 0
    assert load(tmp_path / "qnli-bin", "input1", "train")[0] == [31414, 232, 2]
    assert labels_of(tmp_path / "qnli-bin", "train") == [0, 1]

    qqp = tmp_path / "QQP"
    header = ["id", "qid1", "qid2", "question1", "question2", "is_duplicate"]
    write(
        qqp / "train.tsv", [header, ["1", "1", "2", "Hello world", "Hi world?", "1"], ["2", "3", "4", "A?", "B?", "0"]]
    )
    write(qqp / "dev.tsv", [header, ["3", "5", "6", "C?", "D?", "1"]])
    assert run("QQP", qqp, tmp_path / "qqp-bin")[0] == 0
    assert load(tmp_path / "qqp-bin", "input0", "train")[0] == [31414, 232, 2]
    assert labels_of(tmp_path / "qqp-bin", "train") == [1, 0]
    assert json.loads((tmp_path / "qqp-bin" / "task.json").read_text())["metric"] == "acc_and_f1"


def mnli_row(i, s1, s2, label, dev):
    parses = ["(x)", "(y)", "(ROOT x)", "(ROOT y)"]
    annotators = [label] * 5 if dev else [label]  # dev: label1..label5, then gold_label
    return [str(i), str(i), f"{i}n", "fiction", *parses, s1, s2, *annotators, label]


def test_mnli_dev_matched_and_mismatched(tmp_path, run):
    raw = tmp_path / "MNLI"
    head12 = [
        "index",
        "promptID",
        "pairID",
        "genre",
        "sentence1_binary_parse",
        "sentence2_binary_parse",
        "sentence1_parse",
        "sentence2_parse",
        "sentence1",
        "sentence2",
        "label1",
        "gold_label",
    ]
    head16 = head12[:11] + ["label2", "label3", "label4", "label5", "gold_label"]
    labels = ["contradiction", "neutral", "entailment"]
    write(raw / "train.tsv", [head12] + [mnli_row(i, f"s{i}", f"t{i}", labels[i % 3], False) for i in range(6)])
    write(raw / "dev_matched.tsv", [head16] + [mnli_row(i, "Hello world", "x", labels[i], True) for i in range(3)])
    write(raw / "dev_mismatched.tsv", [head16] + [mnli_row(0, "y", "Hello world", "neutral", True)])
    assert run("mnli", raw, tmp_path / "bin")[0] == 0
    info = json.loads((tmp_path / "bin" / "task.json").read_text())
    assert info["splits"] == {"train": 6, "valid": 3, "valid1": 1} and info["num_classes"] == 3
    assert labels_of(tmp_path / "bin", "train") == [0, 1, 2, 0, 1, 2]
    assert labels_of(tmp_path / "bin", "valid") == [0, 1, 2] and labels_of(tmp_path / "bin", "valid1") == [1]
    assert load(tmp_path / "bin", "input0", "valid")[0] == [31414, 232, 2]
    assert load(tmp_path / "bin", "input1", "valid1")[0] == [31414, 232, 2]


@pytest.mark.parametrize("task", ["MPQA", "SUBJ"])
def test_mpqa_subj_written_rows(tmp_path, run, task):
    raw = tmp_path / task.lower()
    write(raw / "train.csv", [["1", "Hello world"], ["0", 'a "quoted", sentence'], ["1", ""]], delimiter=",")
    write(raw / "test.csv", [["0", "x"], ["1", "y"]], delimiter=",")
    assert run(task, raw, tmp_path / "bin")[0] == 0
    assert load(tmp_path / "bin", "input0", "train")[0] == [31414, 232, 2]
    assert load(tmp_path / "bin", "input0", "train")[2] == [2]
    assert labels_of(tmp_path / "bin", "train") == [1, 0, 1] and labels_of(tmp_path / "bin", "valid") == [0, 1]


def test_wordpiece_dictionary_from_vocab(tmp_path, run):
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "hello", "world", "x"]) + "\n")
    raw = tmp_path / "mr"
    write(raw / "train.csv", [["1", "Hello world"], ["0", "x"]], delimiter=",")
    write(raw / "test.csv", [["0", "world"]], delimiter=",")
    code, _, err = run("mr", raw, tmp_path / "bin", "--bpe", "wordpiece", "--vocab", str(vocab))
    assert code == 0, err
    # <s> <pad> </s> <unk>, then the vocabulary in order: hello = 4, world = 5, x = 6
    assert load(tmp_path / "bin", "input0", "train") == [[4, 5, 2], [6, 2]]
    assert json.loads((tmp_path / "bin" / "task.json").read_text())["bpe"] == "wordpiece"


# --- sampling -----------------------------------------------------------------------------


def fake_train(n):
    return [Example((f"sentence {i}",), str(i % 2)) for i in range(n)]


def test_few_shot_sizes_disjoint_and_seeded():
    spec = get_task("subj")
    data = {"train.csv": fake_train(1500), "test.csv": fake_train(7)}
    splits = make_splits(spec, data, few_shot=100, dev_from_train=None, seed=3)
    assert {k: len(v) for k, v in splits.items()} == {"train": 100, "valid": 1000, "test": 7}
    assert not {e.texts for e in splits["train"]} & {e.texts for e in splits["valid"]}
    assert splits == make_splits(spec, data, 100, None, 3)  # same seed, same sample
    assert splits["train"] != make_splits(spec, data, 100, None, 4)["train"]
    # one seed: the same dev set for every K
    assert make_splits(spec, data, 500, None, 3)["valid"] == splits["valid"]  # 500 = 1,500 - 1,000: the most
    with pytest.raises(PrepareError, match="K can be at most 500"):
        make_splits(spec, data, 501, None, 3)
    mnli = make_splits(
        get_task("MNLI"),
        {"train.tsv": fake_train(1200), "dev_matched.tsv": [], "dev_mismatched.tsv": []},
        few_shot=200,
        dev_from_train=None,
        seed=1,
    )
    assert list(mnli) == ["train", "valid", "test", "test1"]


def test_dev_from_train():
    data = {"train.csv": fake_train(50), "test.csv": fake_train(7)}
    splits = make_splits(get_task("CR"), data, few_shot=None, dev_from_train=10, seed=1)
    assert {k: len(v) for k, v in splits.items()} == {"train": 40, "valid": 10, "test": 7}
    assert sorted(e.texts for e in splits["train"] + splits["valid"]) == sorted(e.texts for e in data["train.csv"])


def test_few_shot_end_to_end(tmp_path, run):
    raw = tmp_path / "subj"
    write(raw / "train.csv", [[str(i % 2), f"sentence {i}"] for i in range(1030)], delimiter=",")
    write(raw / "test.csv", [["0", "x"], ["1", "y"], ["0", "z"]], delimiter=",")
    assert run("SUBJ", raw, tmp_path / "bin", "--few-shot", "16", "--seed", "2")[0] == 0
    info = json.loads((tmp_path / "bin" / "task.json").read_text())
    assert info["splits"] == {"train": 16, "valid": 1000, "test": 3} and (info["few_shot"], info["seed"]) == (16, 2)
    assert len(load(tmp_path / "bin", "input0", "test")) == 3 and len(labels_of(tmp_path / "bin", "valid")) == 1000
    first = (tmp_path / "bin" / "input0" / "train.bin").read_bytes()
    assert run("SUBJ", raw, tmp_path / "bin", "--few-shot", "16", "--seed", "2", "--overwrite")[0] == 0
    assert (tmp_path / "bin" / "input0" / "train.bin").read_bytes() == first
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bin", "subj"]  # no temporary dirs left


# --- bad input: one line, exit 2, nothing written -----------------------------------------


def sst2(raw: Path, train_extra="", dev="sentence\tlabel\nok\t1\n"):
    raw.mkdir(parents=True, exist_ok=True)
    (raw / "train.tsv").write_text("sentence\tlabel\ngood\t1\n" + train_extra, encoding="utf-8")
    (raw / "dev.tsv").write_text(dev, encoding="utf-8")
    return raw


BAD = {
    "unknown task": (lambda t: ("SST3", t / "raw", []), "unknown task 'SST3' (valid: SST-2, QNLI, RTE"),
    "missing folder": (lambda t: ("SST-2", t / "nowhere", []), "nowhere: no such folder"),
    "missing file": (
        lambda t: ("SST-2", (sst2(t / "raw"), (t / "raw" / "dev.tsv").unlink())[0], []),
        "lacks dev.tsv (expected the SST-2 files train.tsv, dev.tsv",
    ),
    "columns": (
        lambda t: ("SST-2", sst2(t / "raw", "bad\t0\textra\n"), []),
        "train.tsv:3: expected 2 columns, found 3",
    ),
    "label": (
        lambda t: ("SST-2", sst2(t / "raw", "bad\t2\n"), []),
        "train.tsv:3: label '2' is not one of the SST-2 labels",
    ),
    "header": (lambda t: ("SST-2", sst2(t / "raw", dev="ok\t1\n"), []), "dev.tsv:1: expected the header line"),
    "score": (lambda t: ("STS-B", write_stsb(t / "raw", "high"), []), "train.tsv:2: expected a score between 0 and 5"),
    "bpe files": (
        lambda t: ("SST-2", sst2(t / "raw"), ["--bpe-dir", str(bpe_only_encoder(t))]),
        "lacks vocab.bpe, dict.txt",
    ),
    "no bpe dir": (lambda t: ("SST-2", sst2(t / "raw"), ["--bpe", "gpt2"]), "--bpe gpt2 needs --bpe-dir"),
    "no vocab": (lambda t: ("SST-2", sst2(t / "raw"), ["--bpe", "wordpiece"]), "--bpe wordpiece needs --vocab"),
    "few-shot": (
        lambda t: ("SST-2", sst2(t / "raw"), ["--few-shot", "5"]),
        "--few-shot 5: train.tsv has 1 rows and the 1,000-example dev set is sampled from train too",
    ),
    "strict": (
        lambda t: ("SST-2", sst2(t / "raw"), ["--strict-sizes"]),
        "train.tsv has 1 rows, the official SST-2 file has 67,349",
    ),
}


def write_stsb(raw: Path, score: str) -> Path:
    head = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore\n"
    write(raw / "train.tsv", [head.split(), ["0", "g", "f", "y", "o", "s", "s", "A b.", "A c.", score]])
    write(raw / "dev.tsv", [head.split()])
    return raw


def bpe_only_encoder(tmp: Path) -> Path:
    (tmp / "bpe").mkdir()
    (tmp / "bpe" / "encoder.json").write_text("{}")
    return tmp / "bpe"


@pytest.mark.parametrize("case", BAD)
def test_bad_input_one_line_and_nothing_written(tmp_path, run, case):
    make, expected = BAD[case]
    task, raw, options = make(tmp_path)
    out = tmp_path / "out" / "bin"
    code, stdout, err = run(task, raw, out, *options)
    assert code == 2
    *warnings, error = err.splitlines()
    assert error.startswith("prepare_data.py: error: ") and expected in error, err
    assert all(w.startswith("warning: ") for w in warnings), err  # row-count warnings may come first
    assert not (tmp_path / "out").exists()  # not even the parent of --out


def test_existing_out_is_not_replaced(tmp_path, run):
    out = tmp_path / "bin"
    out.mkdir()
    (out / "keep").write_text("x")
    code, _, err = run("SST-2", sst2(tmp_path / "raw"), out)
    assert code == 2 and "already exists (pass --overwrite" in err
    assert [p.name for p in out.iterdir()] == ["keep"]


@pytest.mark.parametrize("where", ["raw", "parent", "grandparent"])
def test_out_equal_to_or_above_raw_is_refused(tmp_path, run, where):
    """--out is never the raw folder nor above it, with or without --overwrite (a prepared folder
    inside the raw folder is allowed: replacing it deletes nothing else)."""
    raw = sst2(tmp_path / "data" / "glue" / "SST-2")
    (raw / "task.json").write_text("{}")  # even if it looks like prepared data
    out = {"raw": raw, "parent": raw.parent, "grandparent": tmp_path / "data" / ".." / "data"}[where]
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    code, _, err = run("SST-2", raw, out, "--overwrite")
    what = "is the --raw folder" if where == "raw" else f"contains the --raw folder {raw}"
    assert code == 2 and err == (
        f"prepare_data.py: error: --out {out}: {what}; prepared data goes to a folder that is neither --raw nor "
        f"above it (e.g. data-bin/SST-2)\n"
    )
    assert sorted(str(p) for p in tmp_path.rglob("*")) == before
    assert run("SST-2", raw, raw / "bin")[0] == 0 and (raw / "bin" / "task.json").is_file()


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_interrupted_prepare_removes_its_temporary_folder(tmp_path, run, monkeypatch, signum):
    prepare_module = sys.modules["fairseq_idpg.preprocessing.prepare"]

    def interrupted(spec, splits, tmp, *args):
        (tmp / "input0").mkdir()  # part of the work done
        # raise_signal: delivered to this thread and handled before it returns (os.kill may reach another
        # thread, and the work would go on: the race this test once lost on a loaded machine)
        signal.raise_signal(signum)
        raise AssertionError(f"signal {signum} was not handled")

    monkeypatch.setattr(prepare_module, "_binarize", interrupted)
    handler = signal.getsignal(signal.SIGTERM)
    with pytest.raises(SystemExit) if signum == signal.SIGTERM else contextlib.nullcontext():
        code, _, err = run("SST-2", sst2(tmp_path / "raw"), tmp_path / "out" / "bin")
    if signum == signal.SIGINT:
        assert code == 130
    assert os.listdir(tmp_path / "out") == []
    assert signal.getsignal(signal.SIGTERM) == handler  # restored


def test_stale_temporary_folders_are_removed_on_the_next_run(tmp_path, run):
    """Left by kill -9: removed when their process (this host) is gone, or (another host, or the old name
    without pid) untouched for a day; a live process's folder and other folders' are kept."""
    from fairseq_idpg.preprocessing.prepare import _host

    out = tmp_path / "bin"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    names = {
        "dead": f".bin.{_host()}.{dead.pid}.abcd1234.tmp",
        "alive": f".bin.{_host()}.{os.getpid()}.abcd1234.tmp",
        "old other host": ".bin.elsewhere.12.abcd1234.tmp",
        "new other host": ".bin.elsewhere.13.abcd1234.tmp",
        "old unnamed": ".bin.k2j3h4g5.tmp",
        "another folder": f".bin.few-shot.{_host()}.{dead.pid}.abcd1234.tmp",
    }
    for name in names.values():
        (tmp_path / name).mkdir()
        (tmp_path / name / "input0").mkdir()
    day_ago = time.time() - 25 * 3600
    for key in ("old other host", "old unnamed"):
        os.utime(tmp_path / names[key], (day_ago, day_ago))
    code, stdout, _ = run("SST-2", sst2(tmp_path / "raw"), out)
    assert code == 0
    left = sorted(p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp"))
    assert left == sorted(names[k] for k in ("alive", "new other host", "another folder"))
    assert (
        f"SST-2: removed {tmp_path / names['dead']}, left by an interrupted preparation "
        f"(its process {dead.pid} is not running)" in stdout
    )
    assert f"removed {tmp_path / names['old unnamed']}, left by an interrupted preparation (untouched for 25 h)" in (
        stdout
    )


def test_cli_process_error_has_no_traceback(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "nope", "--raw", str(tmp_path), "--out", str(tmp_path / "o")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith("prepare_data.py: error: unknown task 'nope'")
    assert "Traceback" not in proc.stderr


def test_task_table_is_complete():
    assert sorted(TASKS) == sorted("SST-2 QNLI RTE MRPC STS-B QQP MNLI CoLA MPQA SUBJ CR MR".split())
    with pytest.raises(PrepareError):
        get_task("WNLI")


@pytest.mark.slow
def test_full_sst2(tmp_path, shared_data, roberta_bpe):
    proc = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "SST-2",
            "--raw",
            str(shared_data / "glue/SST-2"),
            "--out",
            str(tmp_path / "bin"),
            "--bpe",
            "gpt2",
            "--bpe-dir",
            str(roberta_bpe),
            "--strict-sizes",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    assert "train.tsv 67,349 rows (official 67,349)" in proc.stdout
    assert "dev.tsv 872 rows (official 872)" in proc.stdout
    assert "splits train 67,349, valid 872" in proc.stdout
    assert len(load(tmp_path / "bin", "input0", "train")) == 67349
    assert len(labels_of(tmp_path / "bin", "valid")) == 872
