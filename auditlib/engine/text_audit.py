"""A text audit end to end: the model and the private sequences, the client's update (and
its defense), each text attack on it, the attacker that knows the defense where one exists,
the same attacks on the undefended update as the control, scores against the guess from
public text, and the verdict (``metrics.text_verdict``).

A stop request (``should_stop``, a Cancel) is read between the attacks' steps: the running
attack returns what it had, nothing further starts, and what was recovered is scored; the
verdict then claims a leak only where one was measured, and is inconclusive otherwise.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from auditlib.attacks.text import TEXT_ATTACKS, run_text_attack
from auditlib.attacks.text.base import (
    RecoveredText,
    StopCheck,
    TextProgress,
    TextTarget,
    never_stop,
)
from auditlib.attacks.text.dager import DagerConfig
from auditlib.attacks.text.lamp import lamp_config
from auditlib.attacks.text.tag import tag_config
from auditlib.client.text_update import TextUpdate, text_update
from auditlib.data.demo_text import demo_text
from auditlib.data.text_samples import TextBatch, demo_batch, make_batch, parse_text_file
from auditlib.defenses import build_defense
from auditlib.engine.device import resolve_device
from auditlib.errors import AuditInputError
from auditlib.file_digest import sha256_file
from auditlib.metrics.text import TextScores, score_text
from auditlib.metrics.text_baseline import GuessBar, TextGuess, guess_bar, text_guesses
from auditlib.metrics.text_risk import text_risk
from auditlib.metrics.text_verdict import TextFinding, TextVerdict, judge_text
from auditlib.models.text import (
    MODEL_FILES,
    PRESETS,
    TextModel,
    build_text_model,
    load_text_model,
    with_lora,
)

# Defenses that act on the update alone, so on a text model's as on an image model's.
TEXT_DEFENSES = ("none", "clip", "dp-gaussian", "dp-laplace", "prune", "quantize")
# The defenses whose noise or loss of precision breaks DAGER's exact span test, and against
# which the attacker that knows them ranks candidates instead (``DagerConfig.mode``).
RANKED_AGAINST = ("dp-gaussian", "dp-laplace", "prune", "quantize")
KNOWS_NOISE = ("tiger",)  # attacks that are their own adaptive form against those


@dataclass(frozen=True)
class TextAuditSpec:
    model: str = "gpt2"  # a preset (models.text.PRESETS) or the auditor's model folder
    lora_rank: int | None = None  # LoRA adapters of this rank train; None: every weight
    text_file: str | None = None  # the auditor's .txt or .csv; None: the demo text
    batch_size: int = 16
    length: int = 32
    seed: int = 0
    algorithm: str = "fedsgd"
    local_steps: int = 1
    learning_rate: float = 1e-4
    attacks: tuple[str, ...] = ("dager",)
    defense: str = "none"
    defense_params: dict[str, Any] = field(default_factory=dict)
    adaptive: bool = True  # also run the attacker that knows the defense
    preset: str = "strongest"  # TAG's and LAMP's: "strongest" or "paper" (their papers' settings)
    iterations: int | None = None  # TAG's and LAMP's optimisation steps; None: the preset's
    # Where the model, the client's update and the attacks run: "cpu", "cuda" or "cuda:N"
    # (the command line resolves its "auto" first, so a result names the device it ran on).
    device: str = "cpu"


@dataclass(frozen=True)
class TextEvent:
    stage: str  # "model", "update", "attack", "progress", "scored", "done"
    attack: str = ""
    texts: tuple[str, ...] = ()
    note: str = ""


@dataclass(frozen=True)
class TextAttackRun:
    attack: str  # "dager", or "dager (knows the defense)" for its adaptive twin
    recovered: RecoveredText
    scores: TextScores
    finding: TextFinding


@dataclass(frozen=True)
class TextAuditResult:
    spec: TextAuditSpec
    model_source: str
    batch_source: str
    private_texts: tuple[str, ...]
    guesses: tuple[TextGuess, ...]
    bar: GuessBar
    runs: tuple[TextAttackRun, ...]
    controls: tuple[TextAttackRun, ...]
    verdict: TextVerdict
    privacy: dict[str, Any]
    seconds: float
    stopped: bool = False  # cancelled: an attack cut short, the rest not run
    # The sha256 of each file the audit read ("config.json", "model.safetensors",
    # "tokenizer.json" of the auditor's folder, "text" of their text file): the report names
    # exactly what was audited. Empty for a preset on the demo text (nothing read).
    inputs: dict[str, str] = field(default_factory=dict)


def input_digests(spec: TextAuditSpec) -> dict[str, str]:
    """The sha256 of the auditor's files the audit reads (a preset and the demo text: none);
    the dashboard's uploads are stored under the same digests of the same bytes."""
    found: dict[str, str] = {}
    if spec.model not in PRESETS:
        for name in MODEL_FILES:
            if (path := Path(spec.model) / name).is_file():
                found[name] = sha256_file(path)
    if spec.text_file is not None and (path := Path(spec.text_file)).is_file():
        found["text"] = sha256_file(path)
    return found


