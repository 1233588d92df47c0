"""Method page: the threat model, the metrics (each from the one catalogue, with its
definition and direction), the verdict, and the attacks, defenses and models."""

import streamlit as st

from auditlib.attacks import ATTACKS
from auditlib.defenses import DEFENSES
from auditlib.metrics.catalogue import (
    METRIC_DEFINITION,
    RECONSTRUCTION_METRICS,
    RECOVERED,
    UTILITY_METRICS,
    MetricInfo,
)
from auditlib.models import ARCHITECTURES
from auditlib.models.zoo import torchvision_names
from dashboard.entry import through_app

through_app()  # a run that did not come through app.py goes through it (dashboard/entry.py)


def metric_table(metrics: tuple[MetricInfo, ...]) -> list[dict[str, str]]:
    return [
        {"metric": m.heading, "definition": m.definition, "direction": m.direction} for m in metrics
    ]


st.title("Method")

st.header("Threat model")
st.markdown(
    """
An **honest-but-curious server** runs federated learning as agreed, but tries to rebuild a
client's private images from what that client sends.

- **What the attack sees:** only the *observation* — the client's update after any defense
  (a FedSGD gradient, or a FedAvg weight change or new weights) — and the server's
  *knowledge*: the model architecture and parameters it sent, the client protocol (local
  steps, learning rate), the input normalisation and the batch size; the labels only when
  the scenario says the client shares them.
- **What the attack never sees:** the private images and labels. Only the scoring step
  compares the reconstruction with them.
- **Two selections are kept apart.** The headline numbers are for the reconstruction the
  attacker would pick without ground truth (the restart with the lowest attack loss). The
  *oracle* best restart is chosen with the private images; it is reported separately and
  labelled "uses ground truth", because no real attacker can make that choice.

A **malicious server** (the threat model chosen in the lab's sidebar; the SoK's active
server, F-H) also changes the model it sends, so that the client's update holds the client's
images: an imprint block of brightness bins (rtf), trap weights (cah), or per-client kernels
that keep clients apart in a sum (loki). Its attacks read the images back in one pass. Each
run's threat card says what the server changed and whether the client could have noticed;
the client's **model check** (the defense `model-check`) inspects the model before training
and refuses one built to leak.

Under **secure aggregation** the server sees only the example-weighted sum of several
clients' updates, the private images split over them; an honest server's attacks face the
sum, and loki attributes the images it recovers to the client that held them.
"""
)

st.header("Metrics")
st.markdown(
    "**Of the attack**: how close the attacker's reconstruction is to the private images "
    "(the direction says which way is more leakage)."
)
st.table(metric_table((*RECONSTRUCTION_METRICS, RECOVERED)))
st.markdown("**Of the defense**: what it costs the model, and the privacy it states.")
st.table(metric_table(UTILITY_METRICS))
st.write("Every run is scored the same way, and result.json records this definition:")
st.info(METRIC_DEFINITION)
st.markdown(
    "Where a metric cannot be computed (for example LPIPS without its backbone weights on "
    "this machine, or SSIM on images smaller than its window), it is shown as unavailable "
    "with the reason, never estimated."
)

st.header("Verdict")
st.markdown(
    """
A run's verdict is a bound, never one run read alone:

- **Leaks** (Very High, High or Medium, FedLeak's bands): the attack recovered images beyond
  the best guess that uses no update (mid-grey, the data's mean image and mean colour,
  scored like a reconstruction).
- **Labels leak** (Labels): no image came back, but the private labels the attacker did
  not know did, beyond chance (k of B correct against the same guesses on the labels
  relabelled at random, the attacker's best guess without the update, at 0.01), or one
  image's label read by iDLG's rule where it is exact by construction. The class of a
  private record is a disclosure; beside it, the verdict says what is known of the images.
- **Defense held against these attacks** (Low): under the defense every image stayed below
  the best guess by a stated margin (1 dB in PSNR; 0.05 in SSIM, or SSIM at most 0.05: no
  structure at all), the attacker that knows
  the defense ran, and the same attack at the same budget broke the undefended update (the
  *control*, started with every defended run: at least half of its images recovered). It
  says nothing about stronger attacks.
- **Inconclusive**: nothing follows: the run was cut short by its time budget (a twin
  skipped for want of budget included) or cancelled, every attack diverged, it had no
  defense, its control did not leak, the reconstruction sits between the guess and the
  recovered line, or the defense held against the plain attack only.

Every verdict names its scope: the attacks tried, their restarts and budget, the guesses,
the control and the threat model (in the SoK's terms: Carletti et al., USENIX Security
2025).
"""
)

st.header("Attacks")
st.table(
    [
        {
            "attack": info.name,
            "summary": info.summary,
            "presets": ", ".join(info.presets) or "none",
            "audit iterations": f"{info.audit.iterations:,}" if info.audit else "n/a",
            "paper iterations": f"{info.paper_iterations:,}" if info.paper_iterations else "n/a",
        }
        for info in sorted(ATTACKS.values(), key=lambda i: i.name)
    ]
)

st.header("Defenses")
st.table(
    [
        {"defense": info.name, "summary": info.summary}
        for info in sorted(DEFENSES.values(), key=lambda i: (i.name != "none", i.name))
    ]
)

st.header("Models")
st.table(
    [
        {"architecture": info.name, "description": info.description}
        for info in sorted(ARCHITECTURES.values(), key=lambda i: i.name)
    ]
)
st.caption(
    f"Besides these built-ins, any of torchvision's {len(torchvision_names())} classification "
    "models can be audited as `torchvision:NAME` (chosen on the Setup page; "
    "`python -m auditlib models` lists them)."
)
