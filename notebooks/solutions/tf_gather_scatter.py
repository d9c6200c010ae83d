"""Reference solution of notebook 09c's exercise: lab_tensorflow's own gather() and scatter(), the
backend's file c_backends/frameworks/lab_tensorflow/lab_tensorflow_batch.c (one source: the backend
serves digits_tf_native with it, and the checker builds an answer with the rest of the backend)."""

from lab_backends.server.native_backends import tensorflow_batch_source

answer = tensorflow_batch_source()
