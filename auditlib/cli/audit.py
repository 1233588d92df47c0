"""``python -m auditlib audit``: one audit (and its undefended control first), written as
result.json and reconstruction.png, with the verdict on stdout."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from auditlib.attacks.text_names import TEXT_ATTACK_NAMES
from auditlib.cli.arguments import KNOWS_DEFENSE, model_spec_of
from auditlib.cli.observed import assumption_lines, observed_bundle
from auditlib.engine.preflight import check_model_trains, estimate_time
from auditlib.errors import AuditInputError
from auditlib.file_digest import sha256_file
from auditlib.output_folder import check_output_folder

if TYPE_CHECKING:
    from auditlib.metrics.verdict import Verdict
    from auditlib.result import AuditSummary
    from auditlib.spec import RunSpec


def spec_from_args(args: argparse.Namespace):
    from auditlib.attacks import ALL_ATTACKS, default_iterations
    from auditlib.attacks.restarts import AUDIT_PRESET
    from auditlib.client.protocol import ClientProtocol
    from auditlib.config import parse_key_values
    from auditlib.engine.device import chosen_device
    from auditlib.spec import (
        Budget,
        ComponentSpec,
        DataSpec,
        ModelRef,
        ObservedRef,
        RunSpec,
        ScenarioSpec,
    )

    if args.attack in TEXT_ATTACK_NAMES:
        raise AuditInputError(f"{args.attack} attacks text models: give --text-model")
    args.attack = args.attack or "dlg"
    bundle = observed_bundle(args)  # None without --observed; refuses a clashing option
    if bundle is not None:
        for line in assumption_lines(bundle):  # what the audit takes on trust, said first
            print(line)
    if bundle is None and not args.model:
        raise AuditInputError("give --model (or --observed DIR, whose training.json names it)")
    if bundle is None and not (args.images or args.samples):
        raise AuditInputError(
            "give the private images: --images DIR or --samples NAME (only an observed update, "
            "--observed DIR, is audited without them)"
        )
    if args.trusted_model and not args.i_trust_this_file:
        raise AuditInputError(
            "--trusted-model loads an archive that can run code; add --i-trust-this-file to accept that"
        )
    if args.trusted_model and args.weights:
        raise AuditInputError("give either --weights or --trusted-model, not both")
    model_spec = bundle.model_spec if bundle is not None else model_spec_of(args)
    own_file = own_class_file(model_spec, args.i_trust_this_file)
    weights_file = args.weights or args.trusted_model
    hashed = weights_file or own_file  # an own class's results change with its file
    model = ModelRef(
        spec=model_spec,
        weights=args.weights,
        trusted_archive=args.trusted_model,
        content_sha256=sha256_file(hashed) if hashed else None,
    )
    if bundle is not None:  # the client's images, where given, are all it trained on
        args.batch_size = bundle.training.num_examples
        args.normalization = bundle.normalization
    if args.batch_size is None and args.samples:
        args.batch_size = 1
    has_images = bool(args.images or args.samples)
    data = DataSpec(
        source="folder" if args.images else "samples" if args.samples else "none",
        location=args.images or args.samples or "",
        batch_size=args.batch_size if has_images else None,
        offset=args.offset,
        labels_csv=args.labels_csv,
        normalization=args.normalization,
    )
    protocol = (
        bundle.protocol
        if bundle is not None
        else ClientProtocol(
            algorithm=args.scenario,
            local_steps=args.local_steps,
            local_epochs=args.local_epochs,
            local_lr=args.local_lr,
            local_batch_size=args.local_batch_size,
            shared=args.share,
            batchnorm_mode=args.bn_mode,
            optimizer=args.optimizer,
            momentum=args.momentum,
            weight_decay=args.weight_decay,
            shuffle=args.shuffle,
        )
    )
    scenario = ScenarioSpec(
        protocol=protocol,
        labels_known=args.labels_known,
        attacker_knows_defense=KNOWS_DEFENSE[args.attacker_knows_defense],
        pretrain_rounds=args.pretrain_rounds,
        pretrain_data=args.pretrain_data,
        server=args.server,
        secure_aggregation=args.secure_aggregation,
        observed=None
        if bundle is None
        else ObservedRef(bundle.location, content_sha256=bundle.content_sha256),
    )
    preset = None if args.preset in (None, "none") else args.preset
    if args.attack == ALL_ATTACKS:
        if preset not in (None, AUDIT_PRESET):
            raise AuditInputError(
                f"--attack {ALL_ATTACKS} runs every attack at its audit preset; "
                f"drop --preset {args.preset}"
            )
        preset = None
    iterations = args.iterations or default_iterations(args.attack, preset)
    return RunSpec(
        model=model,
        data=data,
        scenario=scenario,
        attack=ComponentSpec.of(
            args.attack, parse_key_values(args.attack_param, "attack parameter"), preset
        ),
        defense=ComponentSpec.of(
            args.defense, parse_key_values(args.defense_param, "defense parameter")
        ),
        budget=Budget(iterations=iterations, max_seconds=args.time_budget),
        seed=args.seed,
        device=chosen_device(args.device),
    )


def own_class_file(model_spec, trusted: bool) -> str | None:
    """The file of a model class of the user's own code (None for any other model); refused
    without the trust flag, since building it runs that file."""
    from auditlib.models import own_code

    if model_spec.info.source != own_code.SOURCE:
        return None
    file, _ = own_code.parts(model_spec.architecture)
    if not trusted:
        raise AuditInputError(
            f"the model {model_spec.architecture} "
            + own_code.REFUSAL.format(file=file).replace(
                " (the dashboard builds it only where an admin allows trusted code)", ""
            )
        )
    return file


def write_outputs(result, out: Path) -> None:
    """The run's result folder, replaced whole (``auditlib.output_folder``): the earlier
    complete result or this one, whenever the command is stopped."""
    from auditlib.output_folder import publish

    publish(out, lambda folder: write_result_files(result, folder))


def write_result_files(result, out: Path) -> None:
    """result.json and reconstruction.png: the originals over the matched reconstructions,
    or without private images each attack's reconstructions, one row per attack."""
    from auditlib.grids import image_grid, save_comparison_png
    from auditlib.result_json import summary_json

    out.mkdir(parents=True, exist_ok=True)
    (out / "result.json").write_text(summary_json(result.summary.to_json()))
    png = out / "reconstruction.png"
    rows = [images for _, images in result.by_attack]
    if not rows:
        save_comparison_png(result.originals, result.reconstruction, png)
    elif len({len(r) for r in rows}) == 1:
        image_grid(rows).save(png, format="PNG")
    else:  # attacks that picked different counts: one file each
        image_grid(rows[:1]).save(png, format="PNG")
        for k, images in enumerate(rows[1:], start=2):
            image_grid([images]).save(out / f"reconstruction_{k}.png", format="PNG")