def _model(spec: TextAuditSpec) -> TextModel:
    if spec.model in PRESETS:
        model = build_text_model(spec.model, spec.seed)
    elif Path(spec.model).is_dir():
        model = load_text_model(Path(spec.model))
    else:
        raise AuditInputError(
            f"text model {spec.model!r}; expected a preset ({', '.join(PRESETS)}) or a folder "
            "with config.json, model.safetensors and tokenizer.json"
        )
    return with_lora(model, spec.lora_rank) if spec.lora_rank else model


def _batch(spec: TextAuditSpec, model: TextModel) -> TextBatch:
    if spec.text_file is None:
        return demo_batch(model.tokenizer, spec.batch_size, spec.length, spec.seed)
    path = Path(spec.text_file)
    if not path.is_file():
        raise AuditInputError(f"{path}: no such text file; expected a .txt or .csv")
    rows = parse_text_file(path.name, path.read_bytes())
    labels = int(getattr(model.backbone.config, "num_labels", 2))
    return make_batch(
        model.tokenizer, rows, spec.batch_size, spec.length, spec.seed,
        num_labels=labels, source=path.name,
    )  # fmt: skip


def _text_defense(spec: TextAuditSpec):
    """The run's defense, its name and parameters checked (before any time is spent)."""
    if spec.defense not in TEXT_DEFENSES:
        raise AuditInputError(
            f"defense {spec.defense!r} on a text model; the defenses that act on the update "
            f"alone apply to text: {', '.join(TEXT_DEFENSES)}"
        )
    return build_defense(spec.defense, spec.defense_params)[0]


def defended(defense, seed: int, update: TextUpdate) -> tuple[TextUpdate, dict[str, Any]]:
    """The update as the defense releases it (its noise seeded), and its privacy report."""
    generator = torch.Generator().manual_seed(seed)
    names = list(update.gradients)
    released = defense.apply(tuple(update.gradients[n] for n in names), generator)
    grads = dict(zip(names, released, strict=True))
    return replace(update, gradients=grads), dict(defense.privacy_report())


def _run(
    name: str, label: str, target: TextTarget, batch: TextBatch, bar: GuessBar, config, emit,
    should_stop: StopCheck = never_stop,
) -> TextAttackRun:  # fmt: skip
    emit(TextEvent("attack", label))

    def progress(p: TextProgress) -> None:
        emit(TextEvent("progress", label, p.texts, f"{p.step}/{p.total}"))

    recovered = run_text_attack(name, target, config, progress, should_stop)
    private_ids = [
        batch.input_ids[i, : int(batch.attention_mask[i].sum())].tolist() for i in range(batch.size)
    ]
    if target.model.tokenizer.bos_id is not None:  # encoders: compare the text's own tokens
        tok = target.model.tokenizer
        private_ids = [[t for t in ids if t not in (tok.bos_id, tok.eos_id)] for ids in private_ids]
    scores = score_text(batch.texts, private_ids, recovered.texts, recovered.token_ids)
    risk = text_risk(scores, bar)
    finding = TextFinding(label, risk, scores.rouge1, scores.rouge2, scores.rougeL, scores.exact)
    emit(TextEvent("scored", label, recovered.texts, f"ROUGE-1 {scores.rouge1:.2f}"))
    return TextAttackRun(label, recovered, scores, finding)


def _config(name: str, spec: TextAuditSpec):
    """The attack's config: its preset (TAG and LAMP have a paper one), its steps."""
    if name == "tag":
        config = tag_config(spec.preset)
    elif name == "lamp":
        config = lamp_config(spec.preset)
    else:
        config = TEXT_ATTACKS[name].config()
    if spec.iterations is not None and hasattr(config, "steps"):
        config = replace(config, steps=spec.iterations)
    return config


