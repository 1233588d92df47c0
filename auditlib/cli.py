"""Command line: ``python -m auditlib audit ...`` runs one audit and writes its results;
``utility`` trains under a defense; ``report`` writes the PDF report of stored runs;
``params`` lists an attack's or a defense's parameters (type, default, range, description).

Exit codes: 0 done, 2 bad input (one line on stderr saying what was expected), 1 failure.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING, get_args

from auditlib.errors import AuditInputError
from auditlib.words import size_text

if TYPE_CHECKING:
    from auditlib.metrics.verdict import Verdict
    from auditlib.result import AuditSummary


def _sha256_file(path: str) -> str:
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as handle:
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                digest.update(chunk)
    except OSError as exc:
        raise AuditInputError(f"cannot read {path}: {exc.strerror}") from exc
    return digest.hexdigest()


class _Parser(argparse.ArgumentParser):
    """Usage mistakes end in one line on stderr, like every other bad input."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"error: {message} (see {self.prog} --help)\n")


# --attacker-knows-defense: the CLI's words for ScenarioSpec.attacker_knows_defense.
KNOWS_DEFENSE = {"auto": None, "yes": True, "no": False}
PARAMS_HINT = "`python -m auditlib params NAME` lists them: type, default, range, description"


def build_parser() -> argparse.ArgumentParser:
    from auditlib.attacks import ALL_ATTACKS, ATTACKS
    from auditlib.attacks.restarts import AUDIT_PRESET
    from auditlib.client.protocol import Algorithm, BatchNormMode, Shared
    from auditlib.data.samples import SAMPLE_SETS
    from auditlib.defenses import DEFENSES
    from auditlib.models import ARCHITECTURES
    from auditlib.spec import UTILITY_DATASETS

    parser = _Parser(
        prog="python -m auditlib", description="Gradient-leakage audits for federated learning."
    )
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    audit = commands.add_parser(
        "audit", help="run one attack against one client update and score it"
    )

    model = _model_arguments(audit, ARCHITECTURES, init="uniform")
    model.add_argument(
        "--trusted-model", help="TorchScript / torch.export archive (runs code on load)"
    )
    model.add_argument(
        "--i-trust-this-file", action="store_true", help="required with --trusted-model"
    )

    data = audit.add_argument_group("data")
    source = data.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--images", help="folder of images (labels from labels.csv or class subfolders)"
    )
    source.add_argument("--samples", help=f"bundled sample set: {', '.join(SAMPLE_SETS)}")
    data.add_argument("--labels-csv", help="CSV with columns filename,label")
    data.add_argument("--offset", type=int, default=0, help="first image to use")
    data.add_argument(
        "--normalization",
        default="none",
        help="'none' or 'MEAN/STD' per channel, e.g. 0.5,0.5,0.5/0.5,0.5,0.5",
    )

    scenario = audit.add_argument_group("scenario")
    scenario.add_argument("--scenario", default="fedsgd", choices=get_args(Algorithm))
    scenario.add_argument(
        "--batch-size",
        type=int,
        help="images in the private batch (default: 1 for samples, all for a folder)",
    )
    scenario.add_argument("--local-steps", type=int, default=1)
    scenario.add_argument("--local-epochs", type=int)
    scenario.add_argument("--local-lr", type=float, default=0.01)
    scenario.add_argument("--local-batch-size", type=int)
    scenario.add_argument(
        "--share",
        default="delta",
        choices=get_args(Shared),
        help="FedAvg: what the client sends",
    )
    scenario.add_argument("--bn-mode", default="train", choices=get_args(BatchNormMode))
    scenario.add_argument(
        "--labels-known", action="store_true", help="threat model: the server knows the labels"
    )
    scenario.add_argument(
        "--attacker-knows-defense",
        default="auto",
        choices=tuple(KNOWS_DEFENSE),
        help="threat model: run beside each attack its adaptive twin, which knows the "
        "defense's mechanism and public parameters (auto: yes, except for --preset paper)",
    )
    scenario.add_argument(
        "--pretrain-rounds",
        type=int,
        default=0,
        help="attack stage: FedAvg rounds before the attack",
    )
    scenario.add_argument("--pretrain-data", default=UTILITY_DATASETS[0], choices=UTILITY_DATASETS)

    attack = audit.add_argument_group("attack and defense")
    attack.add_argument(
        "--attack",
        default="dlg",
        choices=[*sorted(ATTACKS), ALL_ATTACKS],
        help=f"the attack, or '{ALL_ATTACKS}': every applicable attack at its audit preset, "
        "the worst case per image",
    )
    attack.add_argument(
        "--preset",
        default=AUDIT_PRESET,
        help="attack preset: 'audit' (default: the strongest settings, raced restarts), "
        "'paper' (the paper's settings, for reproduction), another the attack lists, or "
        "'none' (the library's defaults)",
    )
    attack.add_argument(
        "--attack-param",
        action="append",
        metavar="NAME=VALUE",
        help=f"an attack parameter (repeatable); {PARAMS_HINT.replace('NAME', 'ATTACK')}",
    )
    attack.add_argument("--defense", default="none", choices=sorted(DEFENSES))
    attack.add_argument(
        "--defense-param",
        action="append",
        metavar="NAME=VALUE",
        help=f"a defense parameter (repeatable); {PARAMS_HINT.replace('NAME', 'DEFENSE')}",
    )

    run = audit.add_argument_group("run")
    run.add_argument(
        "--iterations", type=int, help="optimiser steps per restart (default: the paper's)"
    )
    run.add_argument("--time-budget", type=float, help="seconds before the attack stops")
    run.add_argument(
        "--no-control",
        action="store_true",
        help="do not run the undefended control of a defended run (its verdict is then "
        "inconclusive unless the attack leaks)",
    )
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    run.add_argument(
        "--lpips-nets", default="alex,vgg", help="comma-separated LPIPS backbones, or 'none'"
    )
    run.add_argument(
        "--out", required=True, help="output folder for result.json and reconstruction.png"
    )
    _utility_arguments(commands, ARCHITECTURES, DEFENSES)
    _report_arguments(commands)
    params = commands.add_parser(
        "params",
        help="list an attack's or a defense's parameters: type, default, range, description",
    )
    params.add_argument(
        "name",
        nargs="?",
        metavar="ATTACK-OR-DEFENSE",
        help="an attack or defense name; none: list the attacks and defenses",
    )
    return parser


