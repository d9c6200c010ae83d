"""Audit cases of ``kserve_json_body`` (notebook 01): a hand-written KServe v2 JSON body."""

from lab_backends.lessons.exercises.audit import Wrong


def _body(x, **input_fields):
    tensor = {"name": "INPUT0", "shape": list(x.shape), "datatype": "FP32", "data": x.flatten().tolist()}
    tensor.update(input_fields)
    return {"inputs": [tensor]}


WRONG = [
    Wrong("the shape leaves out the batch dimension",
          lambda x: _body(x, shape=[x.shape[1]]), r"HTTP 400.*unexpected shape"),
    Wrong("returns the JSON text instead of the dict",
          lambda x: '{"inputs": []}', r"must return a dict"),
    Wrong("puts the numpy array itself in 'data'",
          lambda x: _body(x, data=x), r"not JSON-serialisable"),
    Wrong("asks for the output in binary",
          lambda x: {**_body(x), "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}]},
          r"came back binary"),
    Wrong("says FP64 for float32 data",
          lambda x: _body(x, datatype="FP64"), r"HTTP 400.*(?i:datatype|FP64)"),
]

ALTERNATIVES = [
    # Nested rows instead of a flat list (the protocol allows both) and no "outputs": every output, as JSON.
    lambda x: {"inputs": [{"name": "INPUT0", "shape": [len(x), 16], "datatype": "FP32", "data": x.tolist()}]},
]
