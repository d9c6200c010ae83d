# The shared Triton's image: the workbench's derived NGC image (docker/triton.Dockerfile, FROM
# nvcr.io/nvidia/tritonserver:24.10-py3) plus the model repositories as one more layer.
# Build from the repository root, after `lab-backends build-models` filled the model folders:
#   docker compose build triton          # lab-backends-triton:24.10-py3
#   docker compose run --rm --no-deps lab lab-backends build-models
#   docker build -f deploy/images/triton-models.Dockerfile \
#     -t registry.example.org/lab-backends-triton-models:24.10-py3 . && docker push ...
ARG BASE_IMAGE=lab-backends-triton:24.10-py3
FROM ${BASE_IMAGE}
COPY model_repository /models/model_repository
COPY model_repository_gpu /models/model_repository_gpu
