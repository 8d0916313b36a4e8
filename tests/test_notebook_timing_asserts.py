"""Every notebook asserts wall-clock comparisons only under a device guard (issue 13, item 7).

It reads each notebook's and solution's .py with tools/timing_asserts.py (no execution) and fails
with the file:line of every assert that compares timings outside an `if <...>.device.type ...:`
guard. On the notebooks as they were before issue 13 it flags chapter 04's three and chapter 08's
tokens-per-second comparison.
"""

from __future__ import annotations

import pytest
import timing_asserts


@pytest.mark.parametrize("path", timing_asserts.notebook_sources(), ids=lambda p: p.name)
def test_no_timing_assert_without_a_device_guard(path):
    findings = timing_asserts.check_files([path])
    assert not findings, ("timing comparisons asserted without a device guard (print them everywhere, "
                          "assert them under `if run.device.type == \"cpu\":`):\n"
                          + "\n".join(str(f) for f in findings))
