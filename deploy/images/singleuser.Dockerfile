# The learners' single-user image for Zero-to-JupyterHub: the project's lab image
# (docker/lab.Dockerfile, from environment.yml) with the project copied in instead of mounted,
# its embedded CPU Triton prepared (lessons that a shared server cannot serve fall back to it),
# and jupyterhub-singleuser, which the hub starts. Pin jupyterhub to the chart's hub version.
#   docker build -f docker/lab.Dockerfile -t lab-backends-lab:0.1.0 .
#   docker build -f deploy/images/singleuser.Dockerfile \
#     -t registry.example.org/lab-backends-singleuser:0.1.0 . && docker push ...
ARG LAB_IMAGE=lab-backends-lab:0.1.0
FROM ${LAB_IMAGE}
USER root
RUN micromamba run -n base python -m pip install --no-cache-dir "jupyterhub==5.3.*"
COPY . /workbench
RUN micromamba run -n base lab-backends setup \
 && chown -R 1000:100 /workbench
ENV PYTHONPATH=/workbench
USER 1000
WORKDIR /workbench/notebooks
