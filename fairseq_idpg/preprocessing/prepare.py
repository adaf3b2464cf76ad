"""Raw task files -> fairseq ``sentence_prediction`` data, as fairseq's RoBERTa GLUE recipe.

``prepare`` validates everything first (task, options, BPE files, every row of every raw
file, sampling sizes), then BPE-encodes in parallel and binarizes with fairseq's own
preprocess into a temporary sibling of ``out`` that is renamed into place at the end:

    out/input0/{split}.{bin,idx}, dict.txt     first sentence
    out/input1/...                             second sentence (pairs only)
    out/label/{split}.{bin,idx}, dict.txt      fixed label order (STS-B: {split}.label = score / 5)
    out/task.json                              num_classes, regression, pair, metric, split sizes,
                                               provenance (what it was made from: ``provenance``)

Each BPE-encoded chunk of a split and each binarized column is a part, kept (its sha256 verified) in
``.OUT.parts`` beside ``out`` until the end (``parts.py``): an interrupted preparation (Ctrl-C, a kill)
ends in one line, and the same command resumes, reusing the parts already finished.

``provenance`` records the raw folder, the sha256 of each raw file and of the BPE files, and the
sampling options (``split_dev`` only where set: data prepared before it existed keeps its provenance);
``provenance_differences`` says why a prepared folder is not what the same options would prepare now
(the main job, ``fairseq_idpg/run/``, prepares again then).
"""

import contextlib
import logging
import os
import re
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from multiprocessing import Pool
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from ..data.digest import file_sha256
from ..data.task_info import TaskInfo
from .formats import Example, PrepareError, TaskSpec, get_task
from .parts import Parts, parts_key, summary

FEW_SHOT_DEV = 1000  # IDPG section 4.4: a 1,000-example dev set sampled from train
STALE_AGE = 24 * 3600  # a temporary folder of another host (or unnamed process) this old is left over
GPT2_FILES = ("encoder.json", "vocab.bpe", "dict.txt")
CHUNK_LINES = 10_000  # sentences BPE-encoded per part: an interrupted preparation loses at most one chunk's work


def prepare(
    task: str,
    raw: str,
    out: str,
    bpe: str = "gpt2",
    bpe_dir: Optional[str] = None,
    vocab: Optional[str] = None,
    few_shot: Optional[int] = None,
    seed: int = 1,
    dev_from_train: Optional[int] = None,
    split_dev: bool = False,
    workers: Optional[int] = None,
    strict_sizes: bool = False,
    overwrite: bool = False,
) -> dict:
    """Prepare ``task`` from its raw folder into ``out``; returns what it writes to task.json. Interrupted
    (Ctrl-C, SIGTERM), it says in one line what it keeps for the same command to resume from, and re-raises."""
    start = time.time()
    spec = get_task(task)
    raw, out = Path(raw), Path(out)
    if workers is not None and workers < 1:
        raise PrepareError(f"--workers must be >= 1, got {workers}")
    workers = workers or min(4, os.cpu_count() or 1)
    check_sampling(few_shot, dev_from_train, split_dev)  # before the raw files are read
    _check_bpe(bpe, bpe_dir, vocab)
    _check_out(out, overwrite, raw)
    parts = []  # the Parts, once opened
    try:
        data = read_raw(spec, raw, strict_sizes)
        splits = make_splits(spec, data, few_shot, dev_from_train, seed, split_dev)
        origin = provenance(spec, raw, bpe, bpe_dir, vocab, few_shot, dev_from_train, seed, split_dev)
        print(f"{spec.name}: splits " + ", ".join(f"{s} {len(v):,}" for s, v in splits.items()), flush=True)
        info = TaskInfo(
            task=spec.name,
            num_classes=spec.num_classes,
            regression=spec.regression,
            pair=spec.pair,
            metric=spec.metric,
            splits={s: len(v) for s, v in splits.items()},
            bpe=bpe,
            labels=list(spec.labels) if spec.labels else None,
            few_shot=few_shot,
            dev_from_train=dev_from_train,
            split_dev=split_dev,
            seed=seed if seeded(few_shot, dev_from_train, split_dev) else None,
            provenance=origin,
        )
        out.parent.mkdir(parents=True, exist_ok=True)
        _remove_stale(out, spec.name)
        with _signals_for_workers():  # SIGTERM, like Ctrl-C, ends in the except clauses
            key = parts_key(spec.name, origin, CHUNK_LINES)
            parts.append(Parts.open(out, key, log=lambda m: print(f"{spec.name}: {m}", flush=True)))
            _build(spec, splits, out, parts[0], info, (bpe, bpe_dir, vocab, workers))
    except (KeyboardInterrupt, SystemExit):
        print(_interrupted(spec, out, parts[0] if parts else None), file=sys.stderr, flush=True)
        raise
    parts[0].remove()
    print(f"{spec.name}: wrote {out} in {time.time() - start:.1f} s", flush=True)
    return info.to_dict()


