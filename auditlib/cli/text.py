"""``python -m auditlib audit --text-model ...``: a text model's audit, written as result.json
and recovered.txt (private and recovered sequences side by side), the verdict on stdout."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from auditlib.attacks.text_names import TEXT_ATTACK_NAMES
from auditlib.config import parse_key_values
from auditlib.errors import AuditInputError
from auditlib.output_folder import check_output_folder

# Image options a text audit cannot take: refused rather than ignored.
_IMAGE_ONLY = ("images", "samples", "observed", "model", "weights", "trusted_model", "labels_csv")


def text_spec_from_args(args: argparse.Namespace):
    from auditlib.engine.device import chosen_device
    from auditlib.engine.text_audit import TextAuditSpec

    given = [f"--{name.replace('_', '-')}" for name in _IMAGE_ONLY if getattr(args, name, None)]
    if given:
        raise AuditInputError(
            f"{', '.join(given)} describe an image audit; a text audit takes none"
        )
    attack = args.attack or "dager"
    if attack == "all":
        attacks = ("dager", "tiger", "tag", "lamp") if not args.lora_rank else ("utr", "dager")
    elif attack not in TEXT_ATTACK_NAMES:
        raise AuditInputError(
            f"{attack} attacks image models; a text model's attacks: {', '.join(TEXT_ATTACK_NAMES)}"
        )
    else:
        attacks = (attack,)
    return TextAuditSpec(
        model=args.text_model or "gpt2",
        lora_rank=args.lora_rank,
        text_file=args.text,
        batch_size=args.batch_size or 16,
        length=args.tokens,
        seed=args.seed,
        algorithm=args.scenario,
        local_steps=args.local_steps,
        learning_rate=args.local_lr if args.scenario == "fedavg" else 1e-4,
        attacks=attacks,
        defense=args.defense,
        defense_params=parse_key_values(args.defense_param, "defense parameter"),
        preset="paper" if args.preset == "paper" else "strongest",
        iterations=args.iterations,
        device=chosen_device(args.device),
    )


def text_audit_command(args: argparse.Namespace) -> int:
    from auditlib.cli.audit import AUTO_DEVICE_WORDS
    from auditlib.engine.text_audit import run_text_audit
    from auditlib.text_result_json import text_result_dict

    spec = text_spec_from_args(args)
    out = Path(args.out)
    check_output_folder(out)
    if args.device != spec.device:  # auto chose: say which, and how to choose otherwise
        print(f"device: {spec.device} (--device auto{AUTO_DEVICE_WORDS[spec.device]})")

    def show(event) -> None:
        if event.stage == "progress":
            return
        print(f"[{event.stage}] {event.attack} {event.note}".replace("  ", " ").strip(), flush=True)

    result = run_text_audit(spec, show)
    out.mkdir(parents=True, exist_ok=True)
    (out / "result.json").write_text(json.dumps(text_result_dict(result), indent=2) + "\n")
    lines = []
    for run in result.runs:
        lines.append(f"== {run.attack}: ROUGE-1 {run.scores.rouge1:.3f}, ROUGE-2 "
                     f"{run.scores.rouge2:.3f}, {run.scores.exact} of {len(result.private_texts)} exact")  # fmt: skip
        for i, s in enumerate(run.scores.per_sequence):
            got = run.recovered.texts[s.matched] if s.matched is not None else "(none)"
            lines += [f"private   {i:>3}: {result.private_texts[i]}", f"recovered {i:>3}: {got}"]
    (out / "recovered.txt").write_text("\n".join(lines) + "\n")
    verdict = result.verdict
    print(f"verdict: {verdict.headline}")
    print(verdict.sentence)
    for run in result.runs + result.controls:
        kind = "control" if run in result.controls else "attack"
        print(
            f"{kind} {run.attack}: ROUGE-1 {run.scores.rouge1:.3f} ROUGE-2 {run.scores.rouge2:.3f} "
            f"ROUGE-L {run.scores.rougeL:.3f}, exact {run.scores.exact}, "
            f"{run.recovered.seconds:.1f} s"
        )
    if result.privacy.get("epsilon") is not None:
        print(f"epsilon {result.privacy['epsilon']:.4g} (delta {result.privacy.get('delta')})")
    print(f"wrote {out / 'result.json'} and {out / 'recovered.txt'}")
    return 0
