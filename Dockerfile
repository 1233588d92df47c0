# The audit dashboard: Streamlit on port 8501, run as a non-root user.
#
#   docker build -t fl-audit .
#   docker run --rm -p 127.0.0.1:8501:8501 -v fl-audit-data:/data --shm-size=2g fl-audit
#
# Build needs network access (apt, PyPI, and the two LPIPS backbones from download.pytorch.org);
# the running container needs none.
FROM python:3.11-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    TORCH_HOME=/opt/torch \
    RAY_USAGE_STATS_ENABLED=0

# chromium: kaleido's chart export (finds it on PATH); dataset-fashion-mnist: the bundled
# Fashion-MNIST sample set in /usr/share/datasets/fashion-mnist; fonts for the PDF report;
# bible-kjv: the text-model audit's demo text (docs/TEXT.md).
RUN apt-get update \
    && apt-get install -y --no-install-recommends \
        bible-kjv \
        chromium \
        dataset-fashion-mnist \
        fonts-dejavu-core \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /app

# Dependencies first, so code changes do not reinstall them. torch 2.14.1 and torchvision
# come from PyPI here (the default Linux wheels, with their CUDA libraries).
COPY requirements.txt .
RUN pip install -r requirements.txt

# LPIPS backbones, fetched once at build time into $TORCH_HOME/hub/checkpoints
# (alexnet-owt-7be5be79.pth, vgg16-397923af.pth), where auditlib.metrics.lpips_metric looks
# through torch.hub.get_dir(); without them LPIPS is reported unavailable.
RUN python -c "import torchvision as tv; tv.models.alexnet(weights='IMAGENET1K_V1'); tv.models.vgg16(weights='IMAGENET1K_V1')" \
    && test -s /opt/torch/hub/checkpoints/alexnet-owt-7be5be79.pth \
    && test -s /opt/torch/hub/checkpoints/vgg16-397923af.pth \
    && chmod -R a+rX /opt/torch

# The code stays owned by root (read-only for the app); the app user writes only to its data
# volume (/data: the users file, the database; 0700), its home and /tmp.
RUN useradd --create-home --uid 10001 --shell /usr/sbin/nologin auditor \
    && chmod 0700 /home/auditor \
    && mkdir -p /data && chown auditor:auditor /data && chmod 0700 /data
COPY . .
USER auditor
ENV AUDIT_DATA_DIR=/data \
    ADDRESS=0.0.0.0 \
    PORT=8501
VOLUME ["/data"]

EXPOSE 8501
HEALTHCHECK --interval=30s --timeout=5s --start-period=30s \
    CMD python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8501/_stcore/health', timeout=4)"

# As `make run`: the first admin on the first start (its one-time password in
# /data/first-admin-password, never in the log: `docker exec CONTAINER cat` it, then choose
# your own at the first sign-in), the embedded Ray on 127.0.0.1 inside the container, Streamlit with
# .streamlit/config.toml. ADDRESS=0.0.0.0 so that `-p 8501:8501` reaches it: plain HTTP,
# so put TLS in front (a reverse proxy) before serving it beyond this machine.
CMD ["sh", "scripts/serve.sh"]
