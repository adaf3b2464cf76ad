"""fairseq-idpg: IDPG, DPT, inducer-tuning and their baselines as a fairseq user dir.

fairseq 0.12.2 itself is installed by ``scripts/install.sh`` with ``--no-deps``: its
metadata asks for torchaudio, which pulls a torch that is not the one installed and
does not load. The fixes that fairseq 0.12.2 needs on Python 3.11 / torch >= 2.6 live in
``fairseq_idpg_compat.py``; ``fairseq_idpg_compat.pth`` makes every interpreter import it
at start-up. Both the regular and the editable (PEP 660) install put the .pth file into
site-packages, and ``pip uninstall`` removes it.
"""

import os
import shutil

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py
from setuptools.command.editable_wheel import editable_wheel

HERE = os.path.dirname(os.path.abspath(__file__))
PTH = "fairseq_idpg_compat.pth"


class build_py_with_pth(build_py):
    """Regular wheels: ship the .pth at the top of site-packages."""

    def run(self):
        super().run()
        self.copy_file(os.path.join(HERE, PTH), os.path.join(self.build_lib, PTH), preserve_mode=0)


class editable_wheel_with_pth(editable_wheel):
    """Editable wheels: setuptools writes its own .pth files here; add ours beside them."""

    def _install_namespaces(self, installation_dir, pth_prefix):
        super()._install_namespaces(installation_dir, pth_prefix)
        shutil.copy(os.path.join(HERE, PTH), installation_dir)


setup(
    name="fairseq-idpg",
    version="0.1.0",
    description="Instance-dependent prompt generation, decomposed prompt tuning and inducer-tuning for fairseq RoBERTa",
    packages=find_packages(include=["fairseq_idpg", "fairseq_idpg.*"]),
    py_modules=["fairseq_idpg_compat"],
    # tested: Python 3.11 with torch 2.13 (CI), Python 3.12 with torch 2.13 (scripts/test_python.sh);
    # fairseq_idpg_compat makes fairseq 0.12.2 run there (docs in that module)
    python_requires=">=3.11,<3.13",
    classifiers=["Programming Language :: Python :: 3.11", "Programming Language :: Python :: 3.12"],
    install_requires=[
        "torch>=2.4",  # the oldest release the compatibility fixes and tests are written for
        "numpy",
        "scipy",
        "sentencepiece",
        "sacrebleu>=1.4.12",
        "tokenizers>=0.13",  # WordPiece for BERT-derived encoders (the offline stand-in)
        "safetensors",
        "filelock",  # one build of the stand-in when runs start at once
        "pyyaml",  # sweep specifications, the published tables (fairseq_idpg/published/*.yaml)
        "submitit",  # sweeps on Slurm (fairseq_idpg/sweep.py --executor slurm)
        "pandas",  # python -m fairseq_idpg.results
        "matplotlib",  # its plots, and scripts/plot_rank_probe.py
        "fastapi",  # python -m fairseq_idpg.serve: the HTTP service's ASGI framework
        "uvicorn",  # ... and its server
        "tensorboardX",  # fairseq's --tensorboard-logdir (without it every fairseq command asks for it)
    ],
    package_data={"fairseq_idpg": ["published/*.yaml", "run/settings_before_hashing.json"]},
    # peft: scripts/check_gpu.sh times our LoRA / prompt tuning against Hugging Face PEFT's.
    # interop: the cross-checks against PEFT and AdapterHub (tests/test_interop.py, scripts/export_peft.py),
    # pinned to versions that install together from the package index (adapters 1.3.0 needs transformers
    # ~=4.57.6); scripts/install.sh installs both extras
    extras_require={
        "test": ["pytest", "pytest-xdist>=3.8", "transformers", "peft", "ruff==0.17.6", "httpx"],
        "interop": ["transformers==4.57.6", "peft==0.21.2", "adapters==1.3.0"],
    },
    cmdclass={"build_py": build_py_with_pth, "editable_wheel": editable_wheel_with_pth},
)