def _report_arguments(commands) -> None:
    report = commands.add_parser(
        "report", help="write the PDF audit report of a stored run, comparison or sweep"
    )
    subject = report.add_mutually_exclusive_group(required=True)
    subject.add_argument("--run", metavar="ID", help="id of a run in the store")
    subject.add_argument("--batch", metavar="ID", help="id of a comparison or sweep in the store")
    report.add_argument(
        "--db",
        help="SQLAlchemy URL of the store (default: $AUDIT_DATABASE_URL, else data/audit.db)",
    )
    report.add_argument("--out", required=True, metavar="FILE.pdf", help="the PDF file to write")
    report.add_argument(
        "--no-charts", action="store_true", help="leave out the charts (no Chromium needed)"
    )


def _model_arguments(parser: argparse.ArgumentParser, architectures, init: str | None):
    from auditlib.models.architectures import ACTIVATIONS, STEMS
    from auditlib.models.registry import INITS

    model = parser.add_argument_group("model")
    model.add_argument(
        "--model", required=True, choices=sorted(architectures), help="built-in architecture"
    )
    model.add_argument(
        "--weights", help="weights for --model: safetensors or a weights-only state_dict"
    )
    model.add_argument("--num-classes", type=int, default=10)
    model.add_argument("--input-size", type=int, default=32, help="input height = width in pixels")
    model.add_argument("--channels", type=int, default=3, choices=(1, 3))
    model.add_argument(
        "--init",
        default=init,
        choices=INITS,
        help="uniform = U(-0.5, 0.5), the DLG/GRNN setting (default: "
        + (
            init
            if init
            else "the one SGD trains from: uniform for sigmoid networks, PyTorch's otherwise"
        )
        + ")",
    )
    model.add_argument("--activation", choices=ACTIVATIONS, help="default: the architecture's")
    model.add_argument(
        "--stem",
        choices=STEMS,
        help="ResNet stem: cifar (one 3x3 convolution) or imagenet (torchvision's 7x7 and a "
        "max pool, which torchvision checkpoints need); default: cifar up to 64 pixels",
    )
    model.add_argument(
        "--model-seed", type=int, default=0, help="seed of the weight initialisation"
    )
    return model


