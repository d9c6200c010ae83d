"""Reading AddressSanitizer's report from a server log (lab_backends/server/sanitizer.py), and naming a server that
glibc found corrupted (lab_backends/lessons/native_faults.py), on logs captured from real checks here.

The two reports are the first lines of real ones: tritonserver 2.51 serving 09c's exercise built with
``-fsanitize=address`` (the audit's ``one_row_per_request`` and ``response_deleted_after_send`` answers). The
real servers' verdicts are held by the audit (tests/check_audit.py); here, only the reading, fast and exact.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from lab_backends.errors import ExerciseError
from lab_backends.lessons import native_faults
from lab_backends.server import sanitizer

DATA = Path(__file__).parent / "data" / "sanitizer"


def test_a_heap_overflow_is_read_with_the_access_the_block_and_the_learners_line() -> None:
    found = sanitizer.report((DATA / "heap_overflow.log").read_text(), "one_row_per_request.c")
    assert found == sanitizer.Report("heap-buffer-overflow", "WRITE of size 1280", "gather",
                                     "one_row_per_request.c:624", "0 bytes after a 256-byte block")
    assert "in gather() at one_row_per_request.c:624" in found.sentence()


def test_a_double_free_names_the_second_free_not_where_the_block_was_made() -> None:
    found = sanitizer.report((DATA / "double_free.log").read_text(), "response_deleted_after_send.c")
    assert found is not None and found.kind == "double-free" and found.access == ""
    assert (found.function, found.line) == ("scatter", "response_deleted_after_send.c:695")


def test_another_c_files_line_is_never_taken_for_the_learners() -> None:
    """No frame in the learner's file: the innermost frame in a header it includes (the handed-out helpers)."""
    found = sanitizer.report((DATA / "heap_overflow.log").read_text(), "tf_gather_scatter.c")
    assert found is not None and found.line.startswith("lab_backend_util.h:"), found


def test_no_report_no_verdict() -> None:
    assert sanitizer.report("I1204 model_lifecycle.cc:839] \"successfully loaded 'x'\"\n", "x.c") is None


@dataclass
class _Log:
    """A server as native_faults reads it: its log and its exit (None: still running)."""

    text: str
    code: int | None = None

    def log_text(self) -> str:
        return self.text

    def exit_code(self) -> int | None:
        return self.code


def test_a_server_stuck_after_glibc_found_its_heap_corrupted_is_named() -> None:
    stuck = _Log("I1204 loaded\nmalloc(): invalid size (unsorted)\nSignal (6) received.\n")
    said = native_faults.fault(stuck, "x.c", within_s=0.3)
    assert said is not None and "malloc(): invalid size (unsorted)" in said and "hangs" in said


def test_a_healthy_server_is_no_fault() -> None:
    assert native_faults.fault(_Log("I1204 successfully loaded 'tf_exercise'\n"), "x.c", within_s=0.3) is None


def test_a_failure_in_a_faulted_server_is_the_fault_and_a_deadline_in_a_healthy_one_is_no_answer() -> None:
    stuck = _Log("malloc(): invalid size (unsorted)\nSignal (6) received.\n")
    with pytest.raises(ExerciseError, match=r"glibc found the heap corrupted.*Look here"):
        with native_faults.named(stuck, "x.c", "Look here", within_s=0.3), native_faults_timeout():
            pass
    with pytest.raises(ExerciseError, match="no answer within .* Execute never returned"):
        with native_faults.named(_Log("fine\n"), "x.c", "Look here"):
            raise TimeoutError("1 of 1 requests got no answer")
    with pytest.raises(ValueError):  # anything else on a healthy server is the checker's to say
        with native_faults.named(_Log("fine\n"), "x.c", "Look here"):
            raise ValueError("a wrong value")


class native_faults_timeout:
    """A request that failed inside the block (a closed connection, as a crash looks to a client)."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        raise ConnectionResetError("Socket closed")
