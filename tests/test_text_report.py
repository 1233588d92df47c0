"""The PDF of a text audit: the verdict, the scores beside the guess from public text, the
private and recovered sequences side by side, and a masked form to share. A real audit
(gpt2-tiny, 2 sequences of 10 tokens, DAGER) is rendered and read back with pdftotext."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest

from auditlib.cli import main
from auditlib.engine.text_audit import TextAuditSpec, run_text_audit
from auditlib.errors import AuditInputError
from auditlib.report.text_pdf import build_text_report, mask_text
from auditlib.text_result_json import text_result_dict
from auditlib.text_result_read import load_text_result, read_text_result

pytestmark = pytest.mark.skipif(shutil.which("pdftotext") is None, reason="needs poppler-utils")

TINY = TextAuditSpec(model="gpt2-tiny", batch_size=2, length=10, attacks=("dager",))


@pytest.fixture(scope="module")
def result_file(tmp_path_factory):
    data = tmp_path_factory.mktemp("text_data")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("AUDIT_DATA_DIR", str(data))
        result = run_text_audit(TINY)
    path = data / "result.json"
    path.write_text(json.dumps(text_result_dict(result)))
    return path


def _text(pdf) -> str:
    """The PDF's words in the order they were drawn, one space between them."""
    out = subprocess.run(["pdftotext", "-raw", str(pdf), "-"], capture_output=True, check=True)
    return " ".join(out.stdout.decode("utf-8").split())


def test_the_report_shows_the_verdict_scores_guess_and_the_sequences_side_by_side(
    result_file, tmp_path
):
    result = load_text_result(result_file)
    private = result.private_texts
    assert len(private) == 2 and result.runs[0].exact == 2  # DAGER is exact on gpt2-tiny
    info = build_text_report(result, tmp_path / "audit.pdf")
    text = _text(info.path)
    assert info.pages >= 1 and not info.masked
    assert result.verdict.headline in text
    assert "guess from public text" in text
    assert "no defense to know" in text  # whether the attacker that knows the defense ran
    assert "none: no defense" in text  # no epsilon without a defense
    for sentence in private:  # unmasked: each private sequence, and its exact recovery
        assert text.count(sentence) >= 2
    assert "its assumptions held" in text and "first-layer span" in text  # DAGER's notes


def test_masked_the_private_and_recovered_text_are_gone_and_only_word_lengths_stay(
    result_file, tmp_path
):
    result = load_text_result(result_file)
    info = build_text_report(result, tmp_path / "shared.pdf", mask_private=True)
    text = _text(info.path)
    public = " ".join(g.text for g in result.guesses).lower()
    for sentence in result.private_texts:
        assert sentence not in text
        private_words = [
            w for w in re.findall(r"[A-Za-z]{5,}", sentence) if w.lower() not in public
        ]
        assert private_words and not [w for w in private_words if w in text]
        assert mask_text(sentence) in text  # its shape: dots of each word's length
    assert result.verdict.headline in text  # the findings stay


def test_the_mask_keeps_only_the_length_of_each_word():
    assert mask_text("What then? Israel") == "•••• ••••• ••••••"


def test_the_cli_writes_the_pdf_from_result_json_and_refuses_other_files(
    result_file, tmp_path, capsys
):
    out = tmp_path / "cli.pdf"
    args = ["report", "--text-result", str(result_file), "--out", str(out), "--mask-private"]
    assert main(args) == 0
    assert "masked" in capsys.readouterr().out
    assert load_text_result(result_file).private_texts[0] not in _text(out)
    image = tmp_path / "image.json"
    image.write_text(json.dumps({"schema": 2, "verdict": {}}))
    assert main(["report", "--text-result", str(image), "--out", str(out)]) == 2
    assert "not a text audit" in capsys.readouterr().err
    with pytest.raises(AuditInputError, match=r"version 99"):
        read_text_result({"modality": "text", "version": 99})
