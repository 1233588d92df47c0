"""A leaking verdict's sentence says how many of the client's images as its count does: the
level's band says how well (FedLeak's PSNR bands), never a share the count contradicts (issue
53: "4 of 4 images recovered" beside "a small portion of the client's images")."""

from __future__ import annotations

import pytest

from auditlib.metrics.verdict import judge
from tests.test_verdict import SCOPE, finding


@pytest.mark.parametrize(
    ("recovered", "batch", "level", "share"),
    [
        (4, 4, "Medium", "all 4 of the client's images can be reconstructed in part"),
        (1, 4, "Medium", "1 of the client's 4 images can be reconstructed in part"),
        (2, 4, "High", "2 of the client's 4 images can be reconstructed recognisably in the main"),
        (1, 1, "Very High", "the client's image can be reconstructed recognisably"),
    ],
)
def test_the_level_sentence_agrees_with_the_count(recovered, batch, level, share):
    verdict = judge(finding(recovered, batch=batch, level=level), SCOPE, defended=False)
    assert verdict.level == level
    plural = "s" if batch != 1 else ""
    assert f"{recovered} of {batch} image{plural} recovered beyond the best guess" in (
        verdict.sentence
    )
    assert share in verdict.sentence
    for contradiction in ("a small portion", "nearly all of", "most of the client's"):
        assert contradiction not in verdict.sentence