def _progress_bar(total: int):
    if not sys.stderr.isatty():
        return None
    from tqdm import tqdm

    return tqdm(total=total, unit="step", dynamic_ncols=True, file=sys.stderr)


# Why ``--device auto`` chose the device it did, and the way to the other.
AUTO_DEVICE_WORDS = {
    "cuda": ": this machine has a CUDA device; --device cpu keeps the run on the CPU",
    "cpu": ": no CUDA device here",
}


def audit_command(args: argparse.Namespace) -> int:
    from auditlib.defenses import build_defense
    from auditlib.engine.attack_phase import plan_attacks
    from auditlib.engine.audit import run_audit
    from auditlib.engine.isolation import run_isolated, runs_own_code
    from auditlib.metrics import LPIPS_NETS

    if args.text_model or args.text:
        from auditlib.cli.text import text_audit_command

        return text_audit_command(args)
    spec = spec_from_args(args)
    nets = (
        ()
        if args.lpips_nets.strip().lower() == "none"
        else tuple(n.strip() for n in args.lpips_nets.split(","))
    )
    unknown = [n for n in nets if n not in LPIPS_NETS]
    if unknown:
        raise AuditInputError(
            f"unknown LPIPS backbone {', '.join(unknown)}; expected {', '.join(LPIPS_NETS)} or none"
        )
    out = Path(args.out)
    check_output_folder(out)  # before any time is spent: the result replaces it whole
    progress = _Progress()
    runs_code = runs_own_code(spec)
    runner = run_isolated if runs_code else run_audit
    # Refuse bad attack or defense parameters before the control spends any time.
    plan_attacks(spec.attack, spec.budget.iterations, server=spec.scenario.server)
    build_defense(spec.defense.name, spec.defense.params_dict())
    check_model_trains(spec)
    specs = None
    if args.updates is not None:  # refused before any time is spent
        from auditlib.engine.sample import update_specs

        specs = update_specs(spec, args.updates)
    # A few real steps of the run's attacks, measured before the run (a folder's images
    # are read for it: its batch is counted there), and of its control's, which runs first.
    if not runs_code:  # said once the first run has its data (a bad input: one line)
        control = None if args.no_control else spec.control()
        progress.first_note = estimate_note(spec, control, None if specs is None else len(specs))
    if args.device != spec.device:  # auto chose: say which, and how to choose otherwise
        print(f"device: {spec.device} (--device auto{AUTO_DEVICE_WORDS[spec.device]})")
    if specs is not None:
        from auditlib.cli.sample import audit_sample

        return audit_sample(
            spec,
            specs,
            args,
            lambda s: _judged_run(s, runner, nets, args, progress),
            lambda specs: _judged_together(specs, nets, args, progress),
        )
    result = _judged_run(spec, runner, nets, args, progress)
    write_outputs(result, out)
    _print_run(spec, result, out)
    return 0


