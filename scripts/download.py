#!/usr/bin/env python3
"""Download the task data, GloVe, RoBERTa and its BPE files from their official sources.

    python scripts/download.py glue [--tasks SST-2 MRPC ...]  # data/glue/<TASK>/
    python scripts/download.py lmbff             # data/lmbff/{mr,cr,mpqa,subj}/{train,test}.csv
    python scripts/download.py glove             # data/glove/glove.6B.300d.txt
    python scripts/download.py roberta large     # models/roberta.large/{model.pt,dict.txt}
    python scripts/download.py bpe               # models/gpt2_bpe/{encoder.json,vocab.bpe,dict.txt}
    python scripts/download.py all [--out DIR]   # all of it (with --out: everything under DIR)

data/ and models/ are in the repository root unless --out DIR says otherwise.

Every file is fetched to a temporary file beside its destination, checked against its md5
where one is known, and renamed into place (folders likewise), so an interrupted run leaves
nothing half-written; what already exists is skipped. The layout matches what
scripts/prepare_data.py expects for --raw and --bpe-dir.
"""

import argparse
import hashlib
import io
import os
import re
import shutil
import sys
import tarfile
import tempfile
import urllib.request
import zipfile
from pathlib import Path
from typing import Callable, Dict, Optional

FB = "https://dl.fbaipublicfiles.com/"
# The per-task zips of the widely used download_glue_data.py (md5 not published: None).
GLUE_ZIPS = {
    "CoLA": FB + "glue/data/CoLA.zip",
    "SST-2": FB + "glue/data/SST-2.zip",
    "QQP": FB + "glue/data/QQP-clean.zip",
    "STS-B": FB + "glue/data/STS-B.zip",
    "MNLI": FB + "glue/data/MNLI.zip",
    "QNLI": FB + "glue/data/QNLIv2.zip",
    "RTE": FB + "glue/data/RTE.zip",
    "WNLI": FB + "glue/data/WNLI.zip",
}
# MRPC is not redistributed by GLUE: the MSR corpus files (as hosted by SentEval) and GLUE's dev ids.
MRPC = {
    "train": FB + "senteval/senteval_data/msr_paraphrase_train.txt",
    "test": FB + "senteval/senteval_data/msr_paraphrase_test.txt",
    "dev_ids": "https://firebasestorage.googleapis.com/v0/b/mtl-sentence-representations.appspot.com/o/"
    "data%2Fmrpc_dev_ids.tsv?alt=media&token=ec5c0836-31d5-48f4-b431-7480817f1adc",
}
GLUE_TASKS = ("CoLA", "SST-2", "MRPC", "QQP", "STS-B", "MNLI", "QNLI", "RTE", "WNLI")
LMBFF = "https://nlp.cs.princeton.edu/projects/lm-bff/datasets.tar"
LMBFF_TASKS = ("mr", "cr", "mpqa", "subj")  # original/<task>/{train,test}.csv in the tar
GLOVE = "https://nlp.stanford.edu/data/glove.6B.zip"
GLOVE_FILE = "glove.6B.300d.txt"
ROBERTA = {size: f"{FB}fairseq/models/roberta.{size}.tar.gz" for size in ("base", "large")}
REPO = Path(__file__).resolve().parents[1]
BPE = {  # name -> (url, md5); the md5s of ../shared/roberta_bpe/README.md
    "encoder.json": (FB + "fairseq/gpt2_bpe/encoder.json", "dffec25a898b1f5e569bec4dffd7e5c0"),
    "vocab.bpe": (FB + "fairseq/gpt2_bpe/vocab.bpe", "75a37753dd7a28a2c5df80c28bf06e4e"),
    "dict.txt": (FB + "fairseq/gpt2_bpe/dict.txt", "e2d854270a441bce86e16be185c28761"),
}


class DownloadError(Exception):
    pass


MADE = []  # the folders this run made, for removing the empty ones when it fails


