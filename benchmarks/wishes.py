"""What the standing-wishes section costs on LoCoMo prompts, where almost nobody gives standing instructions.

Issue 33 asks that the always-on `standing_wishes` section cost at most 150 tokens on average on the
LoCoMo dev prompts. Each conversation is imported as `familiar eval locomo` imports it
(`evaluation.prepare_conversation`, no embedder, no facts), the `wishes` asset materialized in process
(the detector over every turn), and every question assembled as a reply prompt with the default layers:
the speaker is whoever spoke last, as in the eval. It prints, per conversation, the wishes found and the
section's tokens, then the mean and max over every question's prompt and, as a harder bound, over every
(conversation, speaker) pair; the last line is JSON. The data file is read where it lies, never copied.

    uv run python benchmarks/wishes.py --data path/to/locomo-dev.json [--show]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.quick import parse_args as parse_with_quick  # noqa: E402

import dagster as dg  # noqa: E402

from familiar_bot.app.eval import locomo  # noqa: E402
from familiar_bot.app.eval.evaluation import EVAL_CHANNEL, prepare_conversation  # noqa: E402
from familiar_bot.prompt.assembly import build_assembler  # noqa: E402
from familiar_bot.prompt.types import AssemblyContext  # noqa: E402
from familiar_bot.prompt.layers.standing_wishes import one_per_point, render  # noqa: E402
from familiar_pipeline.config import load_config  # noqa: E402
from familiar_pipeline.defs.jobs import materialize_in_process  # noqa: E402
from familiar_pipeline.projectors.wishes.tables import wishes_of  # noqa: E402
from familiar_pipeline.storage.paths import FamiliarPaths  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", help=f"the LoCoMo file (else ${locomo.DATA_ENV})")
    parser.add_argument("--show", action="store_true", help="print every wish found (the people's words)")
    parser.add_argument("--conversations", type=int, default=None, help="the file's first N conversations (default: all)")
    args = parse_with_quick(parser, conversations=1)
    data = locomo.locate_or_exit(args.data)
    samples = locomo.load(data)[:args.conversations]
    per_question: list[int] = []
    per_speaker: list[int] = []
    found_total = 0
    with tempfile.TemporaryDirectory() as tmp, dg.instance_for_test() as instance:
        root = Path(tmp)
        for index, sample in enumerate(samples):
            conv = prepare_conversation(sample, index, root, embedder="off", model_path=None, instance=instance)
            paths = FamiliarPaths.for_id(conv.familiar_id, root)
            toml = paths.character_toml.read_text()
            paths.character_toml.write_text(re.sub(r"projectors = \[", 'projectors = ["standing_wish", ', toml)
                                            .replace('"standing_wish", ]', '"standing_wish"]'))
            materialize_in_process(["wishes"], instance=instance, data_root=root, partition_key=conv.familiar_id,
                                   log_level="WARNING")
            assembler = build_assembler(paths, load_config(conv.familiar_id, root=root, env={}))
            memory = assembler.memory
            memory.refresh()
            speakers = sorted({locomo.speaker_key(t.speaker) for t in locomo.turns_of(sample)})
            found = {key: wishes_of(memory.snapshot, key, None) for key in speakers}
            found_total += sum(len(v) for v in found.values())
            tokens = []
            for q in conv.questions:
                prompt = assembler.assemble(AssemblyContext(conv.familiar_id, EVAL_CHANNEL, None, "text", q.text))
                tokens.append(int(prompt.debug["wishes"]["tokens"]))
            per_question += tokens
            for key in speakers:  # the section as each speaker would get it
                wishes = [w for w in found[key] if w.current]
                text, _ = render(key, one_per_point(wishes), memory.config.budget_for("text").wishes_tokens,
                                 memory.config.tz)
                per_speaker.append(len(text) and -(-len(text) // 4))
            print(f"{conv.sample_id}: {sum(len(v) for v in found.values())} wish(es) "
                  f"({', '.join(f'{k}: {len(v)}' for k, v in found.items())}); section mean "
                  f"{sum(tokens) / max(len(tokens), 1):.1f} tokens over {len(tokens)} question prompts")
            if args.show:
                for key, wishes in found.items():
                    for w in wishes:
                        print(f"    {key} [{w.point}]{'' if w.current else ' (retired)'} {w.text}")
            memory.close()
    result = {"conversations": len(samples), "questions": len(per_question), "wishes_found": found_total,
              "section_tokens_mean": round(sum(per_question) / max(len(per_question), 1), 2),
              "section_tokens_max": max(per_question, default=0),
              "per_speaker_tokens_mean": round(sum(per_speaker) / max(len(per_speaker), 1), 2),
              "per_speaker_tokens_max": max(per_speaker, default=0)}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
