"""A text model's audit end to end: data and model inputs checked, the verdict's rules, the
CLI's result files."""

from __future__ import annotations

import json

import pytest

from auditlib.attacks.text import TEXT_ATTACKS
from auditlib.attacks.text_names import TEXT_ATTACK_NAMES
from auditlib.cli import main
from auditlib.data.text_samples import parse_text_file
from auditlib.engine.text_audit import TextAuditSpec, run_text_audit
from auditlib.errors import AuditInputError
from auditlib.metrics.text import score_text
from auditlib.metrics.text_baseline import guess_bar, text_guesses
from auditlib.metrics.text_risk import text_risk
from auditlib.models.text import build_text_model, load_text_model

TINY = dict(model="gpt2-tiny", batch_size=3, length=12)


def test_the_cli_names_every_registered_text_attack():
    assert set(TEXT_ATTACKS) <= set(TEXT_ATTACK_NAMES)


def test_a_text_file_and_a_csv_are_read_and_bad_ones_refused():
    rows = parse_text_file("a.txt", b"first line\n\n  second   line \n")
    assert rows.texts == ("first line", "second line") and rows.labels is None
    rows = parse_text_file("a.csv", b"text,label\nhello there,1\nbye,0\n")
    assert rows.labels == (1, 0)
    with pytest.raises(AuditInputError, match="UTF-8"):
        parse_text_file("a.txt", b"\xff\xfe\x00bad")
    with pytest.raises(AuditInputError, match="'text' column"):
        parse_text_file("a.csv", b"sentence\nhello\n")
    with pytest.raises(AuditInputError, match="integer"):
        parse_text_file("a.csv", b"text,label\nhello,yes\n")
    with pytest.raises(AuditInputError, match=r"\.txt"):
        parse_text_file("a.pkl", b"anything")


def test_an_own_model_folder_is_read_from_safetensors_without_code(tmp_path):
    built = build_text_model("gpt2-tiny", seed=3)
    built.backbone.save_pretrained(tmp_path, safe_serialization=True)
    built.tokenizer.tokenizer.save(str(tmp_path / "tokenizer.json"))
    loaded = load_text_model(tmp_path)
    a = built.backbone.transformer.wte.weight
    assert loaded.family == "decoder" and (loaded.backbone.transformer.wte.weight == a).all()
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "model_type": "mistral"}))
    with pytest.raises(AuditInputError, match="model_type"):
        load_text_model(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "model.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(AuditInputError, match="safetensors"):
        load_text_model(tmp_path)


def test_the_guess_from_public_text_is_a_bar_a_recovery_must_clear():
    model = build_text_model("gpt2-tiny")
    tok = model.tokenizer
    private = ("And he said unto them, Go ye into all the world.",)
    guesses = text_guesses(
        ("And he said unto them.", "And the LORD said unto Moses.") * 20, tok, 12
    )
    bar = guess_bar(private, guesses)
    assert bar.rouge1[0] > 0.2  # common words score against any sentence
    own = [tok.encode(private[0])]
    echo = score_text(private, own, [guesses[2].text], [tok.encode(guesses[2].text)])
    assert not text_risk(echo, bar).recovered[0]  # the guess itself is not a recovery
    exact = score_text(private, own, private, own)
    risk = text_risk(exact, bar)
    assert risk.recovered == (True,) and risk.level == "Very High"


def test_an_undefended_leak_is_a_finding_and_a_failed_attack_is_not_safety():
    result = run_text_audit(TextAuditSpec(**TINY))
    assert result.verdict.outcome == "leaks" and result.verdict.level == "Very High"
    assert result.runs[0].scores.exact == 3
    # LoRA adapters at their first round: DAGER's span is gone and nothing comes back;
    # with no defense that is no evidence of safety.
    lora = run_text_audit(TextAuditSpec(**TINY, lora_rank=4))
    assert lora.verdict.outcome in ("inconclusive", "leaks")
    if lora.verdict.outcome == "inconclusive":
        assert "no evidence of safety" in lora.verdict.sentence


def test_noise_gets_its_control_and_the_attacker_that_knows_it():
    result = run_text_audit(
        TextAuditSpec(**TINY, defense="dp-gaussian", defense_params={"sigma": "1", "clip": "1"})
    )
    attacks = [r.attack for r in result.runs]
    assert attacks == ["dager", "dager (knows the defense)"]
    assert result.controls[0].scores.exact == 3  # the undefended update broke
    assert result.verdict.adaptive == "ran"
    assert result.privacy["epsilon"] > 0
    assert result.verdict.outcome in ("defense_held", "inconclusive")


def test_image_only_options_and_defenses_are_refused_for_text(tmp_path):
    assert (
        main(
            [
                "audit",
                "--text-model",
                "gpt2-tiny",
                "--samples",
                "digits",
                "--out",
                str(tmp_path / "o"),
            ]
        )
        == 2
    )
    with pytest.raises(AuditInputError, match="act on the update alone"):
        run_text_audit(TextAuditSpec(**TINY, defense="soteria"))


def test_the_cli_writes_the_result_and_the_texts_side_by_side(tmp_path, capsys):
    out = tmp_path / "out"
    code = main([
        "audit", "--text-model", "gpt2-tiny", "--batch-size", "2", "--tokens", "10",
        "--attack", "dager", "--out", str(out),
    ])  # fmt: skip
    assert code == 0
    saved = json.loads((out / "result.json").read_text())
    assert saved["modality"] == "text" and saved["verdict"]["outcome"] == "leaks"
    first = saved["runs"][0]["sequences"][0]
    assert first["recovered"] == first["private"]
    assert "private     0:" in (out / "recovered.txt").read_text()
    assert "verdict: Very High" in capsys.readouterr().out