def _attacks_on(
    spec: TextAuditSpec, model: TextModel, update: TextUpdate, batch: TextBatch, bar, emit,
    defended: bool, should_stop: StopCheck = never_stop,
) -> tuple[list[TextAttackRun], bool, bool]:  # fmt: skip
    """The runs, whether the attacker that knows the defense ran, and whether a stop request
    ended them early (the attack it reached cut short, the rest not started)."""
    runs, twin_ran = [], False
    for name in spec.attacks:
        if name not in TEXT_ATTACKS:
            raise AuditInputError(
                f"text attack {name!r}; expected one of {', '.join(TEXT_ATTACKS)}"
            )
        info = TEXT_ATTACKS[name]
        if update.adapters_only and not info.adapters_update:
            raise AuditInputError(
                f"{name} reads every weight's update; only LoRA adapters train here"
            )
        if not update.adapters_only and not info.full_update:
            raise AuditInputError(f"{name} reads LoRA adapters' updates; every weight trains here")
        target = TextTarget(model, update, spec.batch_size, spec.length, batch.labels)
        if should_stop():
            return runs, twin_ran, True
        runs.append(_run(name, name, target, batch, bar, _config(name, spec), emit, should_stop))
        if runs[-1].recovered.stopped:
            return runs, twin_ran, True
        if defended and spec.adaptive and name == "dager" and spec.defense in RANKED_AGAINST:
            if should_stop():
                return runs, twin_ran, True
            twin = DagerConfig(mode="ranked")
            label = "dager (knows the defense)"
            runs.append(_run(name, label, target, batch, bar, twin, emit, should_stop))
            if runs[-1].recovered.stopped:
                return runs, twin_ran, True
            twin_ran = True
        if defended and name in KNOWS_NOISE and spec.defense in RANKED_AGAINST:
            twin_ran = True  # TIGER thresholds nothing: it is the attacker that knows the noise
    return runs, twin_ran, False


def run_text_audit(
    spec: TextAuditSpec,
    on_event: Callable[[TextEvent], None] | None = None,
    should_stop: StopCheck = never_stop,
) -> TextAuditResult:
    started = time.perf_counter()
    emit = on_event or (lambda _e: None)
    defense = _text_defense(spec)
    device = resolve_device(spec.device)  # refused at once where there is no such device
    torch.manual_seed(spec.seed)
    model = _model(spec)
    # Built (and seeded) on the CPU, then moved: the same weights on every device.
    model.module.to(device)
    emit(TextEvent("model", note=model.source + _on(device)))
    batch = _batch(spec, model).to(device)
    tok = model.tokenizer
    guesses = text_guesses(demo_text().public, tok, spec.length, spec.seed)
    bar = guess_bar(batch.texts, guesses)
    clean = text_update(model, batch, spec.algorithm, spec.local_steps, spec.learning_rate)
    emit(TextEvent("update", note=f"{len(clean.gradients)} tensors, {spec.algorithm}"))
    controls: list[TextAttackRun] = []
    if spec.defense == "none":
        runs, _, stopped = _attacks_on(
            spec, model, clean, batch, bar, emit, defended=False, should_stop=should_stop
        )
        privacy: dict[str, Any] = {}
        adaptive = "no defense"
    else:
        update, privacy = defended(defense, spec.seed, clean)
        runs, twin_ran, stopped = _attacks_on(
            spec, model, update, batch, bar, emit, defended=True, should_stop=should_stop
        )
        if not stopped:
            controls, _, stopped = _attacks_on(
                spec, model, clean, batch, bar, emit, defended=False, should_stop=should_stop
            )
        offered = (
            any(a in ("dager", *KNOWS_NOISE) for a in spec.attacks)
            and spec.defense in RANKED_AGAINST
        )
        adaptive = "ran" if twin_ran else ("not offered" if not offered else "none")
    verdict = judge_text(
        tuple(r.finding for r in runs), tuple(c.finding for c in controls),
        _defense_words(spec), adaptive, stopped=stopped,
    )  # fmt: skip
    emit(TextEvent("done", note=verdict.headline))
    return TextAuditResult(
        spec, model.source, batch.source, batch.texts, guesses, bar, tuple(runs),
        tuple(controls), verdict, privacy, time.perf_counter() - started, stopped,
        input_digests(spec),
    )  # fmt: skip


def _on(device: torch.device) -> str:
    if device.type == "cpu":
        return ""
    return f", on {torch.cuda.get_device_name(device)} ({device})"


def _defense_words(spec: TextAuditSpec) -> str:
    if spec.defense == "none":
        return "none"
    params = ", ".join(f"{k}={v}" for k, v in sorted(spec.defense_params.items()))
    return f"{spec.defense} ({params})" if params else spec.defense