def _model_spec(args: argparse.Namespace):
    """The built-in model the ``_model_arguments`` options describe."""
    from dataclasses import replace

    from auditlib.models import ModelSpec
    from auditlib.models.registry import trainable_init

    spec = ModelSpec(
        architecture=args.model,
        num_classes=args.num_classes,
        input_shape=(args.channels, args.input_size, args.input_size),
        init=args.init or "default",
        activation=args.activation,
        stem=args.stem,
        seed=args.model_seed,
    )
    if args.init is None:  # the utility command: start where SGD trains the activation
        spec = replace(spec, init=trainable_init(spec))
    return spec


def _utility_arguments(commands, architectures, defenses) -> None:
    from auditlib.fl.federation import Split
    from auditlib.spec import UTILITY_DATASETS

    utility = commands.add_parser(
        "utility",
        help="train the model with FedAvg under a defense; test accuracy and macro F1 per round",
    )
    _model_arguments(utility, architectures, init=None)
    data = utility.add_argument_group("data")
    source = data.add_mutually_exclusive_group(required=True)
    source.add_argument("--samples", help=f"bundled labelled set: {' or '.join(UTILITY_DATASETS)}")
    source.add_argument(
        "--images", help="folder of labelled images (class subfolders or labels.csv)"
    )
    data.add_argument("--labels-csv", help="CSV with columns filename,label")
    data.add_argument("--train", type=int, default=2000, help="training examples (bundled set)")
    data.add_argument("--test", type=int, default=1000, help="held-out examples (bundled set)")
    data.add_argument("--test-fraction", type=float, default=0.2, help="held-out share of --images")
    data.add_argument("--max-images", type=int, default=5000, help="most images read from --images")
    data.add_argument("--normalization", default="none", help="'none' or 'MEAN/STD' per channel")
    federation = utility.add_argument_group("federation")
    federation.add_argument("--clients", type=int, default=10)
    federation.add_argument("--clients-per-round", type=int)
    federation.add_argument("--split", default="iid", choices=get_args(Split))
    federation.add_argument("--alpha", type=float, default=0.5, help="Dirichlet concentration")
    federation.add_argument("--rounds", type=int, default=10)
    federation.add_argument("--local-epochs", type=int, default=1)
    federation.add_argument("--local-lr", type=float, default=0.05)
    federation.add_argument("--local-batch-size", type=int, default=32)
    federation.add_argument("--seed", type=int, default=0)
    defense = utility.add_argument_group("defense")
    defense.add_argument("--defense", default="none", choices=sorted(defenses))
    defense.add_argument(
        "--defense-param",
        action="append",
        metavar="NAME=VALUE",
        help=f"a defense parameter (repeatable); {PARAMS_HINT.replace('NAME', 'DEFENSE')}",
    )
    utility.add_argument("--out", help="write the rounds as JSON to this file")
    utility.add_argument(
        "--save-weights",
        metavar="FILE",
        help="write the trained model's weights as safetensors: the file the dashboard's Setup "
        "page (and --weights) takes for the same architecture, classes and input size",
    )