def make_dirs(path: Path) -> None:
    """``path.mkdir(parents=True, exist_ok=True)``, remembering the folders it made (``MADE``)."""
    missing = [p for p in (path, *path.parents) if not p.exists()]
    path.mkdir(parents=True, exist_ok=True)
    MADE.extend(reversed(missing))


def remove_made() -> None:
    """Remove the folders this run made that are still empty (a failed download leaves nothing behind; what
    it completed before stays, complete, and is skipped next time)."""
    for folder in reversed(MADE):
        try:
            folder.rmdir()
        except OSError:  # not empty (complete downloads), or already gone
            pass
    MADE.clear()


def fetch(url: str, f) -> None:
    """Stream ``url`` into the binary file ``f`` (the one network call; tests replace it)."""
    with urllib.request.urlopen(url, timeout=60) as response:
        shutil.copyfileobj(response, f, 1 << 20)


def md5sum(path: Path) -> str:
    h = hashlib.md5()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def download(url: str, dest: Path, md5: Optional[str] = None) -> Path:
    """``url`` -> ``dest``: fetched to a temporary file beside it, checked, renamed into place."""
    if dest.exists() and (md5 is None or md5sum(dest) == md5):
        print(f"{dest}: exists, skipped")
        return dest
    make_dirs(dest.parent)
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".part", dir=dest.parent)
    try:
        print(f"fetching {url}", flush=True)
        with os.fdopen(fd, "wb") as f:
            fetch(url, f)
        got = md5sum(Path(tmp))
        if md5 is not None and got != md5:
            raise DownloadError(f"{url}: md5 {got}, expected {md5}")
        os.replace(tmp, dest)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    print(f"{dest}: md5 {got}")
    return dest


def extract(archive: Path, into: Path, rename: Callable[[str], Optional[str]]) -> None:
    """Write each regular file of a zip or tar whose member name ``rename`` maps to a relative
    path under ``into`` (by that path, never the raw member name: nothing can escape ``into``)."""

    def write(target: str, data) -> None:
        if Path(target).is_absolute() or ".." in Path(target).parts:
            raise DownloadError(f"{archive}: unsafe member path {target!r}")
        (into / target).parent.mkdir(parents=True, exist_ok=True)
        with data, open(into / target, "wb") as f:
            shutil.copyfileobj(data, f, 1 << 20)

    if zipfile.is_zipfile(archive):
        with zipfile.ZipFile(archive) as z:
            for info in z.infolist():
                target = None if info.is_dir() else rename(info.filename)
                if target:
                    write(target, z.open(info))
    else:
        with tarfile.open(archive) as t:
            for member in t:
                target = rename(member.name) if member.isfile() else None
                if target:
                    write(target, t.extractfile(member))


def fetch_dir(dest: Path, build: Callable[[Path], None]) -> None:
    """Build the folder ``dest`` in a temporary folder beside it and rename it into place."""
    if dest.exists():
        print(f"{dest}: exists, skipped")
        return
    make_dirs(dest.parent)
    with tempfile.TemporaryDirectory(prefix=f".{dest.name}.", dir=dest.parent) as tmp:
        stage = Path(tmp) / "out"
        stage.mkdir()
        build(Path(tmp))
        os.replace(stage, dest)
    print(f"{dest}: done")


def from_archive(url: str, rename: Callable[[str], Optional[str]], md5: Optional[str] = None):
    """A ``fetch_dir`` builder: download ``url`` into the temporary folder, extract into out/."""
    name = url.rsplit("/", 1)[-1]
    return lambda tmp: extract(download(url, tmp / name, md5), tmp / "out", rename)


