"""Export mtpx-trained MTP modules to a layout that serving engines read (mtpx.hf.export).

    python tools/export_checkpoint.py SRC OUT --layout qwen3_next|deepseek_v3|draft
                                      [--num-modules N] [--dtype bfloat16] [--target-only]

  --layout qwen3_next   OUT is a Hugging Face folder with Qwen3-Next's `mtp.*` (one shared fc and
                        norms: modules must share them, or use --num-modules 1)
  --layout deepseek_v3  OUT is a Hugging Face folder with modules at model.layers.{L+k}
                        (modules trained with model.mtp_style=deepseek_v3)
  --layout draft        OUT is one .safetensors file of MTP modules, attached to a standard
                        target with spec.draft_path / LLM(..., draft_path=OUT)
  --target-only         OUT is a Hugging Face folder of the target alone (no --layout needed)

SRC is any folder mtpx loads (an mtpx checkpoint such as checkpoints/demo, or a Hugging Face
folder). Exit status: 0 on success, 1 when the export fails (one-line message), 2 for bad
arguments.
"""
import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

LAYOUTS = ("qwen3_next", "deepseek_v3", "draft")
DTYPES = ("float32", "bfloat16", "float16", "float64")


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, no usage block
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def main(argv=None) -> int:
    ap = _Parser(prog="export_checkpoint.py", description=__doc__,
                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("src", help="checkpoint folder to read")
    ap.add_argument("out", help="folder to write, or the .safetensors file for --layout draft")
    ap.add_argument("--layout", choices=LAYOUTS, help="MTP weight layout of the export")
    ap.add_argument("--num-modules", type=int, default=None, metavar="N",
                    help="export MTP modules 0..N-1 (default: all)")
    ap.add_argument("--dtype", choices=DTYPES, default=None,
                    help="dtype of the written weights (default: the source's)")
    ap.add_argument("--target-only", action="store_true", help="write the target without MTP modules")
    ap.add_argument("--draft-path", default=None,
                    help="a draft file of MTP modules to attach to SRC before exporting")
    ap.add_argument("--allow-pickle", action="store_true",
                    help="read a pickle-only SRC with torch.load(weights_only=True)")
    args = ap.parse_args(argv)
    if args.layout is None and not args.target_only:
        ap.error("--layout is required (qwen3_next, deepseek_v3 or draft) unless --target-only")

    # torch loads here, after the argument check
    from mtpx.hf.export import DTYPES as TORCH_DTYPES, export_checkpoint

    try:
        out = export_checkpoint(args.src, args.out, args.layout, num_modules=args.num_modules,
                                dtype=TORCH_DTYPES[args.dtype] if args.dtype else None,
                                target_only=args.target_only, draft_path=args.draft_path,
                                allow_pickle=args.allow_pickle)
    except (OSError, ValueError) as err:  # missing files, CheckpointError, ExportError, config errors
        msg = " ".join(str(err).split())
        print(f"export_checkpoint.py: error: {msg}", file=sys.stderr)
        return 1
    what = "target only" if args.target_only else f"{args.layout} layout"
    print(f"wrote {out} ({what})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