def spec_from_args(args: argparse.Namespace):
    from auditlib.attacks import ALL_ATTACKS, ATTACKS, get_attack
    from auditlib.attacks.restarts import AUDIT_PRESET
    from auditlib.client.protocol import ClientProtocol
    from auditlib.config import parse_key_values
    from auditlib.spec import Budget, ComponentSpec, DataSpec, ModelRef, RunSpec, ScenarioSpec

    if args.trusted_model and not args.i_trust_this_file:
        raise AuditInputError(
            "--trusted-model loads an archive that can run code; add --i-trust-this-file to accept that"
        )
    if args.trusted_model and args.weights:
        raise AuditInputError("give either --weights or --trusted-model, not both")
    model_spec = _model_spec(args)
    weights_file = args.weights or args.trusted_model
    model = ModelRef(
        spec=model_spec,
        weights=args.weights,
        trusted_archive=args.trusted_model,
        content_sha256=_sha256_file(weights_file) if weights_file else None,
    )
    if args.batch_size is None and args.samples:
        args.batch_size = 1
    data = DataSpec(
        source="folder" if args.images else "samples",
        location=args.images or args.samples,
        batch_size=args.batch_size,
        offset=args.offset,
        labels_csv=args.labels_csv,
        normalization=args.normalization,
    )
    protocol = ClientProtocol(
        algorithm=args.scenario,
        local_steps=args.local_steps,
        local_epochs=args.local_epochs,
        local_lr=args.local_lr,
        local_batch_size=args.local_batch_size,
        shared=args.share,
        batchnorm_mode=args.bn_mode,
    )
    scenario = ScenarioSpec(
        protocol=protocol,
        labels_known=args.labels_known,
        attacker_knows_defense=KNOWS_DEFENSE[args.attacker_knows_defense],
        pretrain_rounds=args.pretrain_rounds,
        pretrain_data=args.pretrain_data,
    )
    preset = None if args.preset in (None, "none") else args.preset
    if args.attack == ALL_ATTACKS:
        if preset not in (None, AUDIT_PRESET):
            raise AuditInputError(
                f"--attack {ALL_ATTACKS} runs every attack at its audit preset; "
                f"drop --preset {args.preset}"
            )
        iterations = args.iterations or max(a.audit.iterations for a in ATTACKS.values() if a.audit)
        preset = None
    else:
        info = get_attack(args.attack)
        if preset == "paper" or info.audit is None:
            iterations = args.iterations or info.paper_iterations or 1000
        else:
            iterations = args.iterations or info.audit.iterations
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
        device=args.device,
    )


def write_outputs(result, out: Path) -> None:
    from auditlib.grids import save_comparison_png
    from auditlib.result_json import summary_json

    out.mkdir(parents=True, exist_ok=True)
    (out / "result.json").write_text(summary_json(result.summary.to_json()))
    save_comparison_png(result.originals, result.reconstruction, out / "reconstruction.png")


def _progress_bar(total: int):
    if not sys.stderr.isatty():
        return None
    from tqdm import tqdm

    return tqdm(total=total, unit="step", dynamic_ncols=True, file=sys.stderr)


def audit_command(args: argparse.Namespace) -> int:
    from auditlib.defenses import build_defense
    from auditlib.engine.attack_phase import plan_attacks
    from auditlib.engine.audit import run_audit
    from auditlib.engine.isolation import run_isolated
    from auditlib.metrics import LPIPS_NETS

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
    if out.exists() and not out.is_dir():
        raise AuditInputError(f"--out {out} exists and is not a folder")
    bar = None

    def on_event(event) -> None:
        nonlocal bar
        if bar is None:
            bar = _progress_bar(event.total_steps)
        if bar is not None:
            bar.n = event.step
            loss = next(iter(event.losses.values()), None)
            if loss is not None:
                bar.set_postfix(loss=f"{loss:.3g}", refresh=False)
            bar.refresh()

    runner = run_isolated if spec.model.trusted_archive else run_audit
    # Refuse bad attack or defense parameters before the control spends any time.
    plan_attacks(spec.attack, spec.budget.iterations)
    build_defense(spec.defense.name, spec.defense.params_dict())
    control_result = None
    control = None if args.no_control else spec.control()
    try:
        if control is not None:  # the positive control first: the defended run's verdict needs it
            print("control: the same attack without the defense", file=sys.stderr)
            control_result = runner(control, on_event=on_event, lpips_nets=())
            if bar is not None:
                bar.close()
                bar = None
        result = runner(spec, on_event=on_event, lpips_nets=nets)
    finally:
        if bar is not None:
            bar.close()
    import dataclasses

    from auditlib.metrics.catalogue import CATALOGUE
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
    result = dataclasses.replace(result, summary=summary)
    write_outputs(result, out)
    metrics, timing = summary.metrics, summary.timing
    psnr, ssim, accuracy = (CATALOGUE[k] for k in ("psnr", "ssim", "label_accuracy"))
    print(
        f"{spec.attack.name} vs {spec.defense.name}: PSNR {psnr.text(metrics.psnr_mean)} dB, "
        f"SSIM {ssim.text(metrics.ssim_mean)}, label accuracy "
        f"{accuracy.text(metrics.label_accuracy)}, {timing.iterations} steps in "
        f"{timing.seconds:.1f} s ({summary.stop_reason}); wrote {out / 'result.json'}"
    )
    print(f"verdict: {verdict.headline}\n  {verdict.sentence}")
    return 0


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


