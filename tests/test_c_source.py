"""lab_backends.lessons.c_source: whole functions with their line numbers, from C and from model.py."""

from __future__ import annotations

import pytest

from lab_backends.errors import LabBackendsError
from lab_backends.lessons import c_source
from lab_backends.paths import PROJECT_ROOT

SCALE = PROJECT_ROOT / "c_backends" / "scale" / "scale.c"


def test_every_entry_point_of_scale_c_is_found_whole() -> None:
    lines = SCALE.read_text().splitlines()
    names = [f.name for f in c_source.c_functions(SCALE.read_text())]
    for entry in ("TRITONBACKEND_Initialize", "TRITONBACKEND_ModelInitialize", "TRITONBACKEND_ModelFinalize",
                  "TRITONBACKEND_ModelInstanceInitialize", "TRITONBACKEND_ModelInstanceExecute"):
        assert names.count(entry) == 1, names
        f = c_source.function(SCALE, entry)
        assert entry + "(" in lines[f.first - 1] or entry + "(" in lines[f.first]  # signature at the top
        assert lines[f.last - 1] == "}"  # ends at its closing brace, nothing after it
        assert f.text == "\n".join(lines[f.first - 1:f.last])


def test_show_prints_numbered_lines(capsys) -> None:
    f = c_source.show(SCALE, "TRITONBACKEND_ModelFinalize")
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"scale.c:{f.first}-{f.last}"
    assert out[1].split()[0] == str(f.first) and len(out) == f.last - f.first + 2


def test_python_methods_and_missing_names() -> None:
    model = PROJECT_ROOT / "backends" / "sklearn" / "model.py"
    execute = c_source.function(model, "TritonPythonModel.execute")
    assert execute.text.lstrip().startswith("def execute(self, requests)")
    with pytest.raises(LabBackendsError, match="defines no function 'nope'.*TRITONBACKEND_ModelInstanceExecute"):
        c_source.function(SCALE, "nope")
    with pytest.raises(LabBackendsError, match="does not exist"):
        c_source.function(SCALE.with_name("missing.c"), "f")


def test_comments_and_strings_do_not_count() -> None:
    source = 'static const char* s = "f(void) { }";\n/* g(void) { } */\nint h(void) {\n  return 1;\n}\n'
    # Only h is defined; the comment right above a definition is shown with it.
    assert [(f.name, f.first, f.last) for f in c_source.c_functions(source)] == [("h", 2, 5)]