def _build(spec: TaskSpec, splits, out: Path, parts: Parts, info: TaskInfo, encoding) -> None:
    """Binarize into a temporary sibling of ``out`` (its finished parts kept in ``parts``), renamed to ``out``."""
    # .NAME.HOST.PID.xxxx.tmp: a later run can tell whether its process is still running
    prefix = f".{out.name}.{_host()}.{os.getpid()}."
    tmp = Path(tempfile.mkdtemp(prefix=prefix, suffix=".tmp", dir=out.parent))
    try:
        umask = os.umask(0o22)
        os.umask(umask)
        tmp.chmod(0o777 & ~umask)  # mkdtemp makes it 0700; out should get the usual mode
        _binarize(spec, splits, tmp, *encoding, parts)
        info.write(tmp)
        _move_into_place(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _interrupted(spec: TaskSpec, out: Path, parts: Optional[Parts]) -> str:
    """The one line an interrupted preparation ends with; what it left under a temporary name is removed (its
    binarized folder's, its parts'), and a parts folder with nothing finished."""
    for leftover in out.parent.glob(f".{out.name}.{_host()}.{os.getpid()}.*.tmp"):
        shutil.rmtree(leftover, ignore_errors=True)
    if parts is not None:
        parts.remove_temporaries()
    kept = parts.kept() if parts is not None else []
    if not kept:
        if parts is not None:
            parts.remove()
        return f"interrupted: prepare_data {spec.name} --out {out}: nothing finished yet; the same command starts again"
    return (
        f"interrupted: prepare_data {spec.name} --out {out}: {len(kept)} finished part(s) kept in {parts.folder}; "
        f"the same command resumes from them"
    )


@contextlib.contextmanager
def _signals_for_workers():
    """In this process SIGTERM raises SystemExit(143) (as Ctrl-C raises KeyboardInterrupt), so the temporary
    folder is removed and the finished parts are kept. Forked workers (the BPE pool, fairseq-preprocess's)
    inherit the handlers: they ignore Ctrl-C, which this process handles by ending them (no traceback of
    theirs), and die of SIGTERM as before."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pid = os.getpid()

    def on_sigterm(signum, frame):
        if os.getpid() != pid:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
        raise SystemExit(128 + signum)

    def on_sigint(signum, frame):
        if os.getpid() == pid:
            raise KeyboardInterrupt

    previous = {signal.SIGTERM: signal.signal(signal.SIGTERM, on_sigterm)}
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:  # started in the background: Ctrl-C stays ignored
        previous[signal.SIGINT] = signal.signal(signal.SIGINT, on_sigint)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


# after ".OUT": ".HOST.PID.xxxxxxxx.tmp", or ".xxxxxxxx.tmp" (before the host and pid were in the name)
_TMP_NAME = re.compile(r"(?:\.(?P<host>[A-Za-z0-9-]+)\.(?P<pid>\d+))?\.[a-z0-9_]{8}\.tmp")


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9-]", "-", socket.gethostname())


def _remove_stale(out: Path, task: str) -> None:
    """Remove the temporary folders of ``out`` left by a killed preparation: on this host when their process is
    no longer running, otherwise (another host, or no pid in the name) when untouched for STALE_AGE."""
    for path in out.parent.glob(f".{glob_escape(out.name)}.*.tmp"):
        named = _TMP_NAME.fullmatch(path.name[len(out.name) + 1 :])
        if named is None or not path.is_dir():
            continue  # another folder's, or not ours
        try:
            age = time.time() - path.stat().st_mtime
        except OSError:
            continue
        if named["pid"] and named["host"] == _host():
            if _running(int(named["pid"])):
                continue
            why = f"its process {named['pid']} is not running"
        elif age > STALE_AGE:
            why = f"untouched for {age / 3600:.0f} h"
        else:
            continue
        shutil.rmtree(path, ignore_errors=True)
        print(f"{task}: removed {path}, left by an interrupted preparation ({why})", flush=True)


def glob_escape(name: str) -> str:
    return re.sub(r"([*?[])", r"[\1]", name)


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _check_out(out: Path, overwrite: bool, raw: Path) -> None:
    """``out`` must not be the raw folder nor above it (inside it is allowed); an existing non-empty ``out`` is
    replaced only with ``overwrite`` and only if it holds prepared data (its task.json)."""
    where, source = out.resolve(), raw.resolve()
    if where == source or where in source.parents:
        what = "is the --raw folder" if where == source else f"contains the --raw folder {raw}"
        raise PrepareError(
            f"--out {out}: {what}; prepared data goes to a folder that is neither --raw nor above it "
            f"(e.g. data-bin/{raw.name or 'TASK'})"
        )
    if not out.exists() or (out.is_dir() and not any(out.iterdir())):
        return
    if not overwrite:
        raise PrepareError(f"--out {out}: already exists (pass --overwrite to replace it)")
    if not out.is_dir() or not TaskInfo.exists(out):
        raise PrepareError(
            f"--out {out}: exists and is not a prepared data folder (no task.json): --overwrite replaces only "
            f"prepared data; move it away or choose another --out"
        )


# --- provenance --------------------------------------------------------------------------


def bpe_files(bpe: str, bpe_dir: Optional[str] = None, vocab: Optional[str] = None) -> Dict[str, Path]:
    """The files that define the encoding: GPT-2's encoder.json, vocab.bpe, dict.txt, or WordPiece's vocab.txt."""
    if bpe == "gpt2":
        return {name: Path(bpe_dir) / name for name in GPT2_FILES}
    return {Path(vocab).name: Path(vocab)}


def provenance(
    task,
    raw,
    bpe: str = "gpt2",
    bpe_dir: Optional[str] = None,
    vocab: Optional[str] = None,
    few_shot: Optional[int] = None,
    dev_from_train: Optional[int] = None,
    seed: int = 1,
    split_dev: bool = False,
) -> Dict[str, Any]:
    """What a prepared folder is made from: the raw folder and the sha256 of each of the task's raw
    files, the BPE and the sha256 of its files, the sampling (few-shot K, dev-from-train N, split-dev, seed).
    ``split_dev`` is a key only where set (its value: ``SPLIT_DEV_RULE``): the provenance of other data, and so the
    names of the runs on it (``fairseq_idpg/run/identity.py`` hashes it), are what they were before it existed."""
    spec = task if isinstance(task, TaskSpec) else get_task(task)
    raw = Path(raw)
    return {
        "raw": str(raw.resolve()),
        "raw_sha256": {name: file_sha256(raw / name) for name in spec.files},
        "bpe": bpe,
        "bpe_sha256": {name: file_sha256(path) for name, path in bpe_files(bpe, bpe_dir, vocab).items()},
        "few_shot": few_shot,
        "dev_from_train": dev_from_train,
        **({"split_dev": SPLIT_DEV_RULE} if split_dev else {}),
        "seed": seed if seeded(few_shot, dev_from_train, split_dev) else None,
    }


def seeded(few_shot: Optional[int] = None, dev_from_train: Optional[int] = None, split_dev: bool = False) -> bool:
    """Whether the splits are drawn with a seed (few-shot, dev-from-train, split-dev)."""
    return few_shot is not None or dev_from_train is not None or bool(split_dev)


def provenance_differences(recorded: Optional[Dict[str, Any]], wanted: Dict[str, Any]) -> List[str]:
    """Why data prepared from ``recorded`` is not what ``wanted`` would prepare (empty: the same data).
    The raw folder's path alone does not count: the same files elsewhere make the same data."""
    if not recorded:
        return ["its task.json records no provenance (prepared by an older version or by other means)"]
    reasons = []
    old_raw, new_raw = recorded.get("raw_sha256") or {}, wanted["raw_sha256"]
    changed = [name for name in new_raw if old_raw.get(name) != new_raw[name]]
    if changed:
        where = recorded.get("raw")
        moved = f" (prepared from {where}, now {wanted['raw']})" if where != wanted["raw"] else ""
        reasons.append(f"raw file(s) {', '.join(changed)} differ by sha256{moved}")
    if recorded.get("bpe") != wanted["bpe"]:
        reasons.append(f"BPE {recorded.get('bpe')} -> {wanted['bpe']}")
    elif (recorded.get("bpe_sha256") or {}) != wanted["bpe_sha256"]:
        reasons.append(f"the {wanted['bpe']} BPE files ({', '.join(wanted['bpe_sha256'])}) differ by sha256")
    for key, flag in (("few_shot", "--few-shot"), ("dev_from_train", "--dev-from-train"), ("seed", "sampling seed")):
        if recorded.get(key) != wanted[key]:
            reasons.append(f"{flag} {recorded.get(key)} -> {wanted[key]}")
    if bool(recorded.get("split_dev")) != bool(wanted.get("split_dev")):
        said = {True: "on", False: "off"}
        reasons.append(f"--split-dev {said[bool(recorded.get('split_dev'))]} -> {said[bool(wanted.get('split_dev'))]}")
    elif recorded.get("split_dev") != wanted.get("split_dev"):  # split by an earlier rule (True: every file halved)
        reasons.append(f"--split-dev's rule {recorded['split_dev']!r} -> {wanted['split_dev']!r}")
    return reasons


def read_raw(spec: TaskSpec, raw: Path, strict_sizes: bool = False) -> Dict[str, List[Example]]:
    """File name -> examples for every raw file of the task, all parsed and checked."""
    if not raw.is_dir():
        raise PrepareError(
            f"--raw {raw}: no such folder (expected the {spec.name} folder holding {', '.join(spec.files)})"
        )
    missing = [name for name in spec.files if not (raw / name).is_file()]
    if missing:
        raise PrepareError(
            f"--raw {raw} lacks {', '.join(missing)} "
            f"(expected the {spec.name} files {', '.join(spec.files)} as distributed)"
        )
    data = {}
    for name, official in zip(spec.files, spec.sizes, strict=False):
        data[name] = spec.read(raw / name)
        if not data[name]:
            raise PrepareError(f"{raw / name}: no examples (empty or header only; expected the {spec.name} rows)")
        _check_size(spec, name, len(data[name]), official, strict_sizes)
    return data


def _check_bpe(bpe: str, bpe_dir: Optional[str], vocab: Optional[str]) -> None:
    if bpe == "gpt2":
        if not bpe_dir:
            raise PrepareError("--bpe gpt2 needs --bpe-dir (the folder with encoder.json, vocab.bpe, dict.txt)")
        missing = [f for f in GPT2_FILES if not (Path(bpe_dir) / f).is_file()]
        if missing:
            raise PrepareError(
                f"--bpe-dir {bpe_dir} lacks {', '.join(missing)} (expected RoBERTa's GPT-2 BPE files "
                f"{', '.join(GPT2_FILES)}; `scripts/download.py bpe` fetches them)"
            )
    elif bpe == "wordpiece":
        if not vocab:
            raise PrepareError("--bpe wordpiece needs --vocab (the model's WordPiece vocab.txt)")
        from fairseq_idpg.encoders.wordpiece import read_vocab

        try:
            read_vocab(vocab)
        except (OSError, ValueError) as e:
            raise PrepareError(f"--vocab: {e}") from None
    else:
        raise PrepareError(f"unknown --bpe {bpe!r} (valid: gpt2, wordpiece)")


def _check_size(spec: TaskSpec, name: str, rows: int, official: int, strict: bool) -> None:
    print(f"{spec.name}: {name} {rows:,} rows (official {official:,})", flush=True)
    if rows != official:
        message = f"{name} has {rows:,} rows, the official {spec.name} file has {official:,}"
        if strict:
            raise PrepareError(message + " (--strict-sizes)")
        print(f"warning: {message} (a modified file? --strict-sizes makes this an error)", file=sys.stderr)


def make_splits(
    spec: TaskSpec,
    data: Dict[str, List[Example]],
    few_shot: Optional[int],
    dev_from_train: Optional[int],
    seed: int,
    split_dev: bool = False,
) -> Dict[str, List[Example]]:
    """Split name -> examples. Without sampling the labelled dev/test files are valid, valid1;
    with sampling the dev set comes from train and those files become test, test1 (fairseq's
    names for the second, third... file of ``--validpref``/``--testpref``). ``split_dev``: each of
    those files is split in two (``split_for_selection``), valid{i} and test{i}; train stays whole."""
    train, *evals = [data[f] for f in spec.files]
    check_sampling(few_shot, dev_from_train, split_dev)
    if split_dev:
        halves = [
            split_for_selection(examples, seed, name) for name, examples in zip(spec.files[1:], evals, strict=True)
        ]
        select, report = [s for s, _ in halves], [r for _, r in halves]
        return {"train": train, **_numbered("valid", select), **_numbered("test", report)}
    if few_shot is None and dev_from_train is None:
        return {"train": train, **_numbered("valid", evals)}
    # np.random.RandomState: its streams are frozen across numpy versions, so a seed means
    # the same sample everywhere. The dev examples come first in the permutation, so for one
    # seed the few-shot dev set is the same for every K (and the K sets are nested).
    order = np.random.RandomState(seed).permutation(len(train))
    if few_shot is not None:
        if few_shot < 1:
            raise PrepareError(f"--few-shot {few_shot}: K must be at least 1")
        if few_shot > len(train) - FEW_SHOT_DEV:
            raise PrepareError(
                f"--few-shot {few_shot}: {spec.files[0]} has {len(train):,} rows and the {FEW_SHOT_DEV:,}-example "
                f"dev set is sampled from train too, so K can be at most {max(0, len(train) - FEW_SHOT_DEV):,}"
            )
        dev, rest = order[:FEW_SHOT_DEV], order[FEW_SHOT_DEV : FEW_SHOT_DEV + few_shot]
    else:
        if not 1 <= dev_from_train < len(train):
            raise PrepareError(
                f"--dev-from-train {dev_from_train}: must be between 1 and {len(train) - 1:,} "
                f"({spec.files[0]} has {len(train):,} rows)"
            )
        dev, rest = order[:dev_from_train], order[dev_from_train:]
    # sorted: the sampled examples keep the file's order (training shuffles anyway)
    sampled = {"train": [train[i] for i in sorted(rest)], "valid": [train[i] for i in sorted(dev)]}
    return {**sampled, **_numbered("test", evals)}


def check_sampling(few_shot: Optional[int], dev_from_train: Optional[int], split_dev: bool) -> None:
    """One line when two sampling options are given: each makes the dev set its own way."""
    if few_shot is not None and dev_from_train is not None:
        raise PrepareError("--few-shot and --dev-from-train exclude each other (few-shot samples its own dev set)")
    if split_dev and (few_shot is not None or dev_from_train is not None):
        other = "--few-shot" if few_shot is not None else "--dev-from-train"
        raise PrepareError(f"--split-dev and {other} exclude each other ({other} samples its dev set from train)")


# ReFT's GLUE split (pyreft examples/loreft/train.py): a dev file of more than 5,000 rows gives 1,000 to selection
SPLIT_DEV_LARGE, SPLIT_DEV_SELECT = 5000, 1000
SPLIT_DEV_RULE = "select floor(n/2) rows, 1000 when n > 5000"  # in the provenance: data split otherwise is redone


def split_for_selection(examples: List[Example], seed: int, name: str = "the dev file") -> Tuple[list, list]:
    """(selecting part, scored part) of one labelled dev file, as ReFT (Wu et al. 2024, Table 4) splits GLUE's dev
    sets in its code: floor(n / 2) examples select the checkpoint (``valid``), or 1,000 where the file has more than
    5,000 (MNLI, QQP, QNLI), and the rest are scored (``test``). ReFT draws them with torch's random_split from its
    run's seed; here the first examples of ``RandomState(seed).permutation(n)`` select (the same sizes, a draw of
    the project's, stable across versions). A fresh RandomState per file: MNLI's matched split does not depend on
    its mismatched file. Each part keeps the file's order."""
    if len(examples) < 2:
        raise PrepareError(f"--split-dev: {name} has {len(examples)} example(s); splitting it needs 2 or more")
    n = len(examples)
    select_n = SPLIT_DEV_SELECT if n > SPLIT_DEV_LARGE else n // 2
    order = np.random.RandomState(seed).permutation(n)
    select, report = order[:select_n], order[select_n:]
    return [examples[i] for i in sorted(select)], [examples[i] for i in sorted(report)]


def _numbered(name: str, items: list) -> dict:
    return {name + (str(i) if i else ""): item for i, item in enumerate(items)}


# --- BPE ---------------------------------------------------------------------------------

_gpt2 = None  # per worker process, as fairseq's multiprocessing_bpe_encoder


def _init_gpt2(encoder_json: str, vocab_bpe: str) -> None:
    """A BPE worker: its encoder, and the signals' default actions. The handlers it inherits from the preparing
    process (``_signals_for_workers``) are Python-level: a worker blocked on the pool's queue lock, where
    ``Pool.terminate`` leaves it, was seen not to run them and outlived its SIGTERM, so the pool's join hung.
    Ctrl-C is its parent's to handle."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    global _gpt2
    from fairseq.data.encoders.gpt2_bpe_utils import get_encoder

    _gpt2 = get_encoder(encoder_json, vocab_bpe)


def _encode_gpt2(line: str) -> str:
    # strip() as multiprocessing_bpe_encoder does; an empty line stays an empty line (--keep-empty)
    return " ".join(map(str, _gpt2.encode(line.strip())))


def encode(lines: List[str], bpe: str, bpe_dir: Optional[str], vocab: Optional[str], workers: int) -> List[str]:
    """BPE-encode ``lines`` into space-separated tokens (GPT-2: the BPE ids that dict.txt maps)."""
    with _encoder(bpe, bpe_dir, vocab, workers) as encode_lines:
        return encode_lines(lines)


@contextlib.contextmanager
def _encoder(bpe: str, bpe_dir: Optional[str], vocab: Optional[str], workers: int):
    """A function lines -> encoded lines, for several calls: GPT-2's worker pool starts once, at the first."""
    if bpe == "wordpiece":
        from fairseq_idpg.encoders.wordpiece import WordpieceBPE, WordpieceBPEConfig

        encoder = WordpieceBPE(WordpieceBPEConfig(wordpiece_vocab=vocab))
        yield lambda lines: encoder.encode_batch([line.strip() for line in lines])  # parallel Rust threads
        return
    paths = (os.path.join(bpe_dir, "encoder.json"), os.path.join(bpe_dir, "vocab.bpe"))
    if workers <= 1:
        _init_gpt2(*paths)
        yield lambda lines: [_encode_gpt2(line) for line in lines]
        return
    with contextlib.ExitStack() as stack:
        pool = []

        def encode_lines(lines):
            if not pool:
                pool.append(stack.enter_context(Pool(workers, initializer=_init_gpt2, initargs=paths)))
            chunksize = max(1, min(1000, len(lines) // (4 * workers)))
            return pool[0].map(_encode_gpt2, lines, chunksize=chunksize)

        yield encode_lines


# --- binarization ------------------------------------------------------------------------


def _text_chunks(splits, column: int):
    """(split, part name, sentences) of column ``input{column}``: each split's in chunks of CHUNK_LINES."""
    for split, exs in splits.items():
        for k, begin in enumerate(range(0, len(exs), CHUNK_LINES)):
            sentences = [ex.texts[column] for ex in exs[begin : begin + CHUNK_LINES]]
            yield split, f"text/{split}.input{column}.{k:04d}", sentences


def _binarize(spec: TaskSpec, splits, tmp: Path, bpe, bpe_dir, vocab, workers, parts: Parts) -> None:
    """tmp/input0, input1 (pairs), label: each binarized column is a part (kept when interrupted), made from
    BPE-encoded chunks that are parts too; those already finished are reused."""
    columns = [f"input{i}" for i in range(2 if spec.pair else 1)] + ["label"]
    chunks = {c: list(_text_chunks(splits, i)) for i, c in enumerate(columns[:-1]) if not parts.finished(c)}
    reused = [c for c in columns if c not in chunks and parts.finished(c)]
    reused += [name for each in chunks.values() for _, name, _ in each if parts.finished(name)]
    if reused:
        print(f"{spec.name}: reusing {len(reused)} finished part(s) of an interrupted preparation in {parts.folder} "
              f"(sha256 checked): {summary(reused)}", flush=True)  # fmt: skip
    todo = [(name, lines) for each in chunks.values() for _, name, lines in each if name not in reused]
    if todo or not reused:
        sentences = sum(len(lines) for _, lines in todo)
        print(f"{spec.name}: BPE ({bpe}) of {sentences:,} sentences with {workers} workers", flush=True)
    with _encoder(bpe, bpe_dir, vocab, workers) as encode_lines:
        for name, lines in todo:
            parts.make(name, lambda path, lines=lines: _write_lines(path, encode_lines(lines)))

    text = tmp / "_text"  # each split's BPE-encoded text, as fairseq-preprocess reads it
    text.mkdir()
    if bpe == "gpt2":
        src_dict = os.path.join(bpe_dir, "dict.txt")
    else:
        from fairseq_idpg.encoders.wordpiece import write_dict_txt

        src_dict = str(text / "dict.txt")
        write_dict_txt(vocab, src_dict)
    for column, each in chunks.items():
        for split in splits:
            _concatenate([parts.folder / name for s, name, _ in each if s == split], text / f"{split}.{column}")
        parts.make(column, lambda dest, c=column: _preprocess(text, splits, c, src_dict, dest, workers), folder=True)
    if not parts.finished("label"):
        parts.make("label", lambda dest: _labels(spec, splits, text, dest, workers), folder=True)
    for column in columns:
        parts.link(column, tmp / column)
    shutil.rmtree(text)


def _concatenate(sources: List[Path], target: Path) -> None:
    with open(target, "wb") as f:
        for source in sources:
            with open(source, "rb") as part:
                shutil.copyfileobj(part, f)


def _labels(spec: TaskSpec, splits, text: Path, dest: Path, workers: int) -> None:
    """The label column in ``dest``: STS-B's scores as text, else binarized with a fixed label dictionary."""
    if spec.regression:
        # fairseq's sentence_prediction reads label/{split}.label for --regression-target;
        # "%.6g" is awk's number format, so the files match the recipe's `awk '{print $1 / 5.0}'`
        for split, exs in splits.items():
            _write_lines(dest / f"{split}.label", ("%.6g" % (float(ex.label) / 5.0) for ex in exs))
        return
    # A label dictionary in the task's fixed order (fairseq would order it by frequency,
    # so class indices would depend on the data); counts are the train frequencies.
    counts = [sum(ex.label == label for ex in splits["train"]) for label in spec.labels]
    _write_lines(text / "label.dict.txt", (f"{label} {n}" for label, n in zip(spec.labels, counts, strict=False)))
    for split, exs in splits.items():
        _write_lines(text / f"{split}.label", (ex.label for ex in exs))
    _preprocess(text, splits, "label", str(text / "label.dict.txt"), dest, workers)


def _write_lines(path: Path, lines) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for line in lines:
            f.write(line + "\n")


def _preprocess(text: Path, splits, column: str, src_dict: str, destdir: Path, workers: int) -> None:
    """``fairseq-preprocess --only-source --srcdict`` for one column, called in-process."""
    from fairseq import options
    from fairseq_cli import preprocess

    def prefs(kind):  # "valid.x,valid1.x": fairseq writes valid.{bin,idx}, valid1.{bin,idx}
        return ",".join(str(text / f"{s}.{column}") for s in splits if s.rstrip("0123456789") == kind)

    argv = ["--only-source", "--trainpref", prefs("train"), "--destdir", str(destdir)]
    argv += ["--srcdict", src_dict, "--workers", str(workers)]
    for kind in ("valid", "test"):
        if prefs(kind):
            argv += [f"--{kind}pref", prefs(kind)]
    args = options.get_preprocessing_parser().parse_args(argv)
    # preprocess.main adds a FileHandler (destdir/preprocess.log) to its logger on every call
    # and never removes it; keep its log in that file only and close the handler afterwards.
    logger = logging.getLogger("fairseq_cli.preprocess")
    handlers, propagate = list(logger.handlers), logger.propagate
    logger.propagate = False
    try:
        preprocess.main(args)
    finally:
        for h in logger.handlers[len(handlers) :]:
            logger.removeHandler(h)
            h.close()
        logger.propagate = propagate


def _move_into_place(tmp: Path, out: Path) -> None:
    """Rename the finished ``tmp`` to ``out``; an existing ``out`` is removed only afterwards."""
    old = None
    if out.exists():
        old = out.with_name(f".{out.name}.{os.getpid()}.old")
        out.rename(old)
    tmp.rename(out)
    if old is not None:
        shutil.rmtree(old) if old.is_dir() else old.unlink()