def utility_command(args: argparse.Namespace) -> int:
    import json
    from dataclasses import asdict

    from auditlib.config import parse_key_values
    from auditlib.data import ImageLimits, Normalization, load_image_folder
    from auditlib.data.training_sets import bundled_sets, labelled_sets
    from auditlib.defenses import build_defense
    from auditlib.fl.federated import train_federated, utility_tensors
    from auditlib.fl.federation import FederationSpec
    from auditlib.models import build_model
    from auditlib.models.loading import load_weights

    spec = _model_spec(args)
    federation = FederationSpec(
        clients=args.clients,
        clients_per_round=args.clients_per_round,
        split=args.split,
        alpha=args.alpha,
        rounds=args.rounds,
        local_epochs=args.local_epochs,
        local_lr=args.local_lr,
        local_batch_size=args.local_batch_size,
        seed=args.seed,
    )
    defense, settings = build_defense(
        args.defense, parse_key_values(args.defense_param, "defense parameter")
    )
    if args.samples:
        sets = bundled_sets(args.samples, args.train, args.test, args.seed)
    else:
        if args.max_images < 2:
            raise AuditInputError(f"--max-images must be >= 2, got {args.max_images}")
        images = load_image_folder(
            args.images, ImageLimits(max_images=args.max_images), labels_csv=args.labels_csv
        )
        sets = labelled_sets(images, args.test_fraction, args.seed)
    normalization = Normalization.parse(args.normalization, spec.input_shape[0])
    train, test = utility_tensors(sets, spec.input_shape, spec.num_classes, normalization)
    model = build_model(spec)
    if args.weights:
        load_weights(model, args.weights)
    save_to = Path(args.save_weights) if args.save_weights else None
    if save_to is not None and not save_to.parent.is_dir():
        raise AuditInputError(
            f"--save-weights {save_to}: the folder {save_to.parent} does not exist"
        )
    print(
        f"{args.model} on {sets.source}: {len(train[1])} training examples over "
        f"{federation.clients} clients ({federation.split}), {len(test[1])} held out; "
        f"defense {args.defense} {settings}"
    )
    rounds = []
    for result in train_federated(model, train, test, federation, defense):
        rounds.append(asdict(result))
        print(
            f"round {result.round:3d}: accuracy {result.accuracy:.3f}, macro F1 "
            f"{result.macro_f1:.3f}"
            + ("" if result.train_loss is None else f", train loss {result.train_loss:.3f}")
            + (
                ""
                if result.accuracy_without_key is None
                else f", without the key {result.accuracy_without_key:.3f}"
            )
            + f" ({result.seconds:.1f} s)",
            flush=True,
        )
    if save_to is not None:
        _save_weights(model, spec, save_to, args.defense)
    if args.out:
        Path(args.out).write_text(
            json.dumps(
                {
                    "model": spec.as_dict(),
                    "data": sets.source,
                    "federation": federation.as_dict(),
                    "defense": {"name": args.defense, "settings": settings},
                    "privacy": defense.privacy_report(),
                    "rounds": rounds,
                    # A protocol's own record per round (FedBoosting: weights, time, bytes).
                    "protocol_rounds": getattr(defense, "rounds", None),
                },
                indent=2,
                default=str,
            )
            + "\n"
        )
    return 0


def _save_weights(model, spec, path: Path, defense: str) -> None:
    """The trained model's state_dict as safetensors, when it is still the architecture's
    (a defense that inserts layers, such as FedKL's lock, changes it)."""
    import safetensors.torch

    from auditlib.models import build_model

    state = model.state_dict()
    expected = build_model(spec).state_dict()
    if set(state) != set(expected):
        raise AuditInputError(
            f"--save-weights: the defense {defense} changed the model's layers, so its weights "
            f"no longer fit {spec.architecture}; train with --defense none to save weights"
        )
    safetensors.torch.save_file({k: v.detach().contiguous() for k, v in state.items()}, path)
    print(f"weights saved to {path} ({size_text(path.stat().st_size)})")


