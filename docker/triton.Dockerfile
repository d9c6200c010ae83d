# The NGC Triton plus what this workbench's models need. Built by `docker compose build triton`
# (context: the repository root, see .dockerignore) or by lab_backends.server.docker on first use.
# The tag below must equal NGC_TRITON_IMAGE in lab_backends/server/docker.py and the one in
# docker-compose.yml (tests/test_compose.py checks it); compose passes it as a build argument.
ARG TRITON_IMAGE=nvcr.io/nvidia/tritonserver:24.10-py3
FROM ${TRITON_IMAGE}
ARG TRITON_IMAGE

# Model code runs in the image's system Python: give it numpy<2, torch, onnxruntime-gpu, tensorflow-cpu,
# scikit-learn.
COPY docker/triton-requirements.txt /tmp/triton-requirements.txt
RUN python3 -m pip install --no-cache-dir -r /tmp/triton-requirements.txt \
 && python3 -c "import numpy; assert int(numpy.__version__.split('.')[0]) < 2, numpy.__version__"

# C backends, compiled against this image's own libtritonserver.so and glibc.
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev \
 && rm -rf /var/lib/apt/lists/*
# Python-based backends (backends/<name>/model.py, e.g. sklearn) sit beside the native ones.
COPY backends/ /opt/tritonserver/backends/
COPY c_backends /tmp/c_backends
COPY docker/build_c_backends.sh /tmp/build_c_backends.sh
RUN bash /tmp/build_c_backends.sh /tmp/c_backends /opt/tritonserver/backends /opt/tritonserver/lib/libtritonserver.so

LABEL org.lab-backends.base-image=${TRITON_IMAGE}
