#!/usr/bin/env python3
"""The IDPG authors' few-shot scripts against their full-data scripts, flag by flag (github:CSerxy/IDPG).

IDPG Table 3 (few-shot) was run by ``few_IDPG-PHM.sh`` (M-IDPG-PHM: ``scripts/few-finetune-gene_freeze-mphm.sh``)
and ``few_IDPG-PHM-GloVe.sh`` (``scripts/few-glove.sh``); Table 1 by ``IDPG-PHM.sh`` and ``IDPG-PHM-GloVe.sh``
(``scripts/multi-suffix-<task>_finetune-phm-p-layerb.sh``, ``scripts/glove-multi-suffix-<task>_finetune-phm-
layerb.sh``). This reads each script's fairseq-train command (its ``--flag [value]`` pairs, ``${X}`` written
``$X``), the values the script gives its update count and batch, and the settings of the scripts that call
them (``ROBERTA_PATH``, ``LRs``, ``seeds``, ``pdim``, ``mode``), and prints what
differs between the few-shot and the full-data runs of the same method (MR's script stands for the full-data
ones: the task is in both tables).

    PYTHONPATH=. python3 scripts/idpg_authors_scripts.py --idpg-authors /tmp/idpg-authors \
        [--save-fixture tests/data/idpg_authors]

``--save-fixture DIR`` writes DIR/script_flags.json, which tests/test_idpg_authors_scripts.py holds
examples/idpg/table3.yaml to without the checkout. Exit status 2 for a refusal (a script missing or without a
fairseq-train command).
"""

import argparse
import json
import re
import shlex
import sys
from pathlib import Path

# method -> {protocol: (the script that calls fairseq-train, the script that calls it)}
SCRIPTS = {
    "m-idpg-phm": {
        "few-shot": ("scripts/few-finetune-gene_freeze-mphm.sh", "few_IDPG-PHM.sh"),
        "full-data": ("scripts/multi-suffix-mr_finetune-phm-p-layerb.sh", "IDPG-PHM.sh"),
    },
    "m-idpg-phm-glove": {
        "few-shot": ("scripts/few-glove.sh", "few_IDPG-PHM-GloVe.sh"),
        "full-data": ("scripts/glove-multi-suffix-mr_finetune-phm-layerb.sh", "IDPG-PHM-GloVe.sh"),
    },
}
CALLER_SETTINGS = ("ROBERTA_PATH", "LRs", "seeds", "pdim", "mode")  # the last value given in the calling script
SCRIPT_SETTINGS = ("TOTAL_NUM_UPDATES", "MAX_SENTENCES")  # every value given in the training script


class ScriptError(Exception):
    """A one-line refusal."""


def _read(checkout, name):
    path = Path(checkout) / name
    if not path.is_file():
        raise ScriptError(f"--idpg-authors {checkout}: no {name} there (extract github:CSerxy/IDPG)")
    return path.read_text()


def train_flags(text):
    """{flag: value or True} of the script's fairseq-train command (comment lines dropped, continuation lines
    joined; the data folder, the first positional argument, as "data")."""
    code = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))  # a comment's \\ too
    lines = [line for line in re.sub(r"\\\n", " ", code).splitlines() if "fairseq-train" in line]
    if not lines:
        raise ScriptError("no fairseq-train command")
    words = shlex.split(lines[0].replace("${", "$").replace("}", ""), comments=True)
    words = words[words.index("fairseq-train") + 1 :]
    flags, i = {"data": words[0]}, 1
    while i < len(words):
        value = words[i + 1] if i + 1 < len(words) and not words[i + 1].startswith("--") else True
        flags[words[i]] = value
        i += 1 if value is True else 2
    return flags


def assignments(text, names):
    """{name: [every value given to it, in order]} of the uncommented ``NAME=value`` lines of a script."""
    found = {}
    for line in text.splitlines():
        match = re.match(r"\s*(\w+)=([^#]*)", line)
        if match and match.group(1) in names:
            found.setdefault(match.group(1), []).append(match.group(2).strip().strip("\"'"))
    return found


def read_protocols(checkout):
    """{method: {protocol: {"flags": ..., "caller": ...}}} of SCRIPTS."""
    out = {}
    for method, protocols in SCRIPTS.items():
        out[method] = {}
        for protocol, (script, caller) in protocols.items():
            text = _read(checkout, script)
            try:
                flags = train_flags(text)
            except ScriptError as e:
                raise ScriptError(f"{script}: {e}") from None
            found = {k: v[-1] for k, v in assignments(_read(checkout, caller), CALLER_SETTINGS).items()}
            found.update({k: " / ".join(v) for k, v in assignments(text, SCRIPT_SETTINGS).items()})
            out[method][protocol] = dict(script=script, caller=caller, flags=flags, settings=found)
    return out


def differences(protocols):
    """[(flag or setting, few-shot value, full-data value)] where the two differ (None: not given)."""
    few, full = protocols["few-shot"], protocols["full-data"]
    rows = [(f, few["flags"].get(f), full["flags"].get(f)) for f in sorted({*few["flags"], *full["flags"]})]
    rows += [(s, few["settings"].get(s), full["settings"].get(s)) for s in (*SCRIPT_SETTINGS, *CALLER_SETTINGS)]
    return [row for row in rows if row[1] != row[2]]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--idpg-authors", required=True, help="an extracted checkout of github:CSerxy/IDPG")
    parser.add_argument("--save-fixture", metavar="DIR", help="write DIR/script_flags.json")
    args = parser.parse_args(argv)
    try:
        protocols = read_protocols(args.idpg_authors)
    except ScriptError as e:
        print(f"idpg_authors_scripts: {e}", file=sys.stderr)
        return 2
    for method, pair in protocols.items():
        print(f"\n{method}: {pair['few-shot']['script']} (few-shot) against {pair['full-data']['script']}")
        for flag, few, full in differences(pair):
            print(f"  {flag:<28} few-shot {str(few):<40} full-data {full}")
    if args.save_fixture:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from idpg_authors_check import authors_commit

        out = Path(args.save_fixture) / "script_flags.json"
        provenance = dict(
            repo="github:CSerxy/IDPG", commit=authors_commit(args.idpg_authors),
            command="python3 scripts/idpg_authors_scripts.py --idpg-authors /tmp/idpg-authors "
            "--save-fixture tests/data/idpg_authors",
        )  # fmt: skip
        out.write_text(json.dumps(dict(provenance=provenance, protocols=protocols), indent=1) + "\n")
        print(f"\nfixture: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
