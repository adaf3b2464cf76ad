"""Checkpoint conversion: Hugging Face BERT/RoBERTa -> fairseq RoBERTa, and tiny random models.

- ``hf_to_fairseq``: ``convert`` (and the CLI ``scripts/convert_hf_to_fairseq.py``) writes a
  fairseq RoBERTa model folder (``model.pt``, ``dict.txt``, tokenizer files) from a Hugging Face
  checkpoint folder; ``verify`` compares the written folder with ``transformers``.
- ``tiny``: ``write_tiny_roberta`` writes a randomly initialised fairseq RoBERTa folder in the
  same format, for tests.

Nothing here is imported by ``fairseq_idpg/__init__.py``: conversion is a tool, not a plugin.
"""