def split_mrpc(train: str, test: str, dev_ids: str) -> Dict[str, str]:
    """GLUE's MRPC files from the MSR corpus text, as download_glue_data.py builds them: the
    train rows whose (#1 ID, #2 ID) are in dev_ids go to dev.tsv, both keep the corpus header
    (with its byte-order mark); test.tsv gets an index column instead of the label."""
    dev = {tuple(line.strip().split("\t")) for line in io.StringIO(dev_ids, newline=None)}
    lines = io.StringIO(train, newline=None)  # universal newlines, as the original's io.open
    header = next(lines)
    out = {"train.tsv": [header], "dev.tsv": [header], "test.tsv": ["index\t#1 ID\t#2 ID\t#1 String\t#2 String\n"]}
    for line in lines:
        label, id1, id2, s1, s2 = line.strip().split("\t")
        out["dev.tsv" if (id1, id2) in dev else "train.tsv"].append(f"{label}\t{id1}\t{id2}\t{s1}\t{s2}\n")
    test_lines = io.StringIO(test, newline=None)
    next(test_lines)
    for index, line in enumerate(test_lines):
        _, id1, id2, s1, s2 = line.strip().split("\t")
        out["test.tsv"].append(f"{index}\t{id1}\t{id2}\t{s1}\t{s2}\n")
    return {name: "".join(rows) for name, rows in out.items()}


def build_mrpc(tmp: Path) -> None:
    text = {k: download(url, tmp / f"mrpc_{k}.txt").read_text(encoding="utf-8") for k, url in MRPC.items()}
    for name, content in split_mrpc(text["train"], text["test"], text["dev_ids"]).items():
        (tmp / "out" / name).write_text(content, encoding="utf-8")


def glue(out: Path, tasks=GLUE_TASKS) -> None:
    for task in tasks:
        if task == "MRPC":
            fetch_dir(out / "glue" / task, build_mrpc)
        else:  # the zip's top folder (QQP-clean.zip: QNLI/, ...) is dropped, out/glue/<task> holds its files
            fetch_dir(out / "glue" / task, from_archive(GLUE_ZIPS[task], _strip_top_folder))


def _strip_top_folder(name: str) -> Optional[str]:
    top, _, rest = name.partition("/")
    return rest if rest and not top.startswith("__MACOSX") else None


def lmbff(out: Path) -> None:
    def rename(name):  # original/<task>/{train,test}.csv -> <task>/...
        m = re.search(r"(?:^|/)original/(%s)/((?:train|test)\.csv)$" % "|".join(LMBFF_TASKS), name)
        return f"{m.group(1)}/{m.group(2)}" if m else None

    fetch_dir(out / "lmbff", from_archive(LMBFF, rename))


def glove(out: Path) -> None:
    fetch_dir(out / "glove", from_archive(GLOVE, lambda name: GLOVE_FILE if name.endswith(GLOVE_FILE) else None))


def roberta(out: Path, size: str) -> None:  # the tar holds roberta.<size>/{model.pt,dict.txt,NOTE}
    fetch_dir(out / f"roberta.{size}", from_archive(ROBERTA[size], _strip_top_folder))


def bpe(out: Path) -> None:
    for name, (url, md5) in BPE.items():
        download(url, out / "gpt2_bpe" / name, md5)


def main(argv=None) -> int:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--out", type=Path, help="destination folder (default: data/ or models/ in the repository)")
    parser = argparse.ArgumentParser(prog="download.py", description=__doc__.split("\n\n")[0])
    parser.set_defaults(tasks=None, size=None)
    sub = parser.add_subparsers(dest="what", required=True)
    sub.add_parser("glue", parents=[common]).add_argument("--tasks", nargs="+", choices=GLUE_TASKS)
    sub.add_parser("roberta", parents=[common]).add_argument("size", choices=sorted(ROBERTA))
    for name in ("lmbff", "glove", "bpe", "all"):
        sub.add_parser(name, parents=[common])
    args = parser.parse_args(argv)
    MADE.clear()
    what, data, models = args.what, args.out or REPO / "data", args.out or REPO / "models"
    try:
        if what in ("glue", "all"):
            glue(data, args.tasks or GLUE_TASKS)
        if what in ("lmbff", "all"):
            lmbff(data)
        if what in ("glove", "all"):
            glove(data)
        for size in sorted(ROBERTA) if what == "all" else [args.size] if what == "roberta" else []:
            roberta(models, size)
        if what in ("bpe", "all"):
            bpe(models)
    except (DownloadError, OSError) as e:  # urllib's errors are OSErrors
        remove_made()
        print(f"download.py: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