def estimate_note(spec: RunSpec, control: RunSpec | None, updates: int | None) -> str | None:
    """The ``estimate:`` lines: the control's first where it runs (the same attacks without
    the defense: another model or release can step at another pace, so measured too), then
    the run's; for a sample, of one update, said so. None where the run is not estimated
    (a model class of the user's own code runs in a process of its own)."""
    run = estimate_time(spec)
    if run is None:
        return None
    lines = [run.words()]
    first = None if control is None else estimate_time(control)
    if first is not None:
        lines = [f"the control first: {first.words()}", f"then the run: {run.words()}"]
    note = "\n".join(f"estimate: {line}" for line in lines)
    if updates is not None and updates > 1:
        note = (
            f"estimate: for one update of the {updates} (each is a full audit; they advance "
            f"together where they can, not measured so):\n{note}"
        )
    return note


class _Progress:
    """A progress bar on a terminal (none otherwise), a new one for each run: the control,
    the run, each update of a sample."""

    def __init__(self) -> None:
        self.bar = None
        self.first_note: str | None = None  # printed at the first event, on stderr

    def __call__(self, event) -> None:
        if self.first_note is not None:
            print(self.first_note, file=sys.stderr)
            self.first_note = None
        if self.bar is None or event.step < self.bar.n or event.total_steps != self.bar.total:
            self.close()
            self.bar = _progress_bar(event.total_steps)
        if self.bar is not None:
            self.bar.n = event.step
            loss = next(iter(event.losses.values()), None)
            if loss is not None:
                self.bar.set_postfix(loss=f"{loss:.3g}", refresh=False)
            self.bar.refresh()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def _judged_run(spec, runner, nets, args, progress: _Progress):
    """One audit as the command line runs it: its control first where it has a defense,
    then the run, judged beside the control; the result with its verdict and control."""

    control_result = None
    control = None if args.no_control else spec.control()
    try:
        if control is not None:  # the positive control first: the defended verdict needs it
            print("control: the same attack without the defense", file=sys.stderr)
            control_result = runner(control, on_event=progress, lpips_nets=())
            progress.close()
        result = runner(spec, on_event=progress, lpips_nets=nets)
    finally:
        progress.close()
    return _judged(spec, result, control_result)


