"""Interoperability with Hugging Face PEFT and AdapterHub's ``adapters`` (docs/using.md, "PEFT and adapters").

- ``hf_backbone``: the Hugging Face model a fairseq backbone corresponds to (the original BERT of the
  offline stand-in, or a fairseq RoBERTa converted to ``RobertaModel``), and the names of its tensors;
- ``trained``: a trained run (run folder or checkpoint) rebuilt as our model, and writing a compact
  checkpoint for a method record from tensors;
- ``peft_format``: LoRA, prompt tuning and prefix tuning <-> PEFT adapter folders; ``peft_config``: a PEFT
  ``LoraConfig`` field by field on import (mapped exactly, harmless, or refused naming the field);
- ``base_model``: the portable name an export gives its base model, and the check of an import's base model
  against ``--backbone`` (a weights digest, a name, or a local folder's weights);
- ``adapters_format``: the Houlsby adapter, Compacter and the MAM adapter <-> ``adapters`` folders;
- ``merge``: LoRA and BitFit folded into the frozen weights, a plain fairseq ``roberta`` checkpoint.

What each format cannot express (and is therefore refused in one line rather than exported approximately)
is listed in docs/using.md; each refusal names it.
"""
