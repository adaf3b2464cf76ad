"""The BPE a prepared data folder was encoded with, found again from its task.json, to encode more text
the same way (EFL's label descriptions, ``tasks/efl_sentence_prediction.py``).

``task.json`` records the BPE kind and the sha256 of its files (``provenance``: ``bpe``, ``bpe_sha256``),
not where they were. ``find_data_bpe`` takes the place given (``--efl-bpe-path``: the WordPiece
vocab.txt or its folder, or the GPT-2 BPE folder), else looks in the places its caller names (the task:
where the checkout keeps them, ``fairseq_idpg.layout.bpe_places``), and accepts only files whose sha256
are the recorded ones: text is never encoded with another vocabulary than the data's.
"""

from pathlib import Path
from typing import List, Optional, Tuple

from fairseq_idpg.errors import ConfigError, MissingFile

from ..data.digest import file_sha256
from .prepare import bpe_files, encode

KINDS = ("wordpiece", "gpt2")


def _files(bpe: str, place: Path):
    if bpe == "wordpiece":
        vocab = place / "vocab.txt" if place.is_dir() else place
        return bpe_files(bpe, vocab=str(vocab))
    return bpe_files(bpe, bpe_dir=str(place))


def _matches(bpe: str, place: Path, recorded) -> bool:
    files = _files(bpe, place)
    if not all(p.is_file() for p in files.values()):
        return False
    return recorded is None or all(recorded.get(name) == file_sha256(p) for name, p in files.items())


def find_data_bpe(info, given: Optional[str] = None, places_of=lambda bpe: ()) -> Tuple[str, Path]:
    """(kind, place) of the BPE ``info`` (a TaskInfo) was prepared with: ``given``, else the first of
    ``places_of(kind)`` whose files match; a ConfigError in one line if none does."""
    provenance = info.provenance or {}
    bpe = provenance.get("bpe") or info.bpe
    if bpe not in KINDS:
        raise ConfigError(f"{info.task}: the data's BPE {bpe!r} is not one of {', '.join(KINDS)}")
    recorded = provenance.get("bpe_sha256")
    places: List[Path] = [Path(given)] if given else list(places_of(bpe))
    for place in places:
        if _matches(bpe, place, recorded):
            return bpe, place
    where = given or ", ".join(str(p) for p in places) or "models/"
    check = "with the sha256 recorded in task.json" if recorded else "(task.json records no sha256)"
    raise MissingFile(f"the {bpe} BPE files the data was prepared with were not found {check} in {where}; "
                     f"give --efl-bpe-path")  # fmt: skip


def encode_with_data_bpe(texts, dictionary, bpe: str, place: Path) -> List[List[int]]:
    """Token ids (no specials) of ``texts`` as ``scripts/prepare_data.py`` encodes sentences."""
    files = _files(bpe, place)
    if bpe == "wordpiece":
        lines = encode(list(texts), bpe, None, str(files["vocab.txt"]), workers=1)
    else:
        lines = encode(list(texts), bpe, str(place), None, workers=1)
    return [dictionary.encode_line(line, append_eos=False, add_if_not_exist=False).tolist() for line in lines]