def _judged_together(specs, nets, args, progress: _Progress):
    """A sample's updates as the command line runs them, their attacks together
    (``engine.together``): every update's control first where they have a defense, then the
    runs, each judged beside its own control; the results, and how each attack ran."""
    from auditlib.engine.together import audit_together

    def shown(update: int, event) -> None:  # one bar: the updates advance in lockstep
        if update == 0:
            progress(event)

    controls = [None if args.no_control else s.control() for s in specs]
    control_results = [None] * len(specs)
    notes = []
    try:
        if controls[0] is not None:
            print("controls: the same attack without the defense", file=sys.stderr)
            control_results, control_notes = audit_together(controls, on_event=shown, lpips_nets=())
            notes += [f"control, {n.words}" for n in control_notes]
            progress.close()
        results, run_notes = audit_together(specs, on_event=shown, lpips_nets=nets)
        notes += [n.words for n in run_notes]
    finally:
        progress.close()
    judged = [_judged(s, r, c) for s, r, c in zip(specs, results, control_results, strict=True)]
    return judged, notes


def _judged(spec, result, control_result):
    """The run's result with its verdict judged beside its control, and the control's
    record."""
    import dataclasses

    from auditlib.result import ControlRecord

    verdict = with_control(result.summary, control_result, defended=spec.control() is not None)
    control_record = None
    if control_result is not None:
        control_record = ControlRecord(
            spec_id=control_result.summary.spec_id,
            metrics=control_result.summary.metrics,
            stop_reason=control_result.summary.stop_reason,
            timing=control_result.summary.timing,
        )
    summary = dataclasses.replace(result.summary, verdict=verdict, control=control_record)
    return dataclasses.replace(result, summary=summary)


def _print_run(spec, result, out: Path) -> None:
    from auditlib.metrics.catalogue import CATALOGUE

    summary = result.summary
    verdict = summary.verdict
    metrics, timing = summary.metrics, summary.timing
    psnr, ssim, accuracy = (CATALOGUE[k] for k in ("psnr", "ssim", "label_accuracy"))
    steps = f"{timing.iterations} steps in {timing.seconds:.1f} s ({summary.stop_reason})"
    if metrics is None:  # no private images: the attacker's own losses, no score
        losses = ", ".join(
            f"{a.label} {a.attack_loss:.4g}" for a in summary.attacks if a.attack_loss is not None
        )
        from auditlib.report.unscored_words import NO_PICK, rows_caption

        shown = [a.label for a in summary.attacks if not a.skipped]
        print(
            f"{spec.attack.name} on the observed update: not scored ({summary.unscored}); "
            f"each attack's own loss {losses or 'not recorded'}, {steps}; wrote "
            f"{out / 'result.json'} and {out / 'reconstruction.png'}\n"
            f"reconstruction.png: {rows_caption(shown)}\n{NO_PICK}"
        )
    else:
        print(
            f"{spec.attack.name} vs {spec.defense.name}: PSNR {psnr.text(metrics.psnr_mean)} "
            f"dB, SSIM {ssim.text(metrics.ssim_mean)}, label accuracy "
            f"{accuracy.text(metrics.label_accuracy)}, {steps}; wrote {out / 'result.json'}"
        )
    from auditlib.report.step_words import plainly_eager, steps_text

    if not plainly_eager(summary.attacks):  # a run on a CPU steps eagerly: nothing to say
        print(steps_text(summary.attacks))
    print(f"verdict: {verdict.headline}\n  {verdict.sentence}")


def with_control(summary: AuditSummary, control_result, *, defended: bool) -> Verdict:
    """The run's verdict, judged beside its control's finding where it has a defense."""
    from auditlib.metrics.verdict import judge

    own = summary.verdict
    assert own is not None  # every run judges itself
    if not defended:
        return own
    if control_result is None:
        return judge(own.finding, own.scope, defended=True, control_note="--no-control was given")
    control = control_result.summary.verdict.finding
    note = (
        "the same attack and budget without the defense, run first "
        f"({control_result.summary.spec_id[:12]})"
    )
    return judge(own.finding, own.scope, defended=True, control=control, control_note=note)
