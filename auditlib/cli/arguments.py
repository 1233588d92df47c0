"""The command line's arguments: one parser, its sub-commands and their options, with
choices taken from the definitions (the protocol's, the federation's, the registries')."""

from __future__ import annotations

import argparse
from typing import get_args


class _Parser(argparse.ArgumentParser):
    """Usage mistakes end in one line on stderr, like every other bad input.

    A command's namespace also holds ``given_options``: the options its command line gave,
    whatever their defaults (a file that fills options, ``audit --observed``, refuses a
    clash only with those)."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"error: {message} (see {self.prog} --help)\n")

    def parse_known_args(self, args=None, namespace=None):  # type: ignore[override]
        parsed, extras = super().parse_known_args(args, namespace)
        if self._subparsers is None and args is not None:  # a command, not the top parser
            parsed.given_options = self._given(list(args))
        return parsed, extras

    def _given(self, args: list[str]) -> frozenset[str]:
        # Parsed again into a namespace that already holds every option: argparse sets no
        # default there, so what changed was given (an appended option starts from None).
        unset = object()
        actions = [a for a in self._actions if a.dest != argparse.SUPPRESS]
        start = {a.dest: None if isinstance(a, argparse._AppendAction) else unset for a in actions}
        probe = argparse.Namespace(**start)
        super().parse_known_args(args, probe)
        return frozenset(k for k, v in vars(probe).items() if k in start and v is not start[k])


# --attacker-knows-defense: the CLI's words for ScenarioSpec.attacker_knows_defense.
KNOWS_DEFENSE = {"auto": None, "yes": True, "no": False}
PARAMS_HINT = "`python -m auditlib params NAME` lists them: type, default, range, description"


def build_parser() -> argparse.ArgumentParser:
    from auditlib.attacks import ALL_ATTACKS, ATTACKS
    from auditlib.attacks.restarts import AUDIT_PRESET
    from auditlib.attacks.text_names import TEXT_ATTACK_NAMES
    from auditlib.client.protocol import Algorithm, BatchNormMode, Optimizer, Shared
    from auditlib.data.samples import SAMPLE_SETS
    from auditlib.defenses import DEFENSES
    from auditlib.models import ARCHITECTURES
    from auditlib.spec import MAX_TIME_BUDGET_S, SERVERS, UTILITY_DATASETS

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
        "--model-args",
        metavar="JSON",
        help="with --model path/to/file.py:ClassName (a model class of your own code): its "
        "constructor arguments as a JSON object, e.g. '{\"num_classes\": 10}'",
    )
    model.add_argument(
        "--i-trust-this-file",
        action="store_true",
        help="required with --trusted-model and with a model class of your own code "
        "(--model or training.json's model path/to/file.py:ClassName): its code runs, in a "
        "process of its own",
    )
    for action in model._group_actions:  # --observed names the model: checked in cli/audit.py
        if action.dest == "model":
            action.required = False

    observed = audit.add_argument_group("observed update")
    observed.add_argument(
        "--observed",
        metavar="DIR",
        help="audit the update a client actually sent: a bundle folder with global.safetensors, "
        "client.safetensors (or delta.safetensors) and training.json (docs/OBSERVED.md); its "
        "training.json sets the model and the scenario (an option that says otherwise is "
        "refused); without --images or --samples the reconstructions are shown, not scored",
    )

    data = audit.add_argument_group("data")
    source = data.add_mutually_exclusive_group()
    source.add_argument(
        "--images",
        help="folder of images (labels from labels.csv or class subfolders); one of --images "
        "and --samples is required, except with --observed",
    )
    source.add_argument("--samples", help=f"bundled sample set: {', '.join(SAMPLE_SETS)}")
    data.add_argument("--labels-csv", help="CSV with columns filename,label")
    data.add_argument("--offset", type=int, default=0, help="first image to use")
    data.add_argument(
        "--updates",
        type=_updates,
        metavar="N|all",
        help="audit the sample: N updates (or all the set holds) of --batch-size images each, "
        "one client's update each, from --offset on; the verdict reports the share of images "
        "recovered with its 95%% interval, each update's figures and the worst case",
    )
    data.add_argument(
        "--updates-apart",
        action="store_true",
        help="with --updates: attack the updates one after another instead of together as "
        "one batched computation (each update's objective is its own and its first step "
        "the one it takes alone, to float rounding; the batched kernels round differently, "
        "which the optimiser grows, so the result is the same in distribution, the share "
        "recovered, not bit for bit)",
    )
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
        "--optimizer",
        default="sgd",
        choices=get_args(Optimizer),
        help="FedAvg: the client's local optimiser, as torch.optim runs it (adam: its defaults)",
    )
    scenario.add_argument(
        "--momentum", type=float, default=0.0, help="FedAvg: SGD's momentum (default: none)"
    )
    scenario.add_argument(
        "--weight-decay", type=float, default=0.0, help="FedAvg: L2 weight decay (default: none)"
    )
    scenario.add_argument(
        "--shuffle",
        action="store_true",
        help="FedAvg: the client shuffles its mini-batches with a seed of its own, which the "
        "attacker does not know (it simulates them in order)",
    )
    scenario.add_argument(
        "--labels-known", action="store_true", help="threat model: the server knows the labels"
    )
    scenario.add_argument(
        "--server",
        default="honest",
        choices=SERVERS,
        help="threat model: an honest-but-curious server observes the update; a malicious one "
        "also changes the model it sends (attacks rtf, cah, loki)",
    )
    scenario.add_argument(
        "--secure-aggregation",
        type=int,
        metavar="CLIENTS",
        help="the server sees only the summed update of CLIENTS clients (at least 2), the "
        "audited images split over them in order",
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

    text = audit.add_argument_group(
        "text model (docs/TEXT.md): with --text-model the audit is of a language model"
    )
    text.add_argument(
        "--text-model",
        metavar="PRESET|DIR",
        help="a preset (gpt2, gpt2-tiny, bert-base, tinybert, bert-tiny: random weights, the "
        "demo tokenizer) or your folder with config.json, model.safetensors and tokenizer.json "
        "(no code from it runs)",
    )
    text.add_argument(
        "--text",
        metavar="FILE",
        help="the private sequences: a .txt (one per line) or a .csv with a text column and "
        "an optional label column (default: the demo text, New Testament verses)",
    )
    text.add_argument("--tokens", type=int, default=32, help="tokens per sequence (default 32)")
    text.add_argument(
        "--lora-rank",
        type=int,
        help="only LoRA adapters of this rank train (peft), the backbone frozen",
    )

    attack = audit.add_argument_group("attack and defense")
    attack.add_argument(
        "--attack",
        default=None,
        choices=[*sorted(ATTACKS), *TEXT_ATTACK_NAMES, ALL_ATTACKS],
        help=f"the attack (default: dlg; dager for a text model), or '{ALL_ATTACKS}': every "
        "applicable attack at its audit preset, the worst case per image",
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
    run.add_argument(
        "--time-budget",
        type=float,
        help=f"seconds before the attack stops, at most {MAX_TIME_BUDGET_S} (under a defense "
        "its adaptive twin gets as many again)",
    )
    run.add_argument(
        "--no-control",
        action="store_true",
        help="do not run the undefended control of a defended run (its verdict is then "
        "inconclusive unless the attack leaks)",
    )
    run.add_argument("--seed", type=int, default=0)
    run.add_argument(
        "--device",
        default="auto",
        help="auto (the default: cuda where this machine has a CUDA device, else cpu), cpu, "
        "cuda or cuda:N",
    )
    run.add_argument(
        "--lpips-nets", default="alex,vgg", help="comma-separated LPIPS backbones, or 'none'"
    )
    run.add_argument(
        "--out",
        required=True,
        help="output folder for result.json and reconstruction.png, replaced whole (a "
        "folder holding other files is refused)",
    )
    _utility_arguments(commands, ARCHITECTURES, DEFENSES)
    _report_arguments(commands)
    _users_arguments(commands)
    commands.add_parser(
        "models",
        help="list the architectures --model takes: the built-ins and torchvision:NAME",
    )
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
    subject.add_argument(
        "--text-result",
        metavar="DIR/result.json",
        help="the result.json a text audit wrote (audit --text-model): its PDF",
    )
    report.add_argument(
        "--db",
        help="SQLAlchemy URL of the store (default: $AUDIT_DATABASE_URL, else data/audit.db)",
    )
    report.add_argument("--out", required=True, metavar="FILE.pdf", help="the PDF file to write")
    report.add_argument(
        "--user",
        default=None,
        help="the user the report is for (default: $AUDIT_USER): only their runs, or any run "
        "for an admin; needed once a users file exists",
    )
    report.add_argument(
        "--no-charts", action="store_true", help="leave out the charts (no Chromium needed)"
    )
    report.add_argument(
        "--mask-private",
        action="store_true",
        help="with --text-result: private and recovered text masked (word lengths only), "
        "so the PDF can be shared",
    )


def _users_arguments(commands) -> None:
    from auditlib.access import ROLES

    users = commands.add_parser(
        "users",
        help="the dashboard's users: create the first admin, add, list, remove; whether "
        "trusted code runs",
    )
    actions = users.add_subparsers(dest="action", required=True, parser_class=_Parser)
    actions.add_parser(
        "init",
        help="create the users file with a first admin (its one-time password in a file)",
    )
    add = actions.add_parser("add", help="add a user (the password is asked for, or read)")
    add.add_argument("username")
    add.add_argument("--role", choices=ROLES, default=ROLES[0], help="default: %(default)s")
    add.add_argument("--name", default="", help="the name shown in the dashboard")
    add.add_argument("--email", default="")
    passwd = actions.add_parser("passwd", help="set a user's password")
    passwd.add_argument("username")
    for action in (add, passwd):
        action.add_argument(
            "--password-stdin",
            action="store_true",
            help="read the password from the first line of stdin instead of asking",
        )
    role = actions.add_parser("role", help="change a user's role (counts at their next click)")
    role.add_argument("username")
    role.add_argument("role", choices=ROLES)
    remove = actions.add_parser("remove", help="remove a user (their runs stay, for admins)")
    remove.add_argument("username")
    actions.add_parser("list", help="list the users and their roles")
    trusted = actions.add_parser(
        "trusted-code",
        help="whether the dashboard may build a model class of a user's own code (runs it on "
        "this server, in a process of its own); off by default, set by an admin",
    )
    trusted.add_argument("state", choices=("on", "off", "show"))
    trusted.add_argument(
        "--admin", metavar="NAME", help="the admin who sets it (their password is asked for)"
    )
    trusted.add_argument(
        "--password-stdin",
        action="store_true",
        help="read the admin's password from the first line of stdin instead of asking",
    )


def _model_arguments(parser: argparse.ArgumentParser, architectures, init: str | None):
    from auditlib.models.architectures import ACTIVATIONS, STEMS
    from auditlib.models.registry import CHANNELS, INITS

    model = parser.add_argument_group("model")
    model.add_argument(
        "--model",
        required=True,
        metavar="ARCHITECTURE",
        help=f"a built-in architecture ({', '.join(architectures)}), torchvision:NAME, any "
        "torchvision classification model (colour input, the builder's own init), or "
        "path/to/file.py:ClassName, a model class of your own code; "
        "`python -m auditlib models` lists them",
    )
    model.add_argument(
        "--weights", help="weights for --model: safetensors or a weights-only state_dict"
    )
    model.add_argument("--num-classes", type=int, default=10)
    model.add_argument("--input-size", type=int, default=32, help="input height = width in pixels")
    model.add_argument("--channels", type=int, default=CHANNELS[0], choices=CHANNELS)
    model.add_argument(
        "--init",
        choices=INITS,
        help="uniform = U(-0.5, 0.5), the DLG/GRNN setting (default: "
        + (
            f"{init} for the built-ins"
            if init
            else "the one SGD trains from: uniform for sigmoid networks, PyTorch's otherwise"
        )
        + "; torchvision models take only default)",
    )
    parser.set_defaults(builtin_init=init)
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


def model_spec_of(args: argparse.Namespace):
    """The model the ``_model_arguments`` options describe.

    Without --init: the command's init for the built-ins (the audit's uniform one), the one
    SGD trains from where the command has none (utility), PyTorch's for torchvision models.
    """
    from dataclasses import replace

    from auditlib.models import ModelSpec
    from auditlib.models.own_code import is_own_class
    from auditlib.models.registry import trainable_init
    from auditlib.models.zoo import is_torchvision

    init = args.init
    own = is_own_class(args.model)
    if init is None and not is_torchvision(args.model) and not own:  # an own class: its init
        init = args.builtin_init
    spec = ModelSpec(
        architecture=args.model,
        num_classes=args.num_classes,
        input_shape=(args.channels, args.input_size, args.input_size),
        init=init or "default",
        activation=args.activation,
        stem=args.stem,
        seed=args.model_seed,
        model_args=getattr(args, "model_args", None),
    )
    if init is None and not own:  # the utility command: start where SGD trains the activation
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


def _updates(text: str):
    from auditlib.cli.sample import parse_updates

    return parse_updates(text)
