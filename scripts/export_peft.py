#!/usr/bin/env python3
"""Write a trained method as a Hugging Face PEFT adapter folder (LoRA, DoRA, PiSSA, VeRA) or an AdapterHub
``adapters`` folder (the Houlsby adapter, Compacter, the MAM adapter), for the Hugging Face model of its
backbone; refuse in one line what the format cannot hold exactly. docs/using.md, "PEFT and adapters".

    python3 scripts/export_peft.py checkpoints/standin/SST-2/lora/lr2e-4.seed1.0123abcd exported/lora
    python3 scripts/export_peft.py --format adapters checkpoints/standin/SST-2/compacter/... exported/compacter

PEFT: OUT gets adapter_config.json and adapter_model.safetensors (the classification head as modules_to_save).
adapters: OUT gets what ``save_adapter(OUT, NAME, with_head=True)`` writes (adapter_config.json,
pytorch_adapter.bin, head_config.json, pytorch_model_head.bin: the head as a classification head of
``BertAdapterModel`` / ``RobertaAdapterModel``); load it with ``AutoAdapterModel.from_pretrained(BASE)`` and
``model.load_adapter(OUT, set_active=True)``.
The Hugging Face model: for the offline stand-in (all-MiniLM-L6-v2 converted, not RoBERTa) the original
BERT folder it was converted from; for a RoBERTa backbone, ``RobertaModel`` converted from it into
OUT/base_model (or, with --base-model NAME, the model of that name, e.g. FacebookAI/roberta-large, whose
weights you vouch are the backbone's). The adapter names its base portably, never by a local path
(base_model_name_or_path / model_name: sentence-transformers/all-MiniLM-L6-v2 for the stand-in,
FacebookAI/roberta-large for models/roberta.large, else the model folder's name, or --base-model NAME), and
OUT/fairseq_backbone.json records that name and the sha256 of the backbone's weights, which import_peft.py checks.
"""

import argparse
import os
import sys

from fairseq_idpg.errors import ConfigError, one_line_errors, refuse
from fairseq_idpg.methods import EXPORT_FORMATS as FORMATS
from fairseq_idpg.methods import methods_where

# the records each format holds exactly (Method.exports_to), for --help
EXPORTED = {fmt: methods_where(exports_to=lambda formats, fmt=fmt: fmt in formats) for fmt in FORMATS}


def main(argv=None):
    parser = one_line_errors(argparse.ArgumentParser(prog="export_peft.py", description=__doc__.split("\n\n")[0]))
    parser.add_argument("run", metavar="RUN_FOLDER", help="a run folder (its checkpoint_best.pt) or a checkpoint")
    parser.add_argument("out", metavar="OUT", help="the adapter folder to write (new or empty)")
    parser.add_argument(
        "--format",
        choices=FORMATS,
        default="peft",
        help="; ".join(f"{fmt} ({', '.join(names)})" for fmt, names in EXPORTED.items()) + " (default: peft)",
    )
    parser.add_argument("--name", default=None, help="adapters: the adapter's name (default: the method's)")
    parser.add_argument("--backbone", metavar="PATH", help="where the run's backbone is now (default: as recorded)")
    parser.add_argument(
        "--base-model",
        metavar="NAME",
        help="the Hugging Face model to name as the base (RoBERTa: instead of writing OUT/base_model)",
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="write into OUT although it has files (those of the same names replaced)",
    )
    args = parser.parse_args(argv)
    if args.name is not None and (not args.name or "." in args.name):
        parser.error(f"--name {args.name!r}: an adapters name is a module name (no dots, not empty)")
    try:
        from fairseq_idpg.files import check_output_folder
        from fairseq_idpg.interop.trained import checkpoint_file

        check_output_folder(args.out, [checkpoint_file(args.run), args.backbone], args.overwrite)
        return export(args)
    except ConfigError as e:
        return refuse(parser.prog, e)


def export(args):
    import torch

    from fairseq_idpg.files import check_output_folder, staged_folder
    from fairseq_idpg.interop import adapters_format, peft_format
    from fairseq_idpg.interop.base_model import backbone_name, write_backbone_file
    from fairseq_idpg.interop.hf_backbone import hf_backbone_for
    from fairseq_idpg.interop.trained import checkpoint_file, load_trained

    torch.set_num_threads(min(torch.get_num_threads(), 4))
    run = load_trained(args.run, args.backbone)
    check_output_folder(args.out, [checkpoint_file(args.run), run.backbone], args.overwrite)
    if args.format == "adapters":
        adapters_format.export_plan(run)  # before anything is written
    else:
        peft_format.check_exportable(run)
    with staged_folder(args.out) as stage:  # made whole beside OUT, then renamed into place
        hf = hf_backbone_for(run.backbone)
        name = args.base_model or backbone_name(run.backbone, hf)
        if hf.model_type == "roberta":
            base = args.base_model or os.path.join(os.path.abspath(args.out), "base_model")
            written = None if args.base_model else os.path.join(stage, "base_model")
            hf = hf_backbone_for(run.backbone, written)._replace(path=base)
        if args.format == "adapters":
            adapter = args.name or peft_format.describe(run.options)
            config = adapters_format.export_adapters(run, hf, stage, name, adapter)
            kind = config.get("architecture") or ("Compacter" if config.get("phm_layer") else "bottleneck adapter")
            said = f"adapters {kind} {adapter!r}"
        else:
            config = peft_format.export_peft(run, hf, stage, name)
            said = f"PEFT {config['peft_type']}"
        write_backbone_file(stage, run.backbone, name)
    print(f"wrote {args.out}: {said} for {name} ({hf.model_type}, here: {hf.path})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
