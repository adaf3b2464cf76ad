"""Checkpoint conversion: Hugging Face BERT/RoBERTa -> fairseq RoBERTa, and tiny random models.

One module per role (``scripts/convert_hf_to_fairseq.py`` runs ``cli.main``; docs/standin.md
describes the result):

- ``source``: reading the Hugging Face folder (``inspect_source``, ``load_hf_state_dict``,
  ``standin_source_dir``);
- ``vocab``: the fairseq dictionary and tokenizer files (WordPiece for BERT, GPT-2 BPE for RoBERTa);
- ``atomic``: writing each output file under a temporary name and renaming it;
- ``weights``: the weight mapping, the fairseq model it fills and the checkpoint dict;
- ``convert``: ``convert`` writes a fairseq RoBERTa model folder (``model.pt``, ``dict.txt``,
  tokenizer files) from a Hugging Face checkpoint folder;
- ``verify``: ``verify`` compares the written folder with ``transformers`` on GLUE sentences;
- ``cli``: the command line;
- ``errors``: ``ConversionError`` (bad input) and ``VerificationError``;
- ``tiny``: ``write_tiny_roberta`` writes a randomly initialised fairseq RoBERTa folder in the
  same format, for tests.

Nothing here is imported by ``fairseq_idpg/__init__.py``: conversion is a tool, not a plugin.
"""