def _existing_store(url: str):
    """The store at ``url``; a SQLite file that does not exist is refused, not created."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    from auditlib.store import Store

    try:
        parsed = make_url(url)
    except ArgumentError as exc:
        raise AuditInputError(f"--db {url!r} is not a database URL ({exc})") from exc
    database = parsed.database
    if (
        parsed.get_backend_name() == "sqlite"
        and database
        and database != ":memory:"
        and not database.startswith("file:")
        and not Path(database).is_file()
    ):
        raise AuditInputError(f"no database at {database}")
    return Store(url)


def report_command(args: argparse.Namespace) -> int:
    from auditlib.report.pdf import build_report
    from auditlib.report.subject import batch_subject, run_subject
    from auditlib.store import default_database_url

    out = Path(args.out)
    if out.is_dir():
        raise AuditInputError(f"--out {out} is a folder; give the PDF file to write")
    if not out.parent.is_dir():
        raise AuditInputError(f"--out {out}: the folder {out.parent} does not exist")
    with _existing_store(args.db or default_database_url()) as store:
        subject = run_subject(store, args.run) if args.run else batch_subject(store, args.batch)
        info = build_report(subject, out, charts=not args.no_charts)
    charts = "" if info.charts_drawn else f"; no charts: {info.charts_unavailable_reason}"
    print(f"wrote {info.path} ({info.pages} pages{charts})")
    return 0


def _wrapped(text: str, indent: int) -> str:
    return textwrap.fill(
        text, width=100, initial_indent=" " * indent, subsequent_indent=" " * indent
    )


def params_text(name: str) -> str:
    """The parameters of attack or defense ``name``, from their declarations
    (``auditlib.config.field_info``): one line of type, default and range per field, then its
    description; an attack's presets follow."""
    from auditlib.attacks import ATTACKS
    from auditlib.attacks.restarts import AUDIT_PRESET
    from auditlib.config import field_info, value_text
    from auditlib.defenses import DEFENSES

    if name in ATTACKS:
        info, kind, option = ATTACKS[name], "attack", "--attack-param"
    elif name in DEFENSES:
        info, kind, option = DEFENSES[name], "defense", "--defense-param"
    else:
        raise AuditInputError(
            f"no attack or defense {name!r}; attacks: {', '.join(sorted(ATTACKS))}; "
            f"defenses: {', '.join(sorted(DEFENSES))}"
        )
    lines = [f"{kind} {name}: {info.summary}"]
    fields = field_info(info.config_type)
    if not fields:
        lines.append("no parameters")
    else:
        lines.append(f"parameters ({option} NAME=VALUE; 'or none': VALUE may be none or empty):")
    for field in fields:
        facts = [field.type + (" or none" if field.optional else "")]
        facts.append(f"default {field.default_text}")
        if field.range_text:
            facts.append(field.range_text)
        lines.append(f"  {field.name}: {'; '.join(facts)}")
        lines.append(_wrapped(field.description, 6))
    presets = getattr(info, "presets", {})
    if presets:
        lines.append(
            _wrapped(
                f"presets (--preset NAME; '{AUDIT_PRESET}' is the default, 'none' the defaults "
                "above; --attack-param overrides a preset's value):",
                0,
            )
        )
        for preset, values in presets.items():
            settings = " ".join(f"{k}={value_text(v)}" for k, v in values.items())
            lines.append(_wrapped(f"{preset}: {settings or '(the defaults)'}", 2))
    return "\n".join(lines)


def params_command(args: argparse.Namespace) -> int:
    from auditlib.attacks import ATTACKS
    from auditlib.defenses import DEFENSES

    if args.name:
        print(params_text(args.name))
        return 0
    print("attacks:")
    for name, info in ATTACKS.items():
        print(f"  {name}: {info.summary}")
    print("defenses:")
    for name, info in DEFENSES.items():
        print(f"  {name}: {info.summary}")
    print("python -m auditlib params NAME lists the parameters of one of them.")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.command == "audit":
            return audit_command(args)
        if args.command == "utility":
            return utility_command(args)
        if args.command == "report":
            return report_command(args)
        if args.command == "params":
            return params_command(args)
    except AuditInputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        if os.environ.get("AUDIT_DEBUG"):
            raise
        print(
            f"error: the audit failed: {type(exc).__name__}: {exc} (AUDIT_DEBUG=1 shows the traceback)",
            file=sys.stderr,
        )
        return 1
    return 1


if __name__ == "__main__":
    sys.exit(main())
