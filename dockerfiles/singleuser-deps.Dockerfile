# labfleet/singleuser-deps:<hash>: Python, a venv at /opt/venv with JupyterHub (the Hub's version),
# JupyterLab, jupyter-server-proxy and labfleet's runtime dependencies, and the session user.
# Built by scripts/build-image.sh (context: a temp dir with requirements.txt and ca-certificates.crt).
ARG BASE=labfleet/debian-base:bookworm
FROM ${BASE}

ENV LANG=C.UTF-8 \
    PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1

# The build machine's CA bundle: pip reaches the package index only through it (no buildx, so no
# --secret). Used by this build step only; the image keeps Debian's own bundle for the sessions.
COPY ca-certificates.crt /tmp/build-ca.crt
COPY requirements.txt /tmp/requirements.txt
RUN python3 -m venv /opt/venv \
    && PIP_CERT=/tmp/build-ca.crt PIP_DEFAULT_TIMEOUT=180 /opt/venv/bin/pip install -q --progress-bar off \
        -r /tmp/requirements.txt \
    && rm -f /tmp/build-ca.crt /tmp/requirements.txt \
    && /opt/venv/bin/jupyterhub-singleuser --version

# The session user: unprivileged, uid 1000 (minbase has no useradd).
RUN echo 'jovyan:x:1000:1000:jovyan:/home/jovyan:/bin/bash' >>/etc/passwd \
    && echo 'jovyan:x:1000:' >>/etc/group \
    && echo 'jovyan:!:19000:0:99999:7:::' >>/etc/shadow \
    && mkdir -p /home/jovyan \
    && chown 1000:1000 /home/jovyan \
    && chmod 0755 /home/jovyan
