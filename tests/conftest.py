"""Fixtures shared by the test files."""
from pathlib import Path

import pytest

SHARED = Path(__file__).resolve().parents[2] / "shared"  # ../shared next to the checkout (CI has it too)


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The real task files (``../shared/data``, see its README.md)."""
    if not (SHARED / "data").is_dir():
        pytest.skip(f"{SHARED / 'data'} not found (the real task data lives beside the checkout)")
    return SHARED / "data"


@pytest.fixture(scope="session")
def roberta_bpe() -> Path:
    """RoBERTa's GPT-2 BPE files (``../shared/roberta_bpe``: encoder.json, vocab.bpe, dict.txt)."""
    if not (SHARED / "roberta_bpe" / "dict.txt").is_file():
        pytest.skip(f"{SHARED / 'roberta_bpe'} not found")
    return SHARED / "roberta_bpe"
