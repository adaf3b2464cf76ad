"""Interoperability with Hugging Face PEFT and AdapterHub's ``adapters`` (docs/using.md, "PEFT and adapters").

- ``hf_backbone``: the Hugging Face model a fairseq backbone corresponds to (the original BERT of the
  offline stand-in, or a fairseq RoBERTa converted to ``RobertaModel``), and the names of its tensors;
- ``trained``: a trained run (run folder or checkpoint) rebuilt as our model, and writing a compact
  checkpoint for a method record from tensors;
- ``peft_format``: LoRA, prompt tuning and prefix tuning <-> PEFT adapter folders;
- ``adapters_format``: the Houlsby adapter, Compacter and the MAM adapter <-> ``adapters`` folders;
- ``merge``: LoRA and BitFit folded into the frozen weights, a plain fairseq ``roberta`` checkpoint.

What each format cannot express (and is therefore refused in one line rather than exported approximately)
is listed in docs/using.md; each refusal names it.
"""
