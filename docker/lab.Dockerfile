# The JupyterLab side of docker-compose.yml, built from the project's environment.yml (conda).
# Notebooks reach the `triton` service through TRITON_URL / TRITON_GRPC_URL (the `remote` target).
FROM mambaorg/micromamba:1.5.10
USER root
ARG ENV_FILE=environment.yml
COPY ${ENV_FILE} /tmp/environment.yml
RUN micromamba install -y -n base -f /tmp/environment.yml \
 && micromamba clean -a -y
# The project itself is mounted at /workbench (docker-compose.yml); importable without an install.
ENV PYTHONPATH=/workbench
# `lab-backends ...` (e.g. build-models) without installing the mounted project.
RUN printf '#!/bin/sh\nexec python -m lab_backends.cli "$@"\n' > /usr/local/bin/lab-backends \
 && chmod +x /usr/local/bin/lab-backends
WORKDIR /workbench
EXPOSE 8888
CMD ["jupyter", "lab", "--ip=0.0.0.0", "--port=8888", "--no-browser", "--allow-root", \
     "--ServerApp.root_dir=/workbench/notebooks"]
