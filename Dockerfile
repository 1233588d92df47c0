# The audit dashboard: Streamlit on port 8501, run as a non-root user.
#
#   docker build -t fl-audit .
#   docker run --rm -p 8501:8501 --shm-size=2g fl-audit
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
# Fashion-MNIST sample set in /usr/share/datasets/fashion-mnist; fonts for the PDF report.
RUN apt-get update \
    && apt-get install -y --no-install-recommends \
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

# The code stays owned by root (read-only for the app); the app user only writes to its
# home and to /tmp (uploads are written to temporary folders there during a run).
RUN useradd --create-home --uid 10001 --shell /usr/sbin/nologin auditor
COPY . .
USER auditor

EXPOSE 8501
HEALTHCHECK --interval=30s --timeout=5s --start-period=30s \
    CMD python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8501/_stcore/health', timeout=4)"

# --server.maxUploadSize 512: Streamlit's server refuses larger request bodies (default 200 MB)
# whatever a widget says; the weights uploader takes up to 500 MB (decimal, as the browser shows it). Per-widget limits in dashboard/uploads.py keep
# image files to 20 MB and zips to 256 MB. No file watcher in production.
CMD ["streamlit", "run", "app.py", \
     "--server.port", "8501", \
     "--server.address", "0.0.0.0", \
     "--server.headless", "true", \
     "--browser.gatherUsageStats", "false", \
     "--server.maxUploadSize", "512", \
     "--server.fileWatcherType", "none"]
