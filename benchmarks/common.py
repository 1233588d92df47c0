"""Helpers shared by the benchmark scripts (not part of the library)."""

from __future__ import annotations

import argparse
import json
import platform
import re
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import torch

from auditlib.client.protocol import ClientProtocol
from auditlib.models import ModelSpec
from auditlib.result import AuditSummary
from auditlib.spec import Budget, ComponentSpec, DataSpec, ModelRef, RunSpec, ScenarioSpec

ROOT = Path(__file__).resolve().parents[1]


def machine() -> str:
    cuda = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no CUDA"
    return f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} torch threads, {cuda}, torch {torch.__version__}"


def lenet_spec(
    attack: str,
    *,
    offset: int = 0,
    iterations: int = 300,
    defense: ComponentSpec | None = None,
    seed: int = 0,
    num_classes: int = 100,
    attack_params: dict | None = None,
) -> RunSpec:
    """DLG's setting: LeNet (sigmoid, U(-0.5, 0.5) init), 32x32 photograph, batch 1, FedSGD."""
    return RunSpec(
        model=ModelRef(ModelSpec("lenet", num_classes, (3, 32, 32), init="uniform", seed=seed)),
        data=DataSpec("samples", "photographs", batch_size=1, offset=offset),
        scenario=ScenarioSpec(protocol=ClientProtocol()),
        attack=ComponentSpec.of(attack, attack_params or {}),
        defense=defense or ComponentSpec.of("none"),
        budget=Budget(iterations),
        seed=seed,
    )


def plain_and_twin(summary: AuditSummary) -> dict[str, dict]:
    """A defended run's attack and its twin (the attacker that knows the defense): each
    one's stop reason, steps, mean PSNR and seconds, under "plain" and "twin"."""
    return {
        "twin" if run.adaptive else "plain": {
            "stop_reason": run.stop_reason,
            "steps": run.steps,
            "psnr_mean": run.psnr_mean,
            "seconds": run.seconds,
        }
        for run in summary.attacks
    }


def on_device(path: Path, marker: str, device: str) -> tuple[Path, str]:
    """A benchmark's results file and doc section for ``device``: the CPU's, or a
    ``-cuda`` one of each beside them."""
    if device == "cpu":
        return path, marker
    return path.with_name(f"{path.stem}-cuda.json"), f"{marker}-cuda"


def write_results(path: Path, device: str, measured_on: str | None, **parts) -> None:
    """The results JSON: the machine (this one's, or where a log came from), the device
    and the benchmark's own parts."""
    results = {"machine": measured_on or machine(), "device": device, **parts}
    path.write_text(json.dumps(results, indent=2) + "\n")


def add_log_arguments(parser: argparse.ArgumentParser, same: str) -> None:
    """``--from-log`` and ``--measured-on``: a benchmark's rows made from the JSON lines an
    earlier run printed, where it was cut off (a lent GPU's time) before writing them."""
    parser.add_argument(
        "--from-log",
        metavar="LOG",
        help="make the rows from the JSON lines an earlier run printed (cut off before it "
        f"wrote its results); {same} as that run had them",
    )
    parser.add_argument("--measured-on", help="with --from-log: the machine the log came from")


def read_log(path: str | Path) -> tuple[list[dict], list[dict]]:
    """The JSON lines a benchmark printed: its runs (a line with ``together``, one per
    finished run of an arm) and its profiles (a line ``{"profile": ...}``), in order."""
    runs, profiles = [], []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        if not line.startswith("{"):
            continue
        record = json.loads(line)
        if "profile" in record:
            profiles.append(record["profile"])
        elif "together" in record:
            runs.append(record)
    return runs, profiles


def status_kib(pid: int | str, field: str) -> int | None:
    """A memory field of ``/proc/<pid>/status`` in KiB (``VmRSS``, ``VmHWM``; ``pid`` "self"
    for this process); None where /proc does not say it."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    found = re.search(rf"^{field}:\s+(\d+) kB", text, re.M)
    return None if found is None else int(found.group(1))


UNRECORDED = "a machine the log does not name (give --measured-on)"


def logged_machine(paths: str) -> str | None:
    """The machine the logs' runs were measured on (their ``{"machine": ...}`` lines; several
    logs' distinct ones joined), so rows made from a log never name the machine reading it."""
    found: dict[str, None] = {}
    for path in paths.split(","):
        for line in Path(path).read_text(encoding="utf-8").splitlines():
            if line.startswith('{"machine"'):
                found[json.loads(line)["machine"]] = None
    return " / ".join(found) or None


def replace_section(path: Path, marker: str, body: str) -> None:
    """Replace the text between <!-- marker:start --> and <!-- marker:end --> in ``path``."""
    text = path.read_text()
    start, end = f"<!-- {marker}:start -->", f"<!-- {marker}:end -->"
    pattern = re.compile(re.escape(start) + r".*?" + re.escape(end), re.S)
    if not pattern.search(text):
        raise SystemExit(f"{path} has no {start} ... {end} section")
    path.write_text(pattern.sub(lambda _: f"{start}\n{body.rstrip()}\n{end}", text))


Experiment = tuple[Callable[[], list[dict]], Callable[[list[dict]], str]]


def run_experiments(
    description: str | None,
    experiments: Mapping[str, Experiment],
    results: Path,
    doc: Path,
    marker_prefix: str,
) -> None:
    """The command line of a reproduction script: run the chosen experiments (or only
    re-render them with --render-only), save their rows in ``results`` and write each table
    between the ``<marker_prefix>-<name>`` markers of ``doc``."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--only", nargs="*", choices=sorted(experiments))
    parser.add_argument(
        "--render-only", action="store_true", help="redo the docs from the saved JSON"
    )
    args = parser.parse_args()
    for name in args.only or list(experiments):
        run, render = experiments[name]
        if not args.render_only:
            torch.manual_seed(0)
            start = time.perf_counter()
            rows = run()
            # Re-read: another experiment may have saved its rows meanwhile.
            saved = json.loads(results.read_text()) if results.exists() else {}
            saved[name] = {
                "machine": machine(),
                "seconds": time.perf_counter() - start,
                "rows": rows,
            }
            results.parent.mkdir(exist_ok=True)
            results.write_text(json.dumps(saved, indent=2) + "\n")
        saved = json.loads(results.read_text()) if results.exists() else {}
        if name not in saved:
            raise SystemExit(f"no saved results for {name}; run it without --render-only")
        entry = saved[name]
        text = render(entry["rows"])
        text += f"\n\nMeasured on: {entry['machine']}; {entry['seconds'] / 60:.1f} min."
        replace_section(doc, f"{marker_prefix}-{name}", text)
        print(text)


def peak_rss_gb() -> float:
    """This process's peak resident memory so far, in GB (Linux reports KiB)."""
    import resource

    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6, 2)


def qwen25_half_b_config(tok, layers: int, vocab_size: int):
    """Qwen2.5-0.5B's layer (width 896, 14 query and 2 key-value heads, feed-forward 4864,
    biased projections, a tied head) ``layers`` deep over ``vocab_size`` tokens, with the
    tokenizer ``tok``'s pad as its special tokens."""
    from transformers import Qwen2Config

    return Qwen2Config(
        vocab_size=vocab_size, hidden_size=896, num_hidden_layers=layers,
        num_attention_heads=14, num_key_value_heads=2, intermediate_size=4864,
        tie_word_embeddings=True, pad_token_id=tok.pad_id, bos_token_id=tok.pad_id,
        eos_token_id=tok.pad_id,
    )  # fmt: skip
