# labfleet/singleuser:test: the deps image plus labfleet itself (the in-session parts, labfleet.session),
# installed from a wheel of the working tree. Built by scripts/build-image.sh.
ARG DEPS
FROM ${DEPS}

ARG SOURCE_HASH=unknown
COPY wheels/ /tmp/wheels/
RUN /opt/venv/bin/pip install -q --no-deps --no-index --progress-bar off /tmp/wheels/*.whl \
    && rm -rf /tmp/wheels

LABEL ai.labfleet.display-name="Python 3 + JupyterLab (test)" \
      ai.labfleet.min.cpu="0.5" \
      ai.labfleet.min.mem="256m" \
      ai.labfleet.accelerators="cuda" \
      ai.labfleet.service-ports="jupyter:http:8888" \
      ai.labfleet.source-hash="${SOURCE_HASH}"

USER 1000:1000
ENV HOME=/home/jovyan SHELL=/bin/bash
WORKDIR /home/jovyan
EXPOSE 8888
CMD ["jupyterhub-singleuser"]
